"""The allocator: the pools and the radix cache as the scheduler uses them. All-or-nothing
allocation with eviction, seating a request (:meth:`Allocator.seat`, the one admission path of the
scan, pairing and riders), growing its page table, checkpoint planting, and releasing what a
request holds (:meth:`Allocator.release`).

Invariants:
  * An allocation either returns every id asked for or changes nothing (after evicting what the
    cache could give up); it never asserts on a short pool.
  * A request holds one reference to each page in ``own_pages`` and to its ``slot``; tree-owned pages
    in its page table are protected by the lock on ``hit_node``. :meth:`Allocator.release` drops exactly
    these, so after every request finished and the cache is flushed all pages and slots are free.
  * :meth:`Allocator.seat` either seats a request with everything its first row needs or leaves it
    holding nothing.
  * A checkpoint slot handed to :meth:`RadixCache.plant_pending` is referenced by the tree only; if
    planting is refused the slot goes straight back to the free list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixflow_jax.cache import CacheConfig, PagePool, RadixCache, SlotPool, StateMove
from radixflow_jax.cache.placement import Placement
from radixflow_jax.scheduler.request import Request


class Allocator:
    """The pools (``pages``, ``slots``: ``None`` for attention-only models) and the prefix cache
    (``None`` with the cache off), and how many pages and slots eviction freed (round statistics)."""

    def __init__(self, cache_config: CacheConfig, pages: PagePool, slots: SlotPool | None, cache: RadixCache | None):
        self.config = cache_config
        self.pages = pages
        self.slots = slots
        self.cache = cache
        self.evicted_pages = 0
        self.evicted_slots = 0
        self.holds: dict[int, Request] = {}  # request id -> the waiting request holding a restore (hold_restore)

    def alloc_pages(self, n: int) -> list[int] | None:
        if n <= 0:
            return []
        ids = self.pages.alloc(n)
        if ids is None and self.cache is not None:
            # evict in batches: one eviction pass walks the tree, so amortise it over many allocations
            batch = max(n - self.pages.num_free, self.pages.capacity // 32)
            self.evicted_pages += self.cache.evict_kv(batch)
            ids = self.pages.alloc(n)
        return ids

    def alloc_slot(self, *, checkpoint: bool = False, band: bool = True) -> int | None:
        """A request's slot or, with ``checkpoint``, a checkpoint's (``cache/pools.SlotPool``),
        evicting committed checkpoints (``capacity // 32`` at a time) only when no slot is free.

        A checkpoint takes the highest free slot above the request band, and one of the band only
        when eviction freed none above it (never with ``band=False``: None instead). A request takes the band's lowest free slot; when the
        band holds none, a committed checkpoint there (a finished request's kept end, which stays
        in that request's slot) moves to a free slot above the band (``_move_out``), and the
        request takes the slot it left; only when neither exists, the lowest free slot anywhere.
        So the running requests' slots stay in the band while it has room (the decode window,
        ``runner/window.py``), at no more evictions than before the band."""
        slots, cache = self.slots, self.cache
        if slots is None:
            return None
        evict = max(1, slots.capacity // 32)
        if checkpoint:
            ids = slots.alloc_high(1, band=False)
            if ids is None and cache is not None:
                self.evicted_slots += cache.evict_states(evict)
                ids = slots.alloc_high(1, band=False)
            ids = ids or (slots.alloc_high(1) if band else None)  # nothing above the band could be freed
            return ids[0] if ids else None
        for attempt in range(2):
            ids = self._move_out(take=True) or slots.alloc_low(1, band=True)
            if ids is None and not slots.num_free and cache is not None and attempt == 0:
                self.evicted_slots += cache.evict_states(evict)
                continue
            ids = ids or slots.alloc(1)
            return ids[0] if ids else None
        return None

    def _move_out(self, *, take: bool) -> list[int] | None:
        """Moves the committed checkpoint of an unlocked node held in the band (the tree's only
        reference; the lowest such slot) into a free slot above the band, never evicting (the cache
        queues its state copy, ``RoundPlan.state_moves``). ``take`` (a request's slot): only a slot below the band's
        lowest free one, which is then allocated and returned, so the running requests pack at the
        bottom of the band; otherwise (a request just released) any, left free. None when nothing
        moved."""
        slots, cache = self.slots, self.cache
        if slots is None or cache is None:
            return None
        low = slots.lowest_free
        band_low = low if low is not None and low <= slots.request_slots else None
        below = band_low if take and band_low is not None else slots.request_slots + 1
        if below == 1:
            return None  # slot 1 is free: nothing lies below it
        dst = slots.alloc_high(1, band=False)
        if dst is None:
            return None
        src = cache.move_checkpoint_out(below, dst[0])
        slots.decref(dst[0])  # the tree took its own reference (or nothing moved: free again)
        if src is None:
            return None
        return slots.alloc_low(1, band=True) if take else None

    def seat(
        self,
        req: Request,
        *,
        computed: int,
        end: int,
        hit_node: Any = None,
        hit_pages: Sequence[int] = (),
        shared_pages: Sequence[int] = (),
        slot: bool,
    ) -> bool:
        """Seats waiting ``req`` for a first row that computes ``tokens[computed:end]``, all or nothing:
        locks ``hit_node`` (a committed hit) and takes its tree pages ``hit_pages``, allocates a state
        slot (``slot``; hybrid models), takes its own reference on ``shared_pages`` (a running
        request's pages it starts from: policy pair's producer, a rider's twin), then grows its page
        table to ``end`` tokens. Whether it was seated; if not, it holds nothing again."""
        if hit_node is not None:
            self.cache.lock(hit_node)  # before allocating: eviction must not take the hit
            req.hit_node = hit_node
            req.pages = list(hit_pages)
        state = self.alloc_slot() if slot else None
        if slot and state is None:
            self.release(req, keep_prefix=False)
            return False
        req.slot = state
        if shared_pages:
            for page in shared_pages:
                self.pages.incref(page)
            req.pages, req.own_pages = list(shared_pages), list(shared_pages)
        if not self.ensure_pages(req, end):
            self.release(req, keep_prefix=False)
            return False
        req.num_computed = req.cached_tokens = computed
        self.drop_restore(req)
        return True

    def ensure_spare(self, req: Request) -> bool:
        """Gives ``req`` a spare state slot for its verify rows (speculative decoding), above the
        request band where one is free, as a checkpoint's slot is (evicting committed checkpoints
        when none is: the pool of a warm engine is full of them); True when it holds one
        (attention-only models need none). Held until the request is released."""
        if self.slots is None or req.spare_slot is not None:
            return True
        req.spare_slot = self.alloc_slot(checkpoint=True)
        return req.spare_slot is not None

    def ensure_pages(self, req: Request, num_tokens: int) -> bool:
        """Grows ``req``'s page table to hold ``num_tokens`` tokens (all or nothing)."""
        need = self.config.pages_for(num_tokens) - len(req.pages)
        ids = self.alloc_pages(need)
        if ids is None:
            return False
        req.pages.extend(ids)
        req.own_pages.extend(ids)
        return True

    def plant(self, req: Request, placements: Sequence[Placement]) -> tuple[list[tuple[int, int]], int]:
        """Plants pending checkpoints of ``req`` in the given priority order (``cache/placement.py``);
        returns ``(depth, slot)`` of those the round must emit, ascending, and how many were skipped
        for lack of a slot. A missing slot first evicts unlocked *committed* checkpoints (shallowest
        of the least recently used first; never a pending or locked one); when none is left the rest
        of the list (the least important positions) is skipped. A refused plant (a checkpoint is
        already there, or another producer's pending KV is on the way) is neither."""
        if self.cache is None or self.slots is None or not placements:
            return [], 0
        planted = []
        tokens = req.tokens
        for i, placement in enumerate(placements):
            slot = self.alloc_slot(checkpoint=True)
            if slot is None:
                return sorted(planted), len(placements) - i
            node = self.cache.plant_pending(
                tokens, placement.depth, slot, req.request_id, req.pages, wanted=placement.kind == "lookahead"
            )
            self.slots.decref(slot)  # the tree holds the only reference now (or none: refused)
            if node is not None:
                planted.append((placement.depth, slot))
        return sorted(planted), 0

    def release(self, req: Request, *, keep_prefix: bool) -> None:
        """Drops everything ``req`` holds. ``keep_prefix`` (a finished request, released after the
        commit of its last launched round): first keep its exact end in the tree, its full pages and
        the state its slot holds at ``req.state_depth`` (``RadixCache.keep_end``: the tree takes its
        own references), so the next turn of a conversation computes only the tokens this one did
        not feed."""
        if self.cache is not None:
            self.cache.unpair(req.request_id)
            self.cache.unpublish(req.request_id)
            if keep_prefix and 0 < req.state_depth <= req.num_tokens:
                self.cache.keep_end(req.tokens, req.state_depth, req.slot, req.pages, req.request_id,
                                    generated=req.state_depth > len(req.prompt))  # fmt: skip
            if req.hit_node is not None:
                self.cache.unlock(req.hit_node)
            self.drop_restore(req)
        self.pages.release(req.own_pages)
        if req.slot is not None and self.slots is not None:
            self.slots.decref(req.slot)
        if req.spare_slot is not None and self.slots is not None:
            self.slots.decref(req.spare_slot)
        req.pages, req.own_pages, req.slot, req.spare_slot, req.hit_node = [], [], None, None, None
        self._move_out(take=False)  # its end, kept in the band: out of it while a slot above is free

    def restore(self, node: Any) -> bool:
        """Starts restoring ``node``'s host checkpoint (``cache/tiers.py``) into a checkpoint slot,
        evicting (demoting) committed checkpoints for one as planting does; False when no slot
        could be had, or the host checkpoint left while one was freed (the caller recomputes, or
        waits while something is pending). A slot of the request band only while nothing else is
        pending: restores waiting for their round must leave the running and admitted requests
        their slots (else a burst of returning conversations holds every slot, nothing can be
        admitted, and the scan's liveness flush drops them all), and a lone one commits with the
        next round."""
        if self.cache is None:
            return False
        slot = self.alloc_slot(checkpoint=True, band=not self.cache.has_pending)
        if slot is None:
            return False
        ckpt = node.checkpoint
        if ckpt is not None and ckpt.on_host and node.attached:
            self.cache.restore(node, slot)
        self.slots.decref(slot)  # the tree holds the only reference now (or none: nothing to restore)
        return ckpt is not None and ckpt.restoring

    def promote(self, nodes: Sequence[Any]) -> bool:
        """Brings the host KV of ``nodes`` (a match's ``host_kv``) back onto freshly allocated pages
        (``RadixCache.promote``: ``kv_restore`` moves for the plan being built), evicting as any
        allocation does while a lock keeps the path in the tree; False, changing nothing in the
        tree, when the pages cannot be had."""
        assert self.cache is not None and nodes
        last = nodes[-1]
        self.cache.lock(last)  # eviction for the pages must not take the path being brought back
        try:
            pages = self.alloc_pages(sum(n.num_pages for n in nodes))
            if pages is None:
                return False
            self.cache.promote(nodes, pages)
            self.pages.release(pages)  # the tree holds the only reference now
            return True
        finally:
            self.cache.unlock(last)

    def hold_restore(self, req: Request, node: Any) -> None:
        """Waiting ``req`` had ``node``'s host checkpoint restored: a lock keeps the restored state
        from eviction (a later restore would demote it again before ``req`` read it) until ``req``
        is seated or released (one hold per request; the audit counts it)."""
        self.drop_restore(req)
        self.cache.lock(node)
        req.restore_node = node
        self.holds[req.request_id] = req

    def drop_restore(self, req: Request) -> None:
        """Undoes :meth:`hold_restore` (nothing without a hold)."""
        if req.restore_node is not None:
            self.cache.unlock(req.restore_node)
            req.restore_node = None
        self.holds.pop(req.request_id, None)

    @property
    def restores_queued(self) -> bool:
        """A restore waits for a plan to carry it (``RadixCache.restores_queued``)."""
        return self.cache is not None and self.cache.restores_queued

    def take_state_moves(self) -> tuple[tuple[StateMove, ...], tuple[int, ...]]:
        """The state copies queued since the last call and the restore ids among them, for the
        plan being built (``RoundPlan.state_moves``, ``RoundPlan.restores``)."""
        return self.cache.take_moves() if self.cache is not None else ((), ())

    def flush(self) -> None:
        """Empties the cache (``RadixCache.flush``: queued state moves and restores go with it),
        first dropping every restore hold (``holds``)."""
        if self.cache is not None:
            for req in list(self.holds.values()):
                self.drop_restore(req)
            self.cache.flush()
