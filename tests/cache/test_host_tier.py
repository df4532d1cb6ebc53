"""The host tier (cache/tiers.py): demotion under slot pressure, restores as pending checkpoints,
their commit and their void rounds, host-pool eviction, and that nothing leaks."""

from __future__ import annotations

import pytest

from radixflow_jax.cache import PendingCheckpointError, StateMove
from tests.cache.helpers import committed_checkpoint, make_cache, own_pages

A = list(range(100, 112))  # 12 tokens: pages of 2, grid 4
B = list(range(200, 212))


def _cache(**kw):
    kw.setdefault("num_slots", 3)  # two checkpoint slots
    return make_cache(host_slots=kw.pop("host_slots", 4), **kw)


def _all_free(cache) -> None:
    cache.flush()
    cache.check_invariants()
    assert cache.page_pool.num_used == 0 and cache.slot_pool.num_used == 0
    assert cache.host_pool is None or cache.host_pool.num_used == 0


def _demoted(cache):
    """A's checkpoint at depth 8, demoted (its spill taken); returns its node and host slot."""
    committed_checkpoint(cache, A, 8)
    cache.evict_states(1)
    ((_, _, host_slot),), _ = cache.take_moves()
    return cache.match(A + [1]).host_node, host_slot


def _restoring(cache, node):
    """Starts restoring ``node`` into a fresh slot (the tree keeps the only reference)."""
    slot = cache.slot_pool.alloc(1)[0]
    rid = cache.restore(node, slot)
    cache.slot_pool.decref(slot)
    return rid, slot


def test_eviction_demotes_and_queues_the_spill():
    cache = _cache()
    slot = committed_checkpoint(cache, A, 8)
    node = cache.match(A + [1]).hit_node
    assert node.depth == 8 and node.checkpoint.committed
    assert cache.evict_states(1) == 1
    ckpt = node.checkpoint
    assert ckpt is not None and ckpt.on_host and not ckpt.committed and not ckpt.pending
    assert cache.slot_pool.is_free(slot) and cache.take_moves() == (((StateMove("spill", slot, ckpt.host_slot),), ()))
    assert cache.take_moves() == ((), ())
    with pytest.raises(PendingCheckpointError):
        _ = ckpt.slot
    m = cache.match(A + [1])
    assert m.hit_len == 0 and m.host_node is node and not m.is_consumer and m.checkpoint_node is None
    assert cache.stats().checkpoints_host == 1 and cache.demoted == 1
    cache.check_invariants()
    _all_free(cache)


def test_a_restore_is_a_pending_checkpoint_until_its_commit():
    cache = _cache()
    node, host_slot = _demoted(cache)
    rid, slot = _restoring(cache, node)
    assert rid < 0 and cache.restores_queued
    assert cache.take_moves() == ((StateMove("restore", host_slot, slot),), (rid,))
    m2 = cache.match(A + [1])
    assert m2.is_consumer and m2.consumer_of == rid and m2.checkpoint_pending and m2.hit_len == 0
    assert m2.host_node is None
    cache.check_invariants()
    assert cache.commit(rid) == 1
    m3 = cache.match(A + [1])
    assert m3.hit_len == 8 and not m3.is_consumer and m3.hit_node.checkpoint.slot == slot
    assert cache.host_pool.num_used == 0 and cache.restored == 1
    cache.check_invariants()
    _all_free(cache)


def test_a_void_restore_goes_back_to_the_host():
    cache = _cache()
    node, _ = _demoted(cache)
    rid, slot = _restoring(cache, node)
    assert cache.unpublish(rid) == 0
    assert node.checkpoint.on_host and cache.slot_pool.is_free(slot)
    assert cache.match(A + [1]).host_node is node
    cache.check_invariants()
    _all_free(cache)


def test_a_full_host_pool_drops_its_least_recent_checkpoint():
    cache = _cache(host_slots=1)
    committed_checkpoint(cache, A, 8, producer=1)
    committed_checkpoint(cache, B, 8, producer=2)
    a = cache.match(A + [1]).hit_node
    b = cache.match(B + [1]).hit_node
    cache.evict_states(1)  # a is the older: it goes to the host
    assert a.checkpoint.on_host and b.checkpoint.committed
    cache.evict_states(1)  # b needs the host slot: a is dropped
    assert a.checkpoint is None and b.checkpoint.on_host and cache.host_dropped == 1
    assert [m.kind for m in cache.take_moves()[0]] == ["spill", "spill"]
    cache.check_invariants()
    _all_free(cache)


def test_a_host_read_queues_a_copy_and_its_locked_node_keeps_the_host_checkpoint():
    cache = _cache(host_slots=1)
    node, host_slot = _demoted(cache)
    m = cache.match(A + [1])
    assert node is not None and m.host_pages == m.hit_pages + tuple(node.pages) and m.host_tail_page is None
    cache.lock(node)  # the request that reads it (Allocator.seat)
    slot = cache.slot_pool.alloc(1)[0]
    cache.read_host(node, slot)
    assert cache.take_moves() == ((StateMove("restore", host_slot, slot),), ())  # no restore id: nothing pending
    assert node.checkpoint.on_host and cache.restored == 1 and not cache.has_pending
    committed_checkpoint(cache, B, 8, producer=2)
    assert cache.evict_states(1) == 1  # the host pool is full and its only checkpoint is locked: B is dropped
    assert node.checkpoint.on_host and cache.match(B + [1]).hit_len == 0
    cache.flush()  # a locked node keeps its host checkpoint through a flush too
    assert node.checkpoint.on_host
    cache.check_invariants()
    cache.unlock(node)
    cache.slot_pool.decref(slot)
    with pytest.raises(ValueError, match="host checkpoint"):
        cache.read_host(cache.root, slot)
    _all_free(cache)


def test_kv_eviction_takes_a_host_checkpoint_with_its_node():
    cache = _cache()
    committed_checkpoint(cache, A, 12 - 4)
    cache.evict_states(1)
    assert cache.host_pool.num_used == 1
    cache.evict_kv(cache.page_pool.capacity)
    assert cache.host_pool.num_used == 0 and cache.stats().nodes == 0
    _all_free(cache)


def test_keep_end_replaces_a_host_copy_of_the_same_state():
    cache = _cache()
    node, _ = _demoted(cache)
    table, own = own_pages(cache, A)
    slot = cache.slot_pool.alloc(1)[0]
    assert cache.keep_end(A, 8, slot, table, owner=5)
    cache.slot_pool.decref(slot)
    cache.page_pool.release(own)
    assert node.checkpoint.committed and node.checkpoint.slot == slot and cache.host_pool.num_used == 0
    cache.check_invariants()
    _all_free(cache)


def test_without_a_host_tier_eviction_drops():
    cache = make_cache(num_slots=3)
    committed_checkpoint(cache, A, 8)
    cache.evict_states(1)
    assert cache.match(A + [1]).host_node is None and cache.take_moves() == ((), ())
    _all_free(cache)


def test_host_tail_checkpoints_are_restored_at_exact_depth():
    cache = make_cache(page_size=4, grid=8, num_slots=3, host_slots=2)
    turn = list(range(300, 311))  # 11 tokens: a tail at 11
    table, own = own_pages(cache, turn)
    slot = cache.slot_pool.alloc(1)[0]
    assert cache.keep_end(turn, 11, slot, table, owner=1)
    cache.slot_pool.decref(slot)
    cache.page_pool.release(own)
    cache.evict_states(1)
    m = cache.match(turn + [5])
    assert m.host_node is not None and m.host_node.is_tail and m.host_node.depth == 11 and m.hit_len == 0
    assert m.host_tail_page == table[2] and m.host_pages == tuple(table[:2])
    cache.commit(_restoring(cache, m.host_node)[0])
    m = cache.match(turn + [5])
    assert m.hit_len == 11 and m.hit_tail_page == table[2]
    cache.check_invariants()
    _all_free(cache)


def test_flush_reverts_restores_and_frees_the_host_tier():
    cache = _cache()
    committed_checkpoint(cache, A, 8, producer=1)
    committed_checkpoint(cache, B, 8, producer=2)
    cache.evict_states(2)
    _restoring(cache, cache.match(A + [1]).host_node)
    _all_free(cache)
    assert cache.take_moves() == ((), ())
