"""The host tier's KV pages (cache/hostkv.py): page eviction demotes nodes to host KV, a match
reports what would come back, promotion and recomputation bring it back, the host pool makes room,
and nothing leaks."""

from __future__ import annotations

import pytest

from radixflow_jax.cache import StateMove
from tests.cache.helpers import cold_insert, committed_checkpoint, make_cache, own_pages

A = list(range(100, 112))  # 12 tokens: 6 pages of 2
B = A[:8] + list(range(300, 304))  # shares A's first 8 tokens


def _all_free(cache) -> None:
    cache.flush()
    cache.check_invariants()
    assert cache.page_pool.num_used == 0 and cache.slot_pool.num_used == 0
    for pool in (cache.host_pool, cache.host_page_pool):
        assert pool is None or pool.num_used == 0


def _kinds(moves) -> list[str]:
    return [m.kind for m in moves]


def test_page_eviction_demotes_the_node_and_a_match_reports_its_host_kv():
    cache = make_cache(hybrid=False, host_pages=8)
    node = cold_insert(cache, A).node
    pages = list(node.pages)
    assert cache.evict_kv(6) == 6 and cache.page_pool.num_used == 0
    moves, _ = cache.take_moves()
    assert moves == tuple(StateMove("kv_spill", d, h) for d, h in zip(pages, node.host_pages))
    assert node.attached and node.kv_on_host and node.pages == [] and cache.stats().host_tokens == 12
    m = cache.match(A + [1])
    assert m.hit_len == 0 and m.host_kv == (node,) and m.host_node is None
    cache.check_invariants()
    _all_free(cache)


def test_promotion_brings_host_kv_back_for_the_plan_being_built():
    cache = make_cache(hybrid=False, host_pages=8)
    node = cold_insert(cache, A).node
    cache.evict_kv(6)
    cache.take_moves()
    host = list(node.host_pages)
    fresh = cache.page_pool.alloc(6)
    cache.promote(cache.match(A + [1]).host_kv, fresh)
    cache.page_pool.release(fresh)  # the tree holds the only reference now
    assert cache.take_moves()[0] == tuple(StateMove("kv_restore", h, d) for h, d in zip(host, fresh))
    m = cache.match(A + [1])
    assert m.hit_len == 12 and m.hit_pages == tuple(fresh) and not m.host_kv
    assert cache.host_page_pool.num_used == 0 and cache.kv_restored == 6
    cache.check_invariants()
    more = cache.page_pool.alloc(6)
    with pytest.raises(ValueError):
        cache.promote((node,), more)  # not host KV any more
    cache.page_pool.release(more)
    _all_free(cache)


def test_demotion_goes_up_the_path_and_the_host_part_hangs_below_the_device_part():
    cache = make_cache(hybrid=False, host_pages=16)
    cold_insert(cache, A)
    cold_insert(cache, B)  # A and B part at depth 8: a branch node of 4 pages above two leaves
    assert cache.evict_kv(4) == 4  # both leaves
    upper = cache.match(A + [1], touch=False).hit_node
    assert upper.depth == 8 and all(c.kv_on_host for c in upper.children.values())
    assert cache.evict_kv(1) == 4  # now the branch node: the whole node goes down
    cache.check_invariants()
    m = cache.match(B + [1])
    assert m.hit_len == 0 and [n.depth for n in m.host_kv] == [8, 12]
    moves, _ = cache.take_moves()
    assert _kinds(moves) == ["kv_spill"] * 8
    _all_free(cache)


def test_a_recompute_inserts_its_pages_over_host_kv_and_planting_through_it_is_refused():
    cache = make_cache(hybrid=False, host_pages=8)
    cold_insert(cache, A)
    cache.evict_kv(6)
    cache.take_moves()
    table, own = own_pages(cache, A)
    assert cache.plant_pending(A, 8, None, 7, table) is None  # no pending KV below host KV
    res = cache.insert(A, table)
    assert res.adopted == tuple(table) and res.rejected == ()
    assert cache.host_page_pool.num_used == 0 and not res.node.kv_on_host
    cache.page_pool.release(own)
    cache.check_invariants()
    _all_free(cache)


def test_a_hybrid_checkpoint_goes_down_with_its_pages_and_comes_back_after_them():
    cache = make_cache(host_pages=8, host_slots=2, num_slots=4)
    slot = committed_checkpoint(cache, A, 8)
    assert cache.evict_kv(6) == 6
    moves, _ = cache.take_moves()
    assert sorted(set(_kinds(moves))) == ["kv_spill", "spill"] and cache.slot_pool.is_free(slot)
    m = cache.match(A + [1])
    host = m.host_node
    assert host is not None and host.depth == 8 and host.checkpoint.on_host and m.hit_len == 0
    assert [n.depth for n in m.host_kv] == [8]  # the node 8..12 below is not on the way
    with pytest.raises(ValueError):
        cache.read_host(host, 1)  # its KV first
    fresh = cache.page_pool.alloc(4)
    cache.promote(m.host_kv, fresh)
    cache.page_pool.release(fresh)
    m2 = cache.match(A + [1])
    assert m2.host_node is host and not m2.host_kv and m2.host_pages == tuple(fresh)
    into = cache.slot_pool.alloc(1)[0]
    cache.read_host(host, into)
    assert _kinds(cache.take_moves()[0]) == ["kv_restore"] * 4 + ["restore"]
    cache.slot_pool.decref(into)
    cache.check_invariants()
    _all_free(cache)


def test_a_full_host_pool_drops_its_coldest_leaves_then_drops_what_cannot_go_down():
    cache = make_cache(hybrid=False, host_pages=6)
    cold_insert(cache, A)
    cold_insert(cache, list(range(400, 412)))
    assert cache.evict_kv(6) == 6  # the least recently used of the two (A) goes down
    first = cache.match(A + [1], touch=False)
    assert first.host_kv and cache.host_page_pool.num_free == 0
    assert cache.evict_kv(6) == 6  # the other one goes down, A's host copy is dropped for it
    assert not cache.match(A + [1], touch=False).host_kv and cache.kv_host_dropped == 6
    assert cache.match(list(range(400, 413)), touch=False).host_kv
    cache.check_invariants()
    _all_free(cache)


def test_a_match_inside_host_kv_splits_its_host_pages():
    cache = make_cache(hybrid=False, host_pages=8)
    cold_insert(cache, A)
    cache.evict_kv(6)
    m = cache.match(A[:6] + [1])  # 3 pages of the 6-page host node
    (upper,) = m.host_kv
    assert upper.depth == 6 and len(upper.host_pages) == 3 and len(next(iter(upper.children.values())).host_pages) == 3
    cache.check_invariants()
    fresh = cache.page_pool.alloc(3)
    cache.promote(m.host_kv, fresh)
    cache.page_pool.release(fresh)
    assert cache.match(A + [1]).hit_len == 6 and cache.match(A + [1]).host_kv
    cache.check_invariants()
    _all_free(cache)


def test_what_could_never_be_read_or_frees_nothing_is_dropped_not_demoted():
    """An attention-only tail, a hybrid node whose checkpoint cannot follow (no host slot), and a
    node whose pages a running request also holds: removed as without the tier, nothing spilled."""
    tails = make_cache(hybrid=False, host_pages=8, page_size=4)
    table, own = own_pages(tails, A[:7])
    tails.keep_end(A, 7, None, table, owner=1)
    tails.page_pool.release(own)
    parent = tails.match(A[:5]).hit_node
    assert tails.evict_kv(2) == 2 and tails.host_page_pool.num_used == 1  # the tail went, its parent went down
    assert _kinds(tails.take_moves()[0]) == ["kv_spill"] and parent.kv_on_host and not parent.children
    tails.check_invariants()
    _all_free(tails)
    hybrid = make_cache(host_pages=8, num_slots=4)  # no host slots: a checkpoint cannot follow its pages
    committed_checkpoint(hybrid, A, 8)
    assert hybrid.evict_kv(6) == 6 and hybrid.host_page_pool.num_used == 0 and hybrid.stats().nodes == 0
    held = make_cache(hybrid=False, host_pages=8)
    table, own = own_pages(held, A)
    held.insert(A, table)  # a running request's pages, inserted at a commit: it still holds them
    assert held.evict_kv(6) == 0 and held.host_page_pool.num_used == 0 and held.take_moves() == ((), ())
    held.page_pool.release(own)
    _all_free(held)
