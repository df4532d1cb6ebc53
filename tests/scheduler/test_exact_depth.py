"""Exact-depth ends through the scheduler, without a model (docs/design.md, "Exact depth"): turn
``k + 1`` of a conversation whose history is cached computes exactly its new tokens plus the last
token turn ``k`` sampled (none of it when a round in flight already fed that token, overlap)."""

from __future__ import annotations

import pytest

from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.request import Request
from radixflow_jax.scheduler.scheduler import Scheduler

STOP = 99


def _sched(hybrid: bool = True, policy: str = "pair") -> Scheduler:
    cfg = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=32, page_size=4, grid=8, hybrid=hybrid, policy=policy
    )
    return Scheduler(cfg, num_pages=64, num_slots=16 if hybrid else 0)


def _run(s: Scheduler, rid: int, answer: list[int]) -> None:
    """Runs request ``rid`` alone without overlap, sampling ``answer`` token by token."""
    while s.has_work():
        plan = s.schedule()
        s.commit(plan, {r.request_id: answer.pop(0) for r in plan.rows if r.sample})


def _first_row(s: Scheduler, req: Request):
    s.add(req)
    plan = s.schedule()
    return next(r for r in plan.rows if r.request_id == req.request_id), plan


@pytest.mark.parametrize("hybrid", [True, False])
def test_the_next_turn_computes_its_new_tokens_plus_one(hybrid: bool) -> None:
    s = _sched(hybrid)
    prompt = tuple(range(10, 23))  # 13 tokens
    s.add(Request(1, prompt, max_tokens=5, stop_token_ids=frozenset({STOP})))
    _run(s, 1, [5, 6, STOP])
    assert s.requests[1].state_depth == 15  # prompt + 5, 6 fed; the stop token was sampled, never fed
    history = prompt + (5, 6, STOP)
    row, plan = _first_row(s, Request(2, history + (1, 2, 3), max_tokens=1))
    assert row.start == 15 and row.copy_page_from is not None  # 15 % 4: a tail's partial page
    assert row.tokens == (STOP, 1, 2, 3)  # the last sampled token and the new message, no more
    assert s.requests[2].cached_tokens == 15
    s.commit(plan, {2: 0})
    _run(s, 2, [0])
    if not hybrid:
        return  # attention-only caches KV as it is computed: request 2's full pages reach 16 now
    row, plan = _first_row(s, Request(3, history + tuple(range(40, 80)), max_tokens=1))
    assert (row.start, row.start + len(row.tokens)) == (15, 40)  # cut by the budget on the grid
    s.commit(plan, {})
    _run(s, 3, [0])


def test_a_kept_end_leaves_the_request_band_by_a_state_copy() -> None:
    s = _sched()  # max_num_seqs 4: the request band is slots 1-4 of 15
    prompt = tuple(range(10, 23))
    s.add(Request(1, prompt, max_tokens=5, stop_token_ids=frozenset({STOP})))
    _run(s, 1, [5, 6, STOP])
    ((kind, src, dst),) = s.memory.cache.queued_moves  # the end moved above the band; its copy waits for a plan
    assert kind == "copy"
    assert src <= 4 < dst and s.memory.slots.refcount(dst) == 1 and s.memory.slots.is_free(src)
    row, plan = _first_row(s, Request(2, prompt + (5, 6, STOP, 1, 2), max_tokens=1))
    assert plan.state_moves == (("copy", src, dst),) and not s.memory.cache.queued_moves  # copied before this step
    assert row.copy_from == dst and row.slot == src and row.start == 15


def test_a_kept_end_stays_where_no_slot_above_the_band_is_left() -> None:
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, page_size=4, grid=8, hybrid=True, policy="pair")
    s = Scheduler(cfg, num_pages=64, num_slots=5)  # four slots: all of them the band
    prompt = tuple(range(10, 23))
    s.add(Request(1, prompt, max_tokens=5, stop_token_ids=frozenset({STOP})))
    _run(s, 1, [5, 6, STOP])
    assert not s.memory.cache.queued_moves
    row, plan = _first_row(s, Request(2, prompt + (5, 6, STOP, 1, 2), max_tokens=1))
    assert not plan.state_moves and row.copy_from is not None and row.start == 15


def test_a_round_in_flight_that_fed_the_stop_token_ends_the_state_after_it() -> None:
    s = _sched()
    prompt = tuple(range(10, 23))
    s.add(Request(1, prompt, max_tokens=8, stop_token_ids=frozenset({STOP})))
    plans = [s.schedule()]
    s.launch(plans[0])
    for token in (5, 6, STOP):  # overlap: plan and launch the next round before committing this one
        plans.append(s.schedule())
        s.launch(plans[-1])
        s.commit(plans.pop(0), {1: token})
    assert s.requests[1].is_finished and s.num_in_flight == 1  # the round feeding STOP is in flight
    assert s.requests[1].state_depth == 16  # prompt + 5, 6, STOP: that round fed it
    s.commit(plans.pop(0), {1: 7})  # its sample is discarded; the request is released now
    row, _ = _first_row(s, Request(2, prompt + (5, 6, STOP, 1, 2), max_tokens=1))
    assert (row.start, row.tokens) == (16, (1, 2))  # only the new message
