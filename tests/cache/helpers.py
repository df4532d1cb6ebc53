"""Small request-side helpers shared by the cache tests (the scheduler's role, reduced to integers)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from radixflow_jax.cache import (
    CacheConfig,
    EvictionPolicy,
    HostPool,
    InsertResult,
    MatchResult,
    Node,
    PagePool,
    RadixCache,
    SlotPool,
)


def make_cache(
    *,
    page_size: int = 2,
    grid: int = 4,
    hybrid: bool = True,
    num_pages: int = 32,
    num_slots: int = 8,
    policy: EvictionPolicy | None = None,
    host_slots: int = 0,
    host_pages: int = 0,
) -> RadixCache:
    """``host_slots`` / ``host_pages``: the host tier's capacity in checkpoints and KV pages (0:
    none)."""
    cfg = CacheConfig(page_size=page_size, grid=grid, hybrid=hybrid)
    host = HostPool(host_slots + 1) if host_slots else None
    kv = HostPool(host_pages + 1) if host_pages else None
    return RadixCache(cfg, PagePool(num_pages), SlotPool(num_slots), policy=policy, host_pool=host, host_page_pool=kv)


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


@dataclasses.dataclass(frozen=True)
class Matched(MatchResult):
    """A ``MatchResult`` with what the tree holds along the matched path, read from the nodes (the
    cache reports only what the scheduler uses): ``kv_node`` ends the committed KV prefix
    (``kv_hit_len`` tokens in ``kv_pages``; the root when 0), ``pending_kv_len`` is the depth of the path's device part
    with pending KV, ``committed_node`` the deepest committed checkpoint on it (``committed_depth``,
    ``committed_slot``; ``None`` / 0 / ``None`` without one)."""

    kv_hit_len: int
    kv_pages: tuple[int, ...]
    kv_node: Node
    pending_kv_len: int
    committed_node: Node | None
    committed_depth: int
    committed_slot: int | None


def matched(cache: RadixCache, tokens: Sequence[int], **kw: bool) -> Matched:
    """``cache.match(tokens, **kw)`` and the tree along its path (which the match split to end
    exactly at the matched depth): the nodes whose spans ``tokens`` follows, never past
    ``align_down(len(tokens) - 1)``."""
    m = cache.match(tokens, **kw)
    toks, p = tuple(tokens), cache.config.page_size
    cap = cache.config.align_down(len(toks) - 1) if toks else 0
    path, node = [], cache.root
    while (child := node.children.get(toks[node.depth : node.depth + p])) is not None:
        if child.depth > cap or toks[node.depth : child.depth] != child.key:
            break
        path.append(child)
        node = child
    committed = [n for n in path if n.checkpoint is not None and n.checkpoint.committed]
    kv = [n for n in path if n.kv_producer is None and not n.kv_on_host]  # committed device KV: a prefix
    device = [n for n in path if not n.kv_on_host]  # the device part of the path (host KV hangs below it)
    return Matched(
        **{f.name: getattr(m, f.name) for f in dataclasses.fields(MatchResult)},
        kv_hit_len=kv[-1].depth if kv else 0,
        kv_pages=tuple(page for n in kv for page in n.pages),
        kv_node=kv[-1] if kv else cache.root,
        pending_kv_len=device[-1].depth if device else 0,
        committed_node=committed[-1] if committed else None,
        committed_depth=committed[-1].depth if committed else 0,
        committed_slot=committed[-1].readable_slot if committed else None,
    )
