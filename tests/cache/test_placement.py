"""Checkpoint placement rules (cache/placement.py) and slot-aware eviction of checkpoints."""

from __future__ import annotations

import pytest

from radixflow_jax.cache import LRUPolicy
from radixflow_jax.cache.placement import Placement, common_prefix, lookahead_lengths, place, spacing
from tests.cache.helpers import committed_checkpoint, make_cache, own_pages, plant


def test_spacing_rule() -> None:
    assert spacing(477, 64, max_checkpoints=8) == 64  # ceil(477 / 8) = 60 -> one grid
    assert spacing(6700, 64, max_checkpoints=8) == 896
    assert spacing(100, 64, interval=128) == 128
    with pytest.raises(ValueError):
        spacing(100, 64, interval=100)


def test_common_prefix_and_lookahead() -> None:
    a = tuple(range(100))
    assert common_prefix(a, a) == 100 and common_prefix(a, a[:40]) == 40
    assert common_prefix(a, a[:37] + (0,) * 10) == 37 and common_prefix(a, (5,)) == 0
    # capped by the producer's prompt and by each sibling's len - 1
    sibs = [a[:70] + (1, 2), a[:20], a[:50] + (9,) * 30]
    assert lookahead_lengths(a, sibs, limit=60) == {60, 19, 50}


def test_place_priority_and_grid_alignment() -> None:
    got = place(0, 200, grid=16, every=64, prompt_len=190, branch_lens=(70,), lookahead_lens=(150, 40))
    # look-ahead branch points first (deepest first), then every other position deepest first;
    # 64 is a grid and a branch position (one placement, the branch); the prompt end lies inside
    # the span (a recompute after preemption): its deepest grid position
    assert got == [
        Placement(144, "lookahead"),
        Placement(32, "lookahead"),
        Placement(192, "grid"),
        Placement(176, "prompt-end"),
        Placement(128, "grid"),
        Placement(64, "branch"),
    ]
    assert all(p.depth % 16 == 0 and 0 < p.depth <= 200 for p in got)
    # a decode span plants on the spacing grid only; one not on it plants nothing
    assert place(255, 256, grid=16, every=64, prompt_len=190) == [Placement(256, "grid")]
    assert place(239, 240, grid=16, every=64, prompt_len=190) == []
    # a span that ends the prompt plants its exact end, even a one-token span
    assert place(0, 190, grid=16, every=64, prompt_len=190) == [
        Placement(190, "prompt-end"), Placement(128, "grid"), Placement(64, "grid")
    ]
    assert place(189, 190, grid=16, every=64, prompt_len=190) == [Placement(190, "prompt-end")]


def test_place_in_a_span_that_starts_off_the_grid() -> None:
    # a span from an exact-depth checkpoint at 100: its chunks end at 116, 132, ...; every
    # placement lies there or at its end
    got = place(100, 190, grid=16, every=64, prompt_len=190, branch_lens=(150,), lookahead_lens=(120,))
    assert got == [
        Placement(116, "lookahead"), Placement(190, "prompt-end"), Placement(164, "grid"), Placement(148, "branch")
    ]
    assert all((p.depth - 100) % 16 == 0 or p.depth == 190 for p in got)
    # cut by the budget at the absolute grid (builder.grid_span): the prompt end belongs to a later span
    assert place(100, 192, grid=16, every=64, prompt_len=300) == [Placement(164, "grid")]


def test_state_eviction_keeps_the_deepest_of_a_path() -> None:
    cache = make_cache(num_slots=8)  # page 2, grid 4
    toks = list(range(50, 66))
    table, own = own_pages(cache, toks)
    for depth in (4, 8, 12):
        assert plant(cache, toks, depth, 7, table)[0] is not None
    assert cache.commit(7) == 3
    cache.insert(toks, table)
    cache.page_pool.release(own)
    cache.match(toks)  # one access stamps the whole path alike
    assert cache.evict_states(1) == 1
    assert cache.match(toks + [1]).hit_len == 12  # the shallow checkpoint went, the deep one stays
    assert cache.evicted_unused == 1
    # a read checkpoint no longer counts as evicted before use
    node = cache.match(toks + [1]).hit_node
    cache.read_checkpoint(node)
    cache.flush()
    assert cache.evicted_unused == 2  # the depth-8 one was never read; depth 12 was


def test_shared_checkpoints_outlive_speculative_ones() -> None:
    cache = make_cache(num_slots=8, policy=LRUPolicy())
    article = list(range(100, 108))
    a, b = article + [1, 1, 1, 1], article + [2, 2, 2, 2]
    committed_checkpoint(cache, a, 8, producer=1)  # branch point of a and b once both are cached
    committed_checkpoint(cache, b, 12, producer=2)
    committed_checkpoint(cache, list(range(300, 312)), 12, producer=3)  # newer, speculative
    assert cache.evict_states(1) == 1
    # the oldest speculative checkpoint (b's end) went; the branch one, older still, survived
    assert cache.match(b + [0]).hit_len == 8
    assert cache.match(a).hit_len == 8
    assert cache.match(list(range(300, 312)) + [0]).hit_len == 12
