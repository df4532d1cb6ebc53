"""Unit tests of the radix prefix cache: config, placement, match, insert and the checkpoint lifecycle."""

from __future__ import annotations

import pytest

from radixflow_jax.cache import (
    CacheConfig,
    PendingCheckpointError,
    branch_point,
    checkpoint_positions,
    end_position,
    grid_positions,
)
from tests.cache.helpers import cold_insert, committed_checkpoint, make_cache, matched, own_pages, plant

ARTICLE = list(range(100, 116))  # 16 tokens = 8 pages of 2


def assert_all_free(cache):
    cache.check_invariants()
    assert cache.page_pool.num_used == 0 and cache.slot_pool.num_used == 0


# ---------------------------------------------------------------- config and placement


def test_config_validation_and_grid_from_chunk():
    with pytest.raises(ValueError):
        CacheConfig(page_size=4, grid=6, hybrid=True)
    with pytest.raises(ValueError):
        CacheConfig(page_size=0, grid=4, hybrid=True)
    cfg = CacheConfig.for_model(16, (64,), hybrid=True)
    assert cfg.grid == 64 and CacheConfig.for_model(48, (64,), hybrid=True).grid == 192
    assert CacheConfig.for_model(16, (), hybrid=False).grid == 16
    assert cfg.align_down(33) == 32 and cfg.pages_for(33) == 3 and cfg.pages_for(0) == 0


def test_placement_helpers():
    assert grid_positions(0, 10, 4) == [4, 8]
    assert grid_positions(4, 8, 4) == [8]
    assert grid_positions(3, 3, 4) == [] and grid_positions(5, 7, 4) == []
    assert branch_point(13, 4) == 12 and branch_point(3, 4) == 0
    assert end_position(13, 2) == 12 and end_position(1, 2) == 0
    # prefill [0, 10): grid 4, 8, branch at floor(6/4)*4 = 4, end 10 -> page-aligned 10
    assert checkpoint_positions(0, 10, grid=4, page_size=2, branch_len=6, final_len=10) == [4, 8, 10]
    # branch point outside the computed span is dropped; odd final length rounds down to a page
    assert checkpoint_positions(8, 13, grid=4, page_size=2, branch_len=6, final_len=13) == [12]
    assert checkpoint_positions(8, 9, grid=4, page_size=2, final_len=9) == []


# ---------------------------------------------------------------- insert and match


def test_insert_then_match_attention_only():
    cache = make_cache(hybrid=False)
    res = cold_insert(cache, ARTICLE[:8])
    assert res.node.depth == 8 and len(res.pages) == 4 and res.adopted == res.pages and res.rejected == ()
    m = matched(cache, ARTICLE[:8])  # never the last token: 7 -> page-aligned 6
    assert (m.kv_hit_len, m.hit_len) == (6, 6) and m.hit_pages == res.pages[:3]
    assert m.hit_node is m.kv_node and m.kv_node.depth == 6
    m = matched(cache, ARTICLE[:8] + [1])
    assert m.hit_len == 8 and m.kv_pages == res.pages
    assert matched(cache, []).hit_len == 0 and matched(cache, ARTICLE[:1]).hit_len == 0
    cache.check_invariants()


@pytest.mark.parametrize("page_size", [1, 2, 4])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 9])
def test_match_never_covers_the_last_token(page_size, n):
    cache = make_cache(page_size=page_size, grid=4 * page_size, hybrid=False)
    cold_insert(cache, ARTICLE)
    m = matched(cache, ARTICLE[:n])
    assert m.kv_hit_len <= n - 1 and m.kv_hit_len == ((n - 1) // page_size) * page_size


def test_partial_last_page_is_not_cached():
    cache = make_cache(hybrid=False)
    table, own = own_pages(cache, ARTICLE[:5])
    res = cache.insert(ARTICLE[:5], table)
    assert res.node.depth == 4 and res.adopted == tuple(table[:2]) and res.rejected == ()
    assert cache.stats().cached_tokens == 4
    cache.page_pool.release(own)
    assert cache.page_pool.num_used == 2  # the tree's two full pages


def test_duplicate_insert_rejects_pages_for_the_caller_to_free():
    cache = make_cache(hybrid=False)
    first = cold_insert(cache, ARTICLE[:6])
    table, own = own_pages(cache, ARTICLE[:10])  # computed the same prefix again, cold
    res = cache.insert(ARTICLE[:10], table)
    assert res.rejected == tuple(table[:3]) and res.adopted == tuple(table[3:5])
    assert res.pages == first.pages + tuple(table[3:5])
    cache.page_pool.release(own)  # the request finishes: duplicates are freed, adopted pages stay
    assert cache.page_pool.num_used == 5
    # a request that borrowed the tree's pages passes them back: neither adopted nor rejected
    m = matched(cache, ARTICLE[:12])
    table, own = own_pages(cache, ARTICLE[:12], m.hit_pages)
    res = cache.insert(ARTICLE[:12], table)
    assert res.rejected == () and res.adopted == tuple(own)
    cache.page_pool.release(own)
    cache.check_invariants()


def test_insert_validates_pages_without_changing_anything():
    cache = make_cache()
    with pytest.raises(ValueError):
        cache.insert(ARTICLE[:4], [1])  # short
    with pytest.raises(ValueError):
        cache.insert(ARTICLE[:4], [1, 2])  # free pages
    (p,) = cache.page_pool.alloc(1)
    with pytest.raises(ValueError):
        cache.insert(ARTICLE[:4], [p, p])
    assert cache.stats().nodes == 0 and cache.page_pool.refcount(p) == 1


def test_divergent_inserts_split_and_match_each_branch():
    cache = make_cache(hybrid=False)
    a = cold_insert(cache, [1, 2, 3, 4, 5, 6])
    b = cold_insert(cache, [1, 2, 3, 4, 9, 9, 7, 7])
    assert b.pages[:2] == a.pages[:2] and cache.stats().nodes == 3
    assert matched(cache, [1, 2, 3, 4, 5, 6, 0]).kv_pages == a.pages
    m = matched(cache, [1, 2, 3, 4, 9, 9, 7, 7, 0])
    assert m.kv_pages == b.pages and m.shared_len == 8
    assert matched(cache, [1, 2, 3, 8]).shared_len == 3  # token-granular divergence
    assert matched(cache, [1, 2, 3, 4, 5, 0, 0]).kv_hit_len == 4  # split at the hit
    cache.check_invariants()


def test_hybrid_hit_is_cut_back_to_the_committed_checkpoint():
    cache = make_cache()
    cold_insert(cache, ARTICLE)
    m = matched(cache, ARTICLE)
    assert m.kv_hit_len == 14 and m.hit_len == 0 and m.hit_node is cache.root and m.committed_slot is None
    slot = committed_checkpoint(cache, ARTICLE, 8)
    m = matched(cache, ARTICLE)
    assert (m.kv_hit_len, m.hit_len, m.committed_depth, m.committed_slot) == (14, 8, 8, slot)
    assert m.hit_pages == m.kv_pages[:4] and m.hit_node.depth == 8 and not m.is_consumer


# ---------------------------------------------------------------- checkpoint lifecycle


def _producer_setup(cache):
    """Committed article[:8] with a checkpoint at 8; producer 7 prefills article[8:16] with a
    pending checkpoint at 16 (pending KV for the new span)."""
    slot8 = committed_checkpoint(cache, ARTICLE[:8], 8)
    m = matched(cache, ARTICLE)
    assert m.hit_len == 8
    cache.lock(m.hit_node)
    table, own = own_pages(cache, ARTICLE, m.hit_pages)
    node16, slot16 = plant(cache, ARTICLE, 16, 7, table)
    assert node16 is not None
    return slot8, slot16, node16, m.hit_node, table, own


def test_consumer_sees_pending_and_falls_back_to_committed():
    cache = make_cache()
    slot8, slot16, node16, _, _, _ = _producer_setup(cache)
    m = matched(cache, ARTICLE + [1, 2, 3])  # a question on the same article
    assert m.is_consumer and m.checkpoint_pending and m.producer_id == m.consumer_of == 7
    assert m.pending_kv_len == 16
    assert m.checkpoint_depth == 16 and m.checkpoint_node is node16
    assert (m.committed_depth, m.committed_slot, m.hit_len) == (8, slot8, 8)
    assert m.kv_hit_len == 8  # pending KV is never part of a hit
    with pytest.raises(PendingCheckpointError):
        _ = node16.checkpoint.slot
    assert node16.readable_slot is None
    assert cache.stats().checkpoints_pending == 1 and cache.stats().pending_tokens == 8
    cache.check_invariants()


def test_attention_only_consumer_of_pending_kv():
    cache = make_cache(hybrid=False)
    first = cold_insert(cache, ARTICLE[:4])
    table, own = own_pages(cache, ARTICLE, matched(cache, ARTICLE[:5]).hit_pages)
    node = cache.plant_pending(ARTICLE, 16, None, 7, table)  # publish the KV being written
    assert node is not None and node.kv_pending and node.checkpoint is None
    m = matched(cache, ARTICLE[:12] + [0])  # splits the pending node at 12
    assert m.is_consumer and m.consumer_of == 7 and not m.checkpoint_pending
    assert (m.kv_hit_len, m.pending_kv_len, m.hit_len, m.hit_pages) == (4, 12, 4, first.pages)
    assert cache.commit(7) == 0  # no checkpoint, but the KV becomes readable
    m = matched(cache, ARTICLE[:12] + [0])
    assert not m.is_consumer and m.hit_len == 12 and m.hit_pages == tuple(table[:6])
    cache.page_pool.release(own)
    cache.flush()
    assert_all_free(cache)


def test_commit_makes_the_checkpoint_usable():
    cache = make_cache()
    _, slot16, node16, _, table, _ = _producer_setup(cache)
    assert cache.commit(7) == 1 and cache.commit(7) == 0
    m = matched(cache, ARTICLE + [1])
    assert not m.is_consumer and m.producer_id is None
    assert (m.hit_len, m.committed_slot, m.kv_hit_len, m.kv_pages) == (16, slot16, 16, tuple(table))
    assert node16.checkpoint.slot == slot16 and cache.pending_producers() == ()
    cache.check_invariants()


def test_unpublish_removes_everything_unreadable_and_frees_the_slot():
    cache = make_cache()
    slot8, slot16, node16, locked, table, own = _producer_setup(cache)
    assert cache.unpublish(7) == 1
    assert cache.slot_pool.is_free(slot16) and not node16.attached
    m = matched(cache, ARTICLE + [1])
    assert not m.is_consumer and (m.checkpoint_depth, m.committed_slot, m.hit_len, m.kv_hit_len) == (8, slot8, 8, 8)
    assert all(cache.page_pool.refcount(p) == 1 for p in own)  # only the producer's own reference
    cache.check_invariants()
    cache.page_pool.release(own)
    cache.unlock(locked)
    cache.flush()
    assert_all_free(cache)


def test_commit_up_to_a_depth_and_plant_refusals():
    cache = make_cache()
    table, own = own_pages(cache, ARTICLE)
    n4, s4 = plant(cache, ARTICLE, 4, 3, table)
    n8, s8 = plant(cache, ARTICLE, 8, 3, table)
    assert n4 is not None and n8 is not None and n4.depth == 4
    assert plant(cache, ARTICLE, 8, 3, table)[0] is None  # already holds a checkpoint
    assert plant(cache, ARTICLE + [5], 12, 4, table)[0] is None  # through producer 3's pending KV
    assert cache.slot_pool.num_used == 2  # refused slots went back
    assert cache.commit(3, depth=4) == 1
    m = matched(cache, ARTICLE)
    assert (m.committed_depth, m.checkpoint_depth, m.checkpoint_pending, m.kv_hit_len) == (4, 8, True, 4)
    for bad in (0, 18):  # outside [1, len]; an off-page depth is a tail (test_tails.py)
        with pytest.raises(ValueError):
            cache.plant_pending(ARTICLE, bad, s4, 3, table)
    with pytest.raises(ValueError):
        cache.plant_pending(ARTICLE, 3, None, 3, table)  # KV alone is published in full pages
    with pytest.raises(ValueError):
        cache.plant_pending(ARTICLE, 12, 0, 3, table)  # the reserved slot
    cache.unpublish(3)
    cache.page_pool.release(own)
    cache.flush()
    assert_all_free(cache)


def test_insert_of_written_kv_upgrades_pending_kv():
    cache = make_cache()
    ytable, yown = own_pages(cache, ARTICLE[:8])
    node, _ = plant(cache, ARTICLE[:8], 8, 5, ytable)
    xres = cold_insert(cache, ARTICLE[:10])  # another request computed the same tokens itself
    assert not node.kv_pending and node.pages == list(xres.pages[:4]) and node.checkpoint.pending
    m = matched(cache, ARTICLE[:12])
    assert m.kv_hit_len == 10 and m.is_consumer and m.hit_len == 0
    assert cache.unpublish(5) == 1 and node.attached  # the KV is someone else's now
    cache.page_pool.release(yown)
    cache.flush()
    assert_all_free(cache)


def test_branch_point_checkpoint_from_a_match():
    cache = make_cache()  # page 2, grid 4
    committed_checkpoint(cache, ARTICLE, 16)  # only the article-end checkpoint exists
    other = ARTICLE[:11] + [0] * 5  # leaves the article's path at depth 11
    m = matched(cache, other)
    assert (m.shared_len, m.kv_hit_len, m.hit_len) == (11, 10, 0)
    assert branch_point(m.shared_len, cache.config.grid) == 8
    positions = checkpoint_positions(
        m.hit_len, len(other), grid=4, page_size=2, branch_len=m.shared_len, final_len=len(other)
    )
    assert positions == [4, 8, 12, 16]
    table, own = own_pages(cache, other)
    node, _ = plant(cache, other, 8, 5, table)  # on the shared, committed path: a split, no new KV
    assert node is not None and node.depth == 8 and not node.kv_pending
    third = ARTICLE[:9] + [7, 7, 7]  # shares only the first 9 tokens
    m3 = matched(cache, third)
    assert m3.is_consumer and (m3.checkpoint_depth, m3.consumer_of, m3.hit_len) == (8, 5, 0)
    assert cache.commit(5) == 1 and matched(cache, third).hit_len == 8
    cache.page_pool.release(own)
    cache.flush()
    assert_all_free(cache)
