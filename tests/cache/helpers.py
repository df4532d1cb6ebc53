"""Small request-side helpers shared by the cache tests (the scheduler's role, reduced to integers)."""

from __future__ import annotations

from collections.abc import Sequence

from radixflow_jax.cache import CacheConfig, EvictionPolicy, InsertResult, Node, PagePool, RadixCache, SlotPool


def make_cache(
    *,
    page_size: int = 2,
    grid: int = 4,
    hybrid: bool = True,
    num_pages: int = 32,
    num_slots: int = 8,
    policy: EvictionPolicy | None = None,
) -> RadixCache:
    cfg = CacheConfig(page_size=page_size, grid=grid, hybrid=hybrid)
    return RadixCache(cfg, PagePool(num_pages), SlotPool(num_slots), policy=policy)


def own_pages(cache: RadixCache, tokens: Sequence[int], table: Sequence[int] = ()) -> tuple[list[int], list[int]]:
    """A request's page table for ``tokens``: the borrowed ``table`` plus freshly allocated pages."""
    need = cache.config.pages_for(len(tokens)) - len(table)
    own = cache.page_pool.alloc(need)
    assert own is not None, "test pool too small"
    return list(table) + own, own


def cold_insert(cache: RadixCache, tokens: Sequence[int]) -> InsertResult:
    """A request computes ``tokens`` from scratch, inserts them and finishes."""
    table, own = own_pages(cache, tokens)
    res = cache.insert(tokens, table)
    cache.page_pool.release(own)
    return res


def plant(
    cache: RadixCache, tokens: Sequence[int], depth: int, producer: int, table: Sequence[int]
) -> tuple[Node | None, int]:
    """Allocate a slot, plant a pending checkpoint in it and hand the slot to the tree."""
    slots = cache.slot_pool.alloc(1)
    assert slots is not None, "test slot pool too small"
    node = cache.plant_pending(tokens, depth, slots[0], producer, table)
    cache.slot_pool.decref(slots[0])
    return node, slots[0]


def committed_checkpoint(cache: RadixCache, tokens: Sequence[int], depth: int, producer: int = 999) -> int:
    """Cache ``tokens`` with a committed checkpoint at ``depth``; returns its slot."""
    table, own = own_pages(cache, tokens)
    node, slot = plant(cache, tokens, depth, producer, table)
    assert node is not None
    assert cache.commit(producer) == 1
    cache.insert(tokens, table)
    cache.page_pool.release(own)
    return slot
