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

from radixflow_jax.cache import CacheConfig, PagePool, RadixCache, SlotPool
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

    def alloc_slot(self, *, checkpoint: bool = False) -> int | None:
        """A request's slot (the lowest free one) or, with ``checkpoint``, a checkpoint's (the
        highest free one; ``cache/pools.SlotPool``), evicting committed checkpoints when short."""
        if self.slots is None:
            return None
        alloc = self.slots.alloc_high if checkpoint else self.slots.alloc
        ids = alloc(1)
        if ids is None and self.cache is not None:
            self.evicted_slots += self.cache.evict_states(max(1, self.slots.capacity // 32))
            ids = alloc(1)
        return ids[0] if ids else None

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
        return True

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
        self.pages.release(req.own_pages)
        if req.slot is not None and self.slots is not None:
            self.slots.decref(req.slot)
        req.pages, req.own_pages, req.slot, req.hit_node = [], [], None, None

    def flush(self) -> None:
        if self.cache is not None:
            self.cache.flush()
