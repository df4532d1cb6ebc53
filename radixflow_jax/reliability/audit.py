"""Whole-engine invariant audit (docs/design.md, "Radix cache with recurrent checkpoints"), run between rounds by the reliability tests
and the soak. O(pools + tree + requests): for small pools, not for production.

:func:`audit_engine` checks, beyond the cache's own ``check_invariants`` (tree, producer index,
pools free xor owned, no negative refcount):
  * exact ownership: every page's refcount equals the tree's references plus the running requests
    that allocated it; every slot's equals the tree's plus the running request that runs in it
    or holds it as its spare (speculative decoding);
  * every lock on a node belongs to a running request's hit, a waiting request's restore
    (``Request.restore_node``, registered in ``Allocator.holds``, which a flush drops) or a test's
    pin, and every such hit and restore is locked;
  * a waiting or finished request holds no page, slot or lock (but its restore's), and has no
    pending checkpoint;
    only running requests are producers (overlap: a finished request waiting for the commit fence
    of a round in flight still holds what it held, until that fence);
  * every pending restore from the host tier (``cache/tiers.py``) is queued for the next plan or
    carried by a launched round, so its commit (or void) is to come; the host tier's slots and
    pages are owned by the tree alone (refcount 1 each, and nothing else in use);
:func:`assert_drained` checks that, with no work left, a flush frees every page, slot and host slot.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from radixflow_jax.cache import InvariantError
from radixflow_jax.cache.invariants import host_page_references, host_references, tree_references
from radixflow_jax.cache.tree import Node, iter_nodes
from radixflow_jax.engine.core import EngineCore


def audit_engine(core: EngineCore, pinned: Iterable[Node] = ()) -> None:
    """Raises :class:`InvariantError` on the first violation (see the module docstring). ``pinned``:
    nodes someone other than a request locked once each (a test pinning checkpoints)."""
    sched = core.scheduler
    mem = sched.memory
    if mem.cache is None:  # otherwise the tree check runs the pools' own checks
        mem.pages.check_invariants()
        if mem.slots is not None:
            mem.slots.check_invariants()
    page_refs: Counter[int] = Counter()
    slot_refs: Counter[int] = Counter()
    locks: Counter[int] = Counter()
    if mem.cache is not None:
        mem.cache.check_invariants()
        page_refs, slot_refs = tree_references(mem.cache.root)
        for node in iter_nodes(mem.cache.root):
            if node.own_locks:
                locks[id(node)] = node.own_locks
        for node in pinned:
            locks[id(node)] -= 1
    running = {req.request_id for req in sched.running}
    fenced = {req.request_id for req in sched.fenced}  # finished, released at a commit fence (overlap)
    for req in (*sched.running, *sched.fenced):
        page_refs.update(req.own_pages)
        if req.slot is not None:
            slot_refs[req.slot] += 1
        if req.spare_slot is not None:  # speculative decoding: a verify row's output slot
            slot_refs[req.spare_slot] += 1
        if req.hit_node is not None:
            if not req.hit_node.attached:
                raise InvariantError(f"request {req.request_id} holds a hit on a node that left the tree")
            locks[id(req.hit_node)] -= 1
        if not 0 <= req.num_computed <= req.num_tokens:
            raise InvariantError(f"request {req.request_id} computed {req.num_computed} of {req.num_tokens} tokens")
        if req.restore_node is not None:
            raise InvariantError(f"request {req.request_id} runs but still holds a restore")
    for req in sched.waiting:
        if req.pages or req.own_pages or req.slot is not None or req.spare_slot is not None or req.hit_node is not None:
            raise InvariantError(f"waiting request {req.request_id} holds pages, a slot or a lock")
        if req.restore_node is not None:  # the node it had restored, locked until it is seated
            if not req.restore_node.attached:
                raise InvariantError(f"waiting request {req.request_id} holds a restore on a node that left the tree")
            locks[id(req.restore_node)] -= 1
    holders = {r.request_id for r in sched.waiting if r.restore_node is not None}
    if set(mem.holds) != holders:
        raise InvariantError(f"restore holds {sorted(mem.holds)} are not the waiting holders {sorted(holders)}")
    if +locks or -locks:
        raise InvariantError(f"node locks do not match the running requests' hits: {dict(locks)}")
    pools = [(mem.pages, page_refs, "page")] + ([(mem.slots, slot_refs, "slot")] if mem.slots is not None else [])
    for pool, refs, what in pools:  # the pool checks passed, so every id is free xor owned
        for i, owners in refs.items():
            if pool.refcount(i) != owners:
                raise InvariantError(f"{what} {i}: refcount {pool.refcount(i)} != {owners} owners (tree + running)")
        if len(refs) != pool.num_used:
            raise InvariantError(f"{pool.num_used} {what}s are owned but only {len(refs)} have an owner")
    if mem.cache is not None:
        _audit_host(mem.cache)
        pending = set(mem.cache.pending_producers())
        stray = {p for p in pending if p >= 0} - running - fenced
        if stray:
            raise InvariantError(f"requests {sorted(stray)} are not running but have pending checkpoints")
        lost = {p for p in pending if p < 0} - set(mem.cache.queued_restores) - set(sched.restores_in_flight)
        if lost:
            raise InvariantError(f"restores {sorted(lost)} are pending but neither queued nor in a launched round")


def _audit_host(cache) -> None:
    """Exact ownership of the host tier: the tree is the only owner of its slots and pages."""
    for pool, refs, what in ((cache.host_pool, host_references(cache.root), "host slot"),
                             (cache.host_page_pool, host_page_references(cache.root), "host page")):  # fmt: skip
        if pool is None:
            continue
        if any(pool.refcount(i) != n for i, n in refs.items()) or len(refs) != pool.num_used:
            raise InvariantError(f"{pool.num_used} {what}s are in use, but the tree names {len(refs)} of them")


def assert_drained(core: EngineCore) -> None:
    """With no work left, a flush frees every page and slot, device and host (nothing leaked)."""
    sched = core.scheduler
    if sched.has_work():
        raise InvariantError(f"{len(sched.waiting)} waiting and {len(sched.running)} running requests left")
    sched.memory.flush()
    used = sched.memory.pages.num_used, sched.memory.slots.num_used if sched.memory.slots is not None else 0
    cache = sched.memory.cache
    host = cache.host_pool if cache is not None else None
    host_pages = cache.host_page_pool if cache is not None else None
    held = (host.num_used if host else 0), (host_pages.num_used if host_pages else 0)
    if any(used) or any(held):
        raise InvariantError(
            f"{used[0]} pages, {used[1]} slots, {held[0]} host slots and {held[1]} host pages leaked after a flush"
        )


def committed_slots(core: EngineCore) -> set[int]:
    """The state slots of the tree's committed checkpoints (the only ones a round may read)."""
    cache = core.scheduler.memory.cache
    if cache is None:
        return set()
    return {n.checkpoint.slot for n in iter_nodes(cache.root) if n.checkpoint is not None and n.checkpoint.committed}
