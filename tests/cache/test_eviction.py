"""Unit tests of locks, eviction (LRU and FLOP-aware), flush and stats of the radix prefix cache."""

from __future__ import annotations

import pytest

from radixflow_jax.cache import FlopAwarePolicy
from tests.cache.helpers import cold_insert, committed_checkpoint, make_cache, matched, own_pages, plant

ARTICLE = list(range(100, 116))  # 16 tokens = 8 pages of 2


def assert_all_free(cache):
    cache.check_invariants()
    assert cache.page_pool.num_used == 0 and cache.slot_pool.num_used == 0


# ---------------------------------------------------------------- locks, eviction, flush


def test_lock_unlock_rules():
    cache = make_cache(hybrid=False)
    res = cold_insert(cache, ARTICLE[:8])
    cache.lock(res.node)
    cache.lock(res.node)
    assert res.node.lock_count == 2 and cache.root.lock_count == 2
    matched(cache, ARTICLE[:4] + [0])  # splits the locked node: the upper part inherits the locks
    assert res.node.parent.lock_count == 2
    cache.unlock(res.node)
    cache.unlock(res.node)
    with pytest.raises(ValueError):
        cache.unlock(res.node)
    table, own = own_pages(cache, ARTICLE[:12], res.pages)
    pending, _ = plant(cache, ARTICLE[:12], 12, 1, table)
    with pytest.raises(ValueError):
        cache.lock(pending)
    cache.unpublish(1)
    with pytest.raises(ValueError):
        cache.lock(pending)  # left the tree
    cache.page_pool.release(own)
    cache.check_invariants()


def test_evict_kv_is_lru_and_spares_locked_and_pending():
    cache = make_cache(hybrid=False, num_pages=16)
    a = cold_insert(cache, [1, 1, 1, 1])
    b = cold_insert(cache, [2, 2, 2, 2])
    c = cold_insert(cache, [3, 3, 3, 3])
    matched(cache, [1, 1, 1, 1, 0])  # a becomes most recent; b is the LRU leaf
    assert cache.evict_kv(1) == 2 and not b.node.attached and a.node.attached and c.node.attached
    cache.lock(c.node)
    table, own = own_pages(cache, [4, 4, 4, 4])
    pend, _ = plant(cache, [4, 4, 4, 4], 4, 9, table)
    assert cache.evict_kv(100) == 2  # only a could go
    assert c.node.attached and pend.attached and pend.checkpoint.pending
    cache.unlock(c.node)
    cache.unpublish(9)
    cache.page_pool.release(own)
    assert cache.evict_kv(100) == 2
    assert_all_free(cache)


def test_evict_kv_leaves_a_node_whose_pages_a_request_still_holds():
    """Evicting it would free no page: the node and its checkpoint stay (before, both were
    dropped for nothing); once the request lets go, it is evicted with its checkpoint."""
    cache = make_cache()
    slot = committed_checkpoint(cache, ARTICLE[:4], 4)
    m = matched(cache, ARTICLE[:6])
    shared = m.hit_pages
    for p in shared:
        cache.page_pool.incref(p)  # a running request still reads these pages
    assert cache.evict_kv(2) == 0 and not cache.slot_pool.is_free(slot)
    assert cache.stats().nodes == 1 and matched(cache, ARTICLE[:6]).hit_len == 4
    cache.page_pool.release(shared)
    assert cache.evict_kv(2) == 2 and cache.slot_pool.is_free(slot)
    assert_all_free(cache)


def test_evict_states_keeps_kv_and_spares_locked_and_pending():
    cache = make_cache()
    s_a = committed_checkpoint(cache, [1] * 4, 4)
    s_b = committed_checkpoint(cache, [2] * 4, 4)
    s_c = committed_checkpoint(cache, [3] * 4, 4)
    matched(cache, [1] * 5)
    assert cache.evict_states(1) == 1 and cache.slot_pool.is_free(s_b)
    m = matched(cache, [2] * 5)
    assert m.kv_hit_len == 4 and m.hit_len == 0  # KV stays, the usable hybrid hit is gone
    locked = matched(cache, [3] * 5).hit_node
    cache.lock(locked)
    table, own = own_pages(cache, [4] * 4)
    pend, _ = plant(cache, [4] * 4, 4, 9, table)
    assert cache.evict_states(10) == 1 and cache.slot_pool.is_free(s_a)
    assert locked.readable_slot == s_c and pend.checkpoint.pending
    cache.unlock(locked)
    cache.unpublish(9)
    cache.page_pool.release(own)
    cache.flush()
    assert_all_free(cache)


def test_flush_keeps_locked_and_pending_then_empties():
    cache = make_cache()
    committed_checkpoint(cache, ARTICLE[:8], 8)
    cold_insert(cache, [7] * 6)
    node = matched(cache, ARTICLE[:9]).hit_node
    cache.lock(node)
    table, own = own_pages(cache, [5] * 4)
    plant(cache, [5] * 4, 4, 2, table)
    cache.flush()
    st = cache.stats()
    assert (st.nodes, st.checkpoints_committed, st.checkpoints_pending, st.locked_nodes) == (2, 1, 1, 1)
    cache.unlock(node)
    cache.commit(2)
    cache.page_pool.release(own)
    cache.flush()
    assert cache.stats().nodes == 0
    assert_all_free(cache)


def test_flop_aware_policy_keeps_expensive_entries():
    # flops grow quadratically with depth: the deep entry saves more per byte than the LRU order says
    policy = FlopAwarePolicy(flops=lambda a, b: float(b * b - a * a), page_bytes=1.0, state_bytes=1.0, alpha=10.0)
    cache = make_cache(policy=policy, num_pages=64)
    deep = cold_insert(cache, list(range(200, 216)))
    shallow = cold_insert(cache, [1, 1])
    assert cache.evict_kv(1) == 1 and deep.node.attached and not shallow.node.attached
    lru = make_cache(num_pages=64)
    deep = cold_insert(lru, list(range(200, 216)))
    cold_insert(lru, [1, 1])
    assert lru.evict_kv(1) == 8 and not deep.node.attached
    s_deep = committed_checkpoint(cache, list(range(300, 316)), 16)
    s_shallow = committed_checkpoint(cache, [2, 2], 2)
    assert cache.evict_states(1) == 1 and cache.slot_pool.is_free(s_shallow) and not cache.slot_pool.is_free(s_deep)


def test_stats_counts():
    cache = make_cache()
    committed_checkpoint(cache, ARTICLE[:8], 8)
    table, own = own_pages(cache, ARTICLE[:12], matched(cache, ARTICLE[:9]).hit_pages)
    plant(cache, ARTICLE[:12], 12, 4, table)
    st = cache.stats()
    assert (st.nodes, st.cached_tokens, st.pending_tokens, st.pages_held) == (2, 8, 4, 6)
    assert (st.checkpoints_pending, st.checkpoints_committed, st.producers) == (1, 1, 1)
