"""Riders without a model (``scheduler/riders.py``): a request whose prompt equals a running
request's rides the round that completes it (a row of no tokens, the producer's end state emitted
into its slot, its own copy of the partial last page), waits for that round under the policies whose
consumers wait, and goes back to the queue with a producer that leaves before the commit fence."""

from __future__ import annotations

import pytest

from radixflow_jax.scheduler.builder import RoundBuilder
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.request import Request, RequestStatus
from radixflow_jax.scheduler.scheduler import Scheduler

PROMPT = tuple(range(100, 122))  # 22 tokens: grid 8, page 4, a partial last page of 2 tokens


def _scheduler(policy: str = "radixflow", budget: int = 64, hybrid: bool = True, riders: bool = True) -> Scheduler:
    cfg = SchedulerConfig(
        max_num_seqs=4,
        max_num_batched_tokens=budget,
        page_size=4,
        grid=8,
        hybrid=hybrid,
        policy=policy,
        riders=riders,
    )
    return Scheduler(cfg, num_pages=64, num_slots=24)


def _commit(s: Scheduler, plan, token: int = 7) -> None:
    s.commit(plan, {r.request_id: token for r in plan.rows if r.sample})
    s.memory.cache.check_invariants()


def _drain(s: Scheduler) -> None:
    while s.has_work():
        _commit(s, s.schedule())
    s.memory.flush()
    assert s.memory.pages.num_free == s.memory.pages.capacity  # nothing leaked


@pytest.mark.parametrize("hybrid", [True, False])
def test_a_twin_rides_the_round_that_completes_the_prompt(hybrid: bool) -> None:
    s = _scheduler(hybrid=hybrid)
    for rid in range(3):
        s.add(Request(rid, PROMPT, 3))
    plan = s.schedule()
    producer, *riders = plan.rows
    assert producer.request_id == 0 and producer.tokens == PROMPT and producer.sample
    assert [r.request_id for r in riders] == [1, 2] and plan.stats.riders == 2
    p = s.requests[0]
    for row in riders:
        req = s.requests[row.request_id]
        assert row.twin_id == 0 and row.tokens == () and row.start == len(PROMPT) and row.sample and row.slot == 0
        assert req.num_computed == req.cached_tokens == len(PROMPT)
        assert req.pages[:5] == p.pages[:5] and req.pages[5] != p.pages[5]  # full pages shared, the partial one its own
        assert (p.pages[5], req.pages[5]) in plan.page_copies
        if hybrid:  # the producer's end state goes into the rider's own slot
            assert (len(PROMPT), req.slot) in producer.emits and req.slot not in (0, p.slot)
    assert len(plan.page_copies) == 2
    assert plan.stats.checkpoints_planted == len(producer.emits) - (2 if hybrid else 0)
    _commit(s, plan)
    assert [s.requests[i].output for i in range(3)] == [[7]] * 3
    nxt = s.schedule()  # from now on riders are ordinary running requests: one token each
    rows = sorted((r.request_id, r.start, len(r.tokens), r.twin_id) for r in nxt.rows)
    assert rows == [(0, 22, 1, None), (1, 22, 1, None), (2, 22, 1, None)]
    _commit(s, nxt)
    _drain(s)


def test_a_page_aligned_prompt_needs_no_page_copy() -> None:
    s = _scheduler()
    for rid in range(2):
        s.add(Request(rid, PROMPT[:20], 2))
    plan = s.schedule()
    assert [r.twin_id for r in plan.rows] == [None, 0] and plan.page_copies == ()
    _commit(s, plan)
    _drain(s)


@pytest.mark.parametrize("policy", ["radixflow", "pair"])
def test_a_twin_waits_for_the_round_that_completes_the_prompt(policy: str) -> None:
    s = _scheduler(policy, budget=20)  # the prompt takes two rounds (16 + 6 tokens)
    s.add(Request(0, PROMPT, 2))
    s.add(Request(1, PROMPT, 2))
    s.add(Request(2, (5, 6, 7), 2))  # independent work keeps filling the round
    first = s.schedule()
    assert [r.request_id for r in first.rows] == [0, 2] and first.stats.riders_waiting == 1
    assert first.stats.consumers_paired == 0  # it does not pair at a grid checkpoint either
    _commit(s, first)
    second = s.schedule()
    assert [(r.request_id, r.twin_id) for r in second.rows if r.request_id != 2] == [(0, None), (1, 0)]
    _commit(s, second)
    assert s.requests[1].cached_tokens == len(PROMPT)
    _drain(s)


def test_native_keeps_its_stop_and_riders_can_be_turned_off() -> None:
    s = _scheduler("native", budget=16)
    for rid in range(2):
        s.add(Request(rid, PROMPT, 2))
    first = s.schedule()
    assert [r.request_id for r in first.rows] == [0] and first.stats.consumers_blocked == 1
    _commit(s, first)
    assert [r.twin_id for r in s.schedule().rows] == [None, 0]
    off = _scheduler(riders=False)
    for rid in range(2):
        off.add(Request(rid, PROMPT, 2))
    plan = off.schedule()
    assert all(r.twin_id is None for r in plan.rows) and not plan.page_copies and plan.stats.riders == 0


def test_a_producer_that_leaves_before_the_commit_takes_its_riders_back() -> None:
    s = _scheduler()
    for rid in range(2):
        s.add(Request(rid, PROMPT, 3))
    plan = s.schedule()
    s.launch(plan)  # overlap: the round is in flight
    s.abort(0)
    rider = s.requests[1]
    assert rider.status is RequestStatus.WAITING and rider.num_rollbacks == 1 and rider.num_computed == 0
    assert rider.pages == [] and rider.slot is None
    _commit(s, plan)  # its stale row is skipped
    assert rider.output == []
    _drain(s)
    assert rider.output == [7, 7, 7] and s.requests[0].finish_reason == "abort"


def test_a_rider_preempted_while_planning_takes_its_emit_and_copy_along() -> None:
    s = _scheduler()
    for rid in range(2):
        s.add(Request(rid, PROMPT, 3))
    round_ = RoundBuilder(s.config, s.memory, s.waiting)
    s._running.plan_before_admission(round_)
    s._admit(round_)
    producer, rider = s.requests[0], s.requests[1]
    assert [r.twin_id for r in round_.rows] == [None, 0]
    rider_slot = rider.slot
    assert (len(PROMPT), rider_slot) in round_.rows[0].emits
    s._running.preempt(rider)  # what a prefill-first round's decode rows may do
    round_.stats.preempted += 1
    plan = round_.build(admitted=1)
    assert [r.request_id for r in plan.rows] == [0] and plan.page_copies == ()
    assert (len(PROMPT), rider_slot) not in plan.rows[0].emits  # no write into a slot it gave back
    assert len(plan.rows[0].emits) == plan.stats.checkpoints_planted
    assert producer.status is RequestStatus.RUNNING
    # it is nobody's rider now: the producer's later departure leaves it alone
    assert s._riders.by_producer.as_dict() == {}
    _commit(s, plan)
    _drain(s)
    assert rider.num_rollbacks == 0 and rider.output == [7, 7, 7]
