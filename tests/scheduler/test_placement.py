"""Checkpoint placement through the scheduler: branch points (look-ahead and existing paths),
exact prompt and request ends, and slot-aware planting under a full state pool."""

from __future__ import annotations

from radixflow_jax.cache.placement import Placement
from radixflow_jax.scheduler.request import Request
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.scheduler import Scheduler

ARTICLE = tuple(range(100, 137))  # 37 shared tokens: branch point floor(37 / 8) * 8 = 32


def _sched(num_slots: int = 32, max_num_seqs: int = 4, **kw) -> Scheduler:
    cfg = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=64,
        page_size=4,
        grid=8,
        hybrid=True,
        **{"checkpoint_interval": 64, "policy": "radixflow", **kw},
    )
    return Scheduler(cfg, num_pages=64, num_slots=num_slots)


def _depths(plan, rid: int) -> list[int]:
    row = next(r for r in plan.rows if r.request_id == rid)
    return [row.start + off for off, _ in row.emits]


def _finish(s: Scheduler) -> None:
    while s.has_work():
        plan = s.schedule()
        assert plan.rows
        s.commit(plan, {r.request_id: 0 for r in plan.rows if r.sample})


def test_lookahead_plants_the_branch_point_for_waiting_siblings() -> None:
    s = _sched(max_num_seqs=1)  # one row: the siblings stay waiting while the producer runs
    s.add(Request(1, ARTICLE + (1, 2, 3, 4, 5), max_tokens=1))
    s.add(Request(2, ARTICLE + (6, 7, 8), max_tokens=1))
    s.add(Request(3, ARTICLE[:20] + (9,) * 10, max_tokens=1))  # leaves earlier: branch at 16
    plan = s.schedule()
    # prompt end 42 (exact: the span ends it), look-ahead branch points 32 and 16; no grid positions
    assert sorted(_depths(plan, 1)) == [16, 32, 42]
    assert plan.stats.checkpoints_planted == 3 and plan.stats.checkpoints_skipped == 0
    s.commit(plan, {1: 0})
    nxt = s.schedule()
    assert nxt.rows[0].request_id == 2 and nxt.rows[0].start == 32 and s.requests[2].cached_tokens == 32
    _finish(s)
    assert s.requests[3].cached_tokens == 16


def test_lookahead_off_plants_only_grid_and_prompt_end() -> None:
    s = _sched(max_num_seqs=1, branch_checkpoints=False)
    s.add(Request(1, ARTICLE + (1, 2, 3, 4, 5), max_tokens=1))
    s.add(Request(2, ARTICLE + (6, 7, 8), max_tokens=1))
    assert _depths(s.schedule(), 1) == [42]


def test_branch_point_where_a_path_leaves_an_existing_one() -> None:
    s = _sched()
    s.add(Request(1, ARTICLE + (1, 2, 3, 4, 5), max_tokens=1))
    _finish(s)  # the cache now holds the article's KV and checkpoints at 40 (prompt end) only
    s.add(Request(2, ARTICLE[:29] + (7,) * 12, max_tokens=1))  # leaves the cached path at 29
    plan = s.schedule()
    assert s.requests[2].cached_tokens == 0  # no checkpoint on the shared part yet
    assert 24 in _depths(plan, 2)  # branch point floor(29 / 8) * 8
    s.commit(plan, {2: 0})
    _finish(s)
    s.add(Request(3, ARTICLE[:29] + (8,) * 5, max_tokens=1))
    _finish(s)
    assert s.requests[3].cached_tokens == 24


def test_exact_ends_for_the_next_turn() -> None:
    s = _sched()
    prompt = tuple(range(1, 31))  # 30 tokens: prompt end at 30 exactly (a tail: page 4)
    s.add(Request(1, prompt, max_tokens=12))
    planted = []
    while s.has_work():
        plan = s.schedule()
        planted += _depths(plan, 1)
        s.commit(plan, {1: 5})
    assert planted == [30]  # no grid position (every 64); the request's end is not emitted
    # its end: the state after 30 + 12 - 1 = 41 tokens (the last sampled token was never fed) is kept
    # in its own slot, handed to the tree when it finished
    turn2 = prompt + (5,) * 12 + (9, 9, 9)
    s.add(Request(2, turn2, max_tokens=1))
    plan = s.schedule()
    row = plan.rows[0]
    assert (row.start, len(row.tokens)) == (41, 4)  # the last sampled token and the 3 new ones
    assert row.copy_page_from is not None and row.copy_from is not None
    assert s.requests[2].cached_tokens == 41
    s.commit(plan, {2: 0})
    _finish(s)


def test_full_state_pool_keeps_the_deep_checkpoint() -> None:
    # slot 0 reserved, slot 1 the producer's own state, slot 2 the only one left for checkpoints;
    # a sibling is waiting, so the look-ahead branch point must be the one planted
    s = _sched(num_slots=3, max_num_seqs=1, checkpoint_interval=8)
    s.add(Request(1, ARTICLE + (1, 2, 3, 4, 5), max_tokens=1))
    s.add(Request(2, ARTICLE + (6, 7, 8), max_tokens=1))
    plan = s.schedule()
    assert _depths(plan, 1) == [32]  # not 8, the first grid position (the old shallow-first order)
    assert plan.stats.checkpoints_planted == 1 and plan.stats.checkpoints_skipped == 5  # 8, 16, 24, 40, 42
    s.commit(plan, {1: 0})
    _finish(s)
    assert s.requests[2].cached_tokens == 32


def test_planting_evicts_committed_never_pending_or_locked() -> None:
    s = _sched(num_slots=4, max_num_seqs=2, checkpoint_interval=8)
    s.add(Request(1, tuple(range(500, 517)), max_tokens=1))  # plants 17 (prompt end), 16; 8 skipped
    _finish(s)
    cache = s.memory.cache
    assert cache.stats().checkpoints_committed == 2
    # request 2 takes a slot of its own: 3 slots left minus the 2 committed ones = 1 free; its
    # deepest placements take it and then evict the committed (unread) ones
    s.add(Request(2, tuple(range(700, 733)), max_tokens=1))
    plan = s.schedule()
    assert _depths(plan, 2) == [32, 33]  # deepest first (33: the prompt end), the rest (8, 16, 24) skipped
    assert plan.stats.checkpoints_skipped == 3 and plan.stats.checkpoints_evicted_unused == 2
    assert cache.stats().checkpoints_pending == 2  # the pending ones are never evicted
    s.commit(plan, {2: 0})
    _finish(s)


def test_memory_plant_order_and_skip_count() -> None:
    s = _sched(num_slots=3)  # after the request's own slot: one free slot
    req = Request(9, tuple(range(40)), max_tokens=1)
    s.add(req)
    plan = s.schedule()
    assert len(plan.rows) == 1
    mem = s.memory
    mem.release(req, keep_prefix=False)  # drop everything request 9 planted and held
    req.slot = mem.alloc_slot()
    req.pages = mem.alloc_pages(10)
    req.own_pages = list(req.pages)
    planted, skipped = mem.plant(req, [Placement(32, "lookahead"), Placement(8, "grid"), Placement(16, "grid")])
    assert [d for d, _ in planted] == [32] and skipped == 2
    mem.release(req, keep_prefix=False)
