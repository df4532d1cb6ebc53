"""Eviction and the host tier: where a checkpoint goes when the device slot pool needs its slot.

Two tiers hold checkpoints (docs/design.md, "The host tier"): the device slot pool (``SlotPool``)
and, below it, the host tier (:class:`HostPool`, host memory sized in checkpoints). Under slot
pressure :meth:`TieredStore.evict_states` *demotes* a committed checkpoint: it takes a host slot
(dropping the least valuable unlocked host checkpoint when the host pool is full), queues a
*spill* ``(device slot, host slot)`` and gives the device slot back. A host checkpoint
(``on_host``) comes back in one of two ways:

* :meth:`TieredStore.read_host`: its row is copied straight into the slot of the request that
  runs from it in the plan being built (a ``restore`` move to that slot); the host copy stays and
  the node gets no device checkpoint;
* :meth:`TieredStore.restore`: it becomes *pending* again under a fresh restore id (negative, so it
  never names a request) in a device slot the caller allocated, with a ``restore`` move queued;
  requests wait as consumers of that pending checkpoint, like consumers of a producer's; the
  restore's ``commit`` (the round that carried the copy has finished) makes it readable and frees
  its host slot, its ``unpublish`` (that round was void) returns it to the host tier.

Invariants (``invariants.check_tree`` checks the first two):
  * a host checkpoint holds a host slot and no device slot; a restoring one holds both; the tree
    holds exactly one reference on each host slot it names;
  * a restoring checkpoint's producer is a restore id, pending on exactly that node;
  * host checkpoints lie on committed KV, like committed ones (only a committed one is demoted),
    and a locked node keeps its host checkpoint (a request that read it holds the node);
  * every copy is queued in ``_moves`` in booking order and the executor makes them in that order
    before the step of the plan that takes them (``RoundPlan.state_moves``): a device slot freed by
    a demotion is written by nobody before its spill has read it, and a host row is read only
    after the spill that wrote it.
"""

from __future__ import annotations

import heapq
import itertools

from radixflow_jax.cache.eviction import EvictionPolicy, kv_evictable, state_evictable
from radixflow_jax.cache.hostkv import HostKVStore
from radixflow_jax.cache.pools import HostPool
from radixflow_jax.cache.results import StateMove
from radixflow_jax.cache.tree import CheckpointStatus, Node, iter_nodes, iter_postorder

__all__ = ["TieredStore"]


class TieredStore(HostKVStore):
    """Eviction over both tiers (see the module docstring). ``host_pool=None``: no host tier for
    checkpoints, an evicted checkpoint is dropped; ``host_page_pool`` (``cache/hostkv.py``): the
    tier's KV pages, None: evicted pages are dropped with their node."""

    def __init__(self, *args, host_pool: HostPool | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._host = host_pool if host_pool is not None and host_pool.capacity > 0 else None
        self._restore_queue: list[int] = []  # restore ids whose copy is queued in _moves
        self._restore_ids = itertools.count(-1, -1)
        self.demoted = 0  # checkpoints demoted to the host tier
        self.restored = 0  # checkpoints copied back: restores committed and host reads
        self.host_dropped = 0  # host checkpoints dropped for room (or with their node)

    @property
    def host_pool(self) -> HostPool | None:
        return self._host

    def _host_tier(self) -> HostPool | None:
        return self._host

    # ------------------------------------------------------------------ the host tier

    def take_moves(self) -> tuple[tuple[StateMove, ...], tuple[int, ...]]:
        """The state copies queued since the last call, in order, and the restore ids among them,
        for the plan being built (``RoundPlan.state_moves``, ``RoundPlan.restores``): that plan
        must be launched, and each restore committed (or un-published) with it."""
        moves, restores = tuple(self._moves), tuple(self._restore_queue)
        self._moves, self._restore_queue = [], []
        return moves, restores

    @property
    def queued_restores(self) -> tuple[int, ...]:
        """Restore ids whose copy waits for a plan (read-only view)."""
        return tuple(self._restore_queue)

    @property
    def restores_queued(self) -> bool:
        """A restore waits for a plan to carry it (an otherwise empty plan must then run)."""
        return bool(self._restore_queue)

    def read_host(self, node: Node, slot: int) -> None:
        """Queues a copy of ``node``'s host checkpoint into device ``slot``, a request's own slot
        (the caller holds it and a lock on ``node``), for the plan being built: the request's row
        of that plan starts at ``node``'s depth from its slot, which the plan's state moves fill
        before its step. Counted as a read and a restore; the host copy stays, and ``node`` gets no
        device checkpoint. ``ValueError`` unless ``node`` is attached and holds a host checkpoint."""
        ckpt = node.checkpoint
        if ckpt is None or not ckpt.on_host or not node.attached or node.kv_on_host:
            raise ValueError(f"read_host needs an attached host checkpoint on device KV: {node!r}")
        assert ckpt.host_slot is not None
        ckpt.reads += 1
        self.restored += 1
        self._moves.append(StateMove("restore", ckpt.host_slot, slot))

    def restore(self, node: Node, slot: int) -> int:
        """Starts restoring ``node``'s host checkpoint into device ``slot`` (the caller allocated it
        and keeps its own reference to drop): the checkpoint becomes pending under a new restore
        id, which is returned and queued with the copy. ``ValueError`` unless ``node`` is attached
        and holds a host checkpoint, or when ``slot`` is free."""
        ckpt = node.checkpoint
        if ckpt is None or not ckpt.on_host or not node.attached or node.kv_on_host:
            raise ValueError(f"restore needs an attached host checkpoint on device KV: {node!r}")
        if self._slots.refcount(slot) == 0:
            raise ValueError(f"slot {slot} is free; allocate it before restoring into it")
        rid = next(self._restore_ids)
        self._slots.incref(slot)
        ckpt.move(slot)
        ckpt.status = CheckpointStatus.PENDING
        ckpt.producer_id = rid
        self._pending[rid] = {node}
        assert ckpt.host_slot is not None
        self._moves.append(StateMove("restore", ckpt.host_slot, slot))
        self._restore_queue.append(rid)
        return rid

    def _landed(self, node: Node) -> None:
        """A restore committed: its host slot goes back (the device copy is the checkpoint now)."""
        ckpt = node.checkpoint
        if ckpt is not None and ckpt.host_slot is not None and self._host is not None:
            self._host.decref(ckpt.host_slot)
            ckpt.host_slot = None
            self.restored += 1

    def _revert(self, node: Node) -> None:
        """A restore's round was void: the checkpoint is a host checkpoint again."""
        ckpt = node.checkpoint
        assert ckpt is not None and ckpt.restoring
        self._slots.decref(ckpt.held_slot)
        ckpt.move(0)
        ckpt.status = CheckpointStatus.HOST

    def _demote(self, node: Node, policy: EvictionPolicy | None) -> bool:
        """Moves ``node``'s committed checkpoint to the host tier (queueing its spill); False when
        there is no host tier or no host slot could be had."""
        if self._host is None:
            return False
        ids = self._host.alloc(1)
        if ids is None:
            self._drop_host(1, policy, keep=node)
            ids = self._host.alloc(1)
            if ids is None:
                return False
        ckpt = node.checkpoint
        assert ckpt is not None and ckpt.committed
        src = ckpt.held_slot
        ckpt.host_slot = ids[0]
        ckpt.status = CheckpointStatus.HOST
        ckpt.move(0)
        self._moves.append(StateMove("spill", src, ids[0]))
        self._slots.decref(src)
        self.demoted += 1
        return True

    def _drop_host(self, num: int, policy: EvictionPolicy | None, *, keep: Node | None = None) -> int:
        """Drops up to ``num`` host checkpoints of unlocked nodes (a request that read one holds its
        node, whose tail must keep it), lowest policy score first (a tail of a hybrid model goes
        with its checkpoint); returns how many."""
        nodes = (
            n for n in iter_nodes(self._root)
            if n is not keep and n.lock_count == 0 and n.checkpoint is not None and n.checkpoint.on_host
        )  # fmt: skip
        heap = self._heap(nodes, "state", policy)
        dropped = 0
        while heap and dropped < num:
            node = heapq.heappop(heap)[-1]
            self._drop_checkpoint(node)
            if node.is_tail and self._config.hybrid:
                self._remove_leaf(node)
            dropped += 1
        return dropped

    def _drop_checkpoint(self, node: Node) -> None:
        ckpt = node.checkpoint
        if ckpt is None:
            return
        if ckpt.host_slot is not None and self._host is not None:
            self._host.decref(ckpt.host_slot)
            self.host_dropped += 1
        if ckpt.on_host:
            node.checkpoint = None
            return
        super()._drop_checkpoint(node)

    # ------------------------------------------------------------------ eviction

    def evict_kv(self, num_pages: int, policy: EvictionPolicy | None = None) -> int:
        """Evict unlocked leaves of the device part of the tree (their pages and committed or host
        checkpoint) in policy order until ``num_pages`` pages went back to the pool's free list or
        nothing is evictable. With a host tier for KV each is demoted there instead
        (``cache/hostkv.py``); otherwise, or when it cannot be, it is removed with the host KV
        below it.

        Returns the pages actually freed. A full-page node whose every page someone else also
        holds is left alone (:meth:`_held_elsewhere`): evicting it would free none (a running
        request's own commit or end inserts them again) and only lose what the tree keeps there.
        Never touches locked nodes, pending KV or pending checkpoints.
        Cost: one tree walk plus a heap, O(nodes log nodes) per call.
        """
        start = self._pages.num_free
        if num_pages > 0:
            self._sweep(
                lambda n: kv_evictable(n) and not self._held_elsewhere(n),
                lambda n: self._evict_node(n, policy),
                lambda: self._pages.num_free - start >= num_pages,
                policy,
            )
        return self._pages.num_free - start

    def _demote_kv(self, node: Node, policy: EvictionPolicy | None) -> bool:
        """Moves ``node``'s device pages (an evictable node, ``kv_evictable``) to host pages,
        queueing their spills, with its committed checkpoint (demoted, or dropped when no host slot
        can be had). False, changing nothing, when the host copy could never be read, and the
        caller then drops the node: no host tier for KV or no host page to be had; an
        attention-only model's tail (a match reads no host tail there); a hybrid model's node with
        no checkpoint that could come back at or below it (a hybrid match reads host KV only on the
        way to a host checkpoint)."""
        if self._host_pages is None or (node.is_tail and not self._config.hybrid):
            return False
        if self._config.hybrid and node.checkpoint is None and not self._host_checkpoint_below(node):
            return False
        n = len(node.pages)
        ids = self._host_pages.alloc(n)
        if ids is None:
            self._drop_host_kv(n - self._host_pages.num_free, policy, keep=node)
            ids = self._host_pages.alloc(n)
            if ids is None:
                return False
        ckpt = node.checkpoint
        if ckpt is not None and ckpt.committed and not self._demote(node, policy):
            if self._config.hybrid and (node.is_tail or not self._host_checkpoint_below(node)):
                self._host_pages.release(ids)  # its checkpoint cannot follow and nothing below reads it
                return False
            self._drop_checkpoint(node)
        self._moves.extend(StateMove("kv_spill", d, h) for d, h in zip(node.pages, ids))
        self._pages.release(node.pages)
        node.pages, node.host_pages = [], ids
        self.kv_demoted += n
        return True

    def _evict_node(self, node: Node, policy: EvictionPolicy | None) -> None:
        """Demotes ``node`` to host KV, or removes it with the host KV below it."""
        if not self._demote_kv(node, policy):
            self._remove_subtree(node)

    def _held_elsewhere(self, node: Node) -> bool:
        """A full-page node every page of which someone else holds too (a running request that
        inserted or planted it, or a tail sharing its first page): evicting it frees no page. A
        tail is never held back, so a full-page node sharing its page with one is freed after it."""
        return not node.is_tail and all(self._pages.refcount(p) > 1 for p in node.pages)

    def evict_states(self, num_slots: int, policy: EvictionPolicy | None = None) -> int:
        """Frees device slots of unlocked committed checkpoints in policy order (keeping the nodes'
        KV) until ``num_slots`` slots went back to the free list: each is demoted to the host tier
        when there is one (:meth:`_demote`), else dropped. Returns the slots actually freed."""
        start = self._slots.num_free
        if num_slots <= 0:
            return 0
        heap = self._heap((n for n in iter_nodes(self._root) if state_evictable(n)), "state", policy)
        while heap and self._slots.num_free - start < num_slots:
            node = heapq.heappop(heap)[-1]
            if not state_evictable(node):
                continue  # a host-pool eviction just took it
            if self._demote(node, policy):
                continue
            self._drop_checkpoint(node)
            if node.is_tail and self._config.hybrid:  # a hybrid's tail is its checkpoint (tree.py)
                self._remove_leaf(node)
        return self._slots.num_free - start

    def flush(self) -> None:
        """Drop every unlocked node (host KV too), every committed or host checkpoint on one and every
        restore, with the state copies queued (a locked node's host checkpoint stays: a running request read
        it and its tail must keep it). Pending KV and producers' pending checkpoints stay
        (a round may be writing them): after every producer committed or un-published and every
        lock was released, a flush leaves the tree empty and frees all pages, slots and host slots
        it held. A restore in a round still in flight is un-published too (its commit finds nothing;
        its copy writes a slot that is free or that a later round overwrites)."""
        for rid in [p for p in self._pending if p < 0]:
            self.unpublish(rid)
        self._moves, self._restore_queue = [], []
        for node in iter_postorder(self._root):
            ckpt = node.checkpoint
            if state_evictable(node) or (ckpt is not None and ckpt.on_host and node.lock_count == 0):
                self._drop_checkpoint(node)
        for node in iter_postorder(self._root):
            if not node.children and (kv_evictable(node) or self._host_leaf(node, None)):
                self._remove_leaf(node)
