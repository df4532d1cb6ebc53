"""Tails: exact-depth checkpoints off the page grid (cache/tree.py, docs/design.md "Exact depth").

Pages of 4 tokens here, so a tail holds 1 to 3 tokens and shares the partial page of whoever wrote it.
"""

from __future__ import annotations

import pytest

from tests.cache.helpers import committed_checkpoint, make_cache, matched, own_pages, plant

TURN = list(range(200, 211))  # 11 tokens: pages [200..203] [204..207] and a partial page [208..210]


def _cache(**kw):
    return make_cache(page_size=4, grid=8, **kw)


def _all_free(cache) -> None:
    cache.flush()
    cache.check_invariants()
    assert cache.page_pool.num_used == 0 and cache.slot_pool.num_used == 0


def test_pending_tail_makes_consumers_then_an_exact_hit():
    cache = _cache()
    table, own = own_pages(cache, TURN)
    node, _ = plant(cache, TURN, 11, producer=1, table=table)
    assert node is not None and node.is_tail and node.depth == 11 and node.pages == [table[2]]
    assert node.parent.depth == 8 and node.kv_pending
    cache.check_invariants()
    nxt = TURN + [7, 7, 7]
    m = cache.match(nxt)
    assert m.is_consumer and m.consumer_of == 1 and m.checkpoint_depth == 11 and m.hit_len == 0
    assert cache.commit(1) == 1
    m = cache.match(nxt)
    assert (m.hit_len, m.hit_pages, m.hit_tail_page, m.hit_node) == (11, tuple(table[:2]), table[2], node)
    assert not m.is_consumer
    cache.lock(m.hit_node)
    cache.check_invariants()
    cache.page_pool.release(own)  # the producer leaves: the tail keeps its partial page
    assert cache.page_pool.refcount(table[2]) == 1
    cache.unlock(m.hit_node)
    _all_free(cache)


def test_a_tail_is_used_only_by_sequences_that_continue_it():
    cache = _cache()
    table, own = own_pages(cache, TURN)
    plant(cache, TURN, 11, producer=1, table=table)
    cache.commit(1)
    cache.insert(TURN, table)
    cache.page_pool.release(own)
    assert cache.match(TURN).hit_len == 0  # the same 11 tokens: one must be computed, the tail is too deep
    assert cache.match(TURN[:10] + [1, 2]).hit_len == 0  # leaves inside the partial page
    assert cache.match(TURN + [1]).hit_len == 11
    _all_free(cache)


def test_unpublish_drops_a_pending_tail_and_its_slot():
    cache = _cache()
    table, own = own_pages(cache, TURN)
    plant(cache, TURN, 11, producer=1, table=table)
    plant(cache, TURN, 10, producer=1, table=table)  # two tails sharing one partial page
    cache.check_invariants()
    assert cache.page_pool.refcount(table[2]) == 3
    assert cache.unpublish(1) == 2
    cache.check_invariants()
    cache.page_pool.release(own)
    assert cache.page_pool.num_used == 0 and cache.slot_pool.num_used == 0


@pytest.mark.parametrize("depth", [9, 11, 8])
def test_keep_end_hands_the_finished_state_to_the_tree(depth):
    cache = _cache()
    table, own = own_pages(cache, TURN)
    slot = cache.slot_pool.alloc(1)[0]
    assert cache.keep_end(TURN, depth, slot, table, owner=5)
    assert not cache.keep_end(TURN, depth, slot, table, owner=5)  # already kept: no second reference
    cache.page_pool.release(own)
    cache.slot_pool.decref(slot)  # the request lets go; the tree holds the state now
    cache.check_invariants()
    m = cache.match(TURN[:depth] + [1, 2])
    assert m.hit_len == depth and m.hit_node.checkpoint.committed and m.hit_node.checkpoint.slot == slot
    assert m.hit_node.is_tail == bool(depth % 4)
    assert (m.hit_tail_page is not None) == bool(depth % 4)
    _all_free(cache)


def _finished_turn(cache) -> list[int]:
    """A request computed TURN, finished and kept its exact end (11: a tail); returns its page table."""
    table, own = own_pages(cache, TURN)
    slot = cache.slot_pool.alloc(1)[0]
    assert cache.keep_end(TURN, 11, slot, table, owner=5)
    cache.page_pool.release(own)
    cache.slot_pool.decref(slot)
    return table


def test_evicting_a_tails_state_removes_the_tail():
    cache = _cache()
    table = _finished_turn(cache)
    assert cache.evict_states(1) == 1
    cache.check_invariants()
    assert cache.match(TURN + [1]).hit_len == 0
    assert cache.page_pool.refcount(table[2]) == 0  # the partial page went with the tail
    assert cache.evict_kv(2) == 2
    _all_free(cache)


def test_kv_eviction_takes_a_tail_before_its_parent():
    cache = _cache()
    _finished_turn(cache)
    assert cache.evict_kv(1) == 1  # the tail's page (a leaf) goes first
    cache.check_invariants()
    assert cache.slot_pool.num_used == 0
    _all_free(cache)


def test_attention_only_keeps_a_kv_tail():
    cache = _cache(hybrid=False)
    table, own = own_pages(cache, TURN)
    assert not cache.keep_end(TURN, 11, None, table, owner=5)  # no slot to take
    cache.page_pool.release(own)
    cache.check_invariants()
    m = cache.match(TURN + [3])
    assert (m.hit_len, m.hit_pages, m.hit_tail_page) == (11, tuple(table[:2]), table[2])
    assert cache.match(TURN[:9] + [3, 3]).hit_len == 8  # leaves the tail: the full pages only
    _all_free(cache)


def test_a_hybrid_never_keeps_a_tail_without_its_state():
    cache = _cache()
    table, own = own_pages(cache, TURN)
    assert not cache.keep_end(TURN, 11, None, table, owner=5)
    cache.page_pool.release(own)
    cache.check_invariants()
    assert cache.match(TURN + [3]).hit_len == 0
    _all_free(cache)


def test_state_eviction_drops_a_shadowed_checkpoint_first():
    """A checkpoint with a deeper committed one below it on a plain chain goes before any other,
    even a less recent one: a conversation's end outlives the grid checkpoints above it."""
    cache = _cache()
    other = list(range(300, 311))
    committed_checkpoint(cache, other, 8)  # the least recent, alone on its chain
    committed_checkpoint(cache, TURN, 8)
    _finished_turn(cache)  # its end at 11 lies below TURN's 8, on the same chain
    assert cache.evict_states(1) == 1
    cache.check_invariants()
    assert matched(cache, other + [1]).committed_depth == 8  # kept
    assert cache.match(TURN[:10] + [1, 2]).hit_len == 0  # TURN's 8 went: it was shadowed by 11
    assert cache.match(TURN + [1]).hit_len == 11
    _all_free(cache)


def test_an_end_past_the_prompt_shadows_nothing():
    """A request's end past its prompt (``generated``) does not supersede the checkpoint above it:
    clients resend answers altered, and the prompt's end is where their next turn leaves the chain.
    Here TURN's 8 is its prompt's end and 11 the end of its answer; the least recent checkpoint,
    alone on its chain, goes first (LRU), and TURN's 8 still serves an altered resend."""
    cache = _cache()
    other = list(range(300, 311))
    committed_checkpoint(cache, other, 8)  # the least recent, alone on its chain
    committed_checkpoint(cache, TURN, 8)
    table, own = own_pages(cache, TURN)
    slot = cache.slot_pool.alloc(1)[0]
    assert cache.keep_end(TURN, 11, slot, table, owner=5, generated=True)
    cache.slot_pool.decref(slot)
    cache.page_pool.release(own)
    assert cache.evict_states(1) == 1
    cache.check_invariants()
    assert cache.match(other + [1]).hit_len == 0  # went first: not shadowed, least recent
    assert matched(cache, TURN[:9] + [1, 2]).committed_depth == 8  # the altered resend's hit
    assert cache.match(TURN + [1]).hit_len == 11
    _all_free(cache)
