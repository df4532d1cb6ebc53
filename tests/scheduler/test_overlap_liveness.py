"""Livelocks under overlap in tiny page pools.

The first, found by a scheduler fuzz in review (2026-12-01) and
present since before that day's scheduler changes (reproduced at ``6f83c45``).

Grid 8, page 4, 22 pages, 3 state slots, budget 16, 4 rows, policy radixflow, overlap (each plan
is launched before the previous one commits). Three requests: ``A`` (52 tokens, 40 of them a
prefix that ``C`` shares 32 of) arrives in round 10, ``B`` (3 tokens) and ``C`` (42 tokens) in round
11. After ``B`` and ``C`` finish, ``A`` runs alone. It computed 0 -> 48 and could not get the pages
for its next span: 8 pages stayed held by ``C``'s prefix in the tree, pinned by ``A``'s own pending
checkpoint (its round in flight) below it. So it preempted itself and started again at 0, forever
(126 preemptions in 400 rounds), and with 3 slots no committed checkpoint survived to resume from.
Now a request that finds no victim while a round of its own is in flight waits for that round's
commit instead of preempting itself: its KV and checkpoint then commit, and the next plan either
fits or preempts it with a committed hit to resume from.

The second (``test_two_requests_do_not_preempt_each_other_forever``), found by the fuzz of review
seed 28 and reduced on 2026-12-01 (present since before that day): two requests of 11 pages each in
a 16-page pool. One of them sampled its last token in the round in flight; the other, short of pages,
preempted it as its victim (it had no row: it needs none) instead of waiting one commit for its
pages, and each restart replayed the case with the roles swapped. A request whose last token is in
flight is no victim, and a request short of pages waits while a commit in flight can free some.
"""

from __future__ import annotations

import pytest

from radixflow_jax.scheduler.request import Request
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.scheduler import Scheduler

PREFIX = tuple(range(3000, 3040))
A = PREFIX + (54, 18, 14, 37, 58, 59, 19, 57, 41, 33, 43, 14)
B = (40, 14, 55)
C = PREFIX[:32] + (49, 35, 22, 46, 12, 37, 8, 49, 12, 35)


def _run_overlapped(s: Scheduler, arrivals: dict[int, list[Request]], rounds: int) -> None:
    """Each plan launched before the previous one commits; every sampled token is 7."""
    in_flight = None
    last = max(arrivals)
    for rnd in range(rounds):
        for req in arrivals.get(rnd, ()):
            s.add(req)
        if in_flight is not None and s.plants_on_unknown():
            s.commit(in_flight, {r.request_id: 7 for r in in_flight.rows if r.sample})
            in_flight = None
        if rnd > last and not s.has_work() and in_flight is None:
            return
        plan = s.schedule()
        if plan.rows:
            s.launch(plan)
        if in_flight is not None:
            s.commit(in_flight, {r.request_id: 7 for r in in_flight.rows if r.sample})
        in_flight = plan if plan.rows else None


def test_a_lone_request_under_overlap_finishes_in_a_tiny_pool() -> None:
    cfg = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=16, page_size=4, grid=8, hybrid=True, policy="radixflow"
    )
    s = Scheduler(cfg, num_pages=22, num_slots=3)
    _run_overlapped(s, {10: [Request(0, A, 9)], 11: [Request(1, B, 2), Request(2, C, 2)]}, 400)
    assert not s.has_work(), f"livelock: {[(r.request_id, r.num_computed, r.num_preemptions) for r in s.running]}"
    assert all(len(s.requests[i].output) == s.requests[i].max_tokens for i in range(3))


@pytest.mark.parametrize("policy", ["native", "radixflow", "pair"])
@pytest.mark.parametrize("first", [0, 1])
def test_two_requests_do_not_preempt_each_other_forever(policy: str, first: int) -> None:
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, page_size=4, grid=8, hybrid=True, policy=policy)
    s = Scheduler(cfg, num_pages=16, num_slots=3)
    x = Request(0, tuple(range(100, 140)), 6)  # 46 tokens: 12 pages at the end
    y = Request(1, tuple(range(200, 244)), 3)  # 47 tokens: 12 pages
    _run_overlapped(s, {0: [x], 1: [y]} if first == 0 else {0: [y], 1: [x]}, 400)
    assert not s.has_work(), f"livelock: {[(r.request_id, r.num_computed, r.num_preemptions) for r in s.running]}"
    assert [len(r.output) for r in (x, y)] == [6, 3]
    # both prompts need 24 of the 16 pages: one restart can be needed (65 each before the fix), a
    # second is not, because a request short of pages waits for those the other frees as it finishes
    assert sum(r.num_preemptions for r in (x, y)) <= 1


@pytest.mark.parametrize("policy", ["native", "radixflow", "pair"])
def test_a_request_waiting_for_pages_is_not_starved_by_arrivals(policy: str) -> None:
    """A 32-token prompt in a 12-page pool, while a 4-token request with 2 output tokens arrives
    every round (review, 2026-12-01). Some short request always has its last token in flight, so
    the prompt waits for the pages that commit frees; the round must then admit nothing, or the next
    arrival takes them first and the prompt waits for as long as the stream lasts (99 rounds of a
    100-round stream when admission went on)."""
    cfg = SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=24, page_size=4, grid=8, hybrid=True, policy=policy)
    s = Scheduler(cfg, num_pages=12, num_slots=16)
    prompt = Request(0, tuple(range(100, 132)), 1)
    arrivals = {rnd: [Request(rnd + 1, tuple(range(1000 + 4 * rnd, 1004 + 4 * rnd)), 2)] for rnd in range(100)}
    arrivals[5].append(prompt)
    _run_overlapped(s, arrivals, 1000)
    assert not s.has_work() and prompt.is_finished
    assert prompt.first_token_round - 5 <= 10, prompt.first_token_round  # its one token: the commit it finished at


def test_launch_refuses_a_plan_whose_request_left_after_planning() -> None:
    """The engine launches a plan as soon as it is made; a caller that aborts a request in between
    gets a ValueError instead of a launched row advancing a finished request."""
    cfg = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=16, page_size=4, grid=8, hybrid=True, policy="radixflow"
    )
    s = Scheduler(cfg, num_pages=22, num_slots=3)
    s.add(Request(0, B, 2))
    plan = s.schedule()
    s.abort(0)
    with pytest.raises(ValueError, match="stale plan"):
        s.launch(plan)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_older_prompt_is_not_restarted_by_a_stream_of_newer_requests(overlap: bool) -> None:
    """A 48-token prompt (1 output token) in a 14-page pool, 8 rows, budget 16, while a 4-token
    request with 3 output tokens arrives every round for 100 rounds (review, 2026-12-01). Decode
    rows are planned before prompts, so the newer requests' decode rows held their pages when the
    prompt ran short: without overlap it preempted itself every few rounds and finished only when
    the stream ended (100 restarts in 404 rounds of a 400-round stream, since before 2026-12-01);
    with overlap the newer requests preempted it (396 restarts). Now only a request admitted after
    the one short of pages is a victim, row or not."""
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16, page_size=4, grid=8, hybrid=True, policy="native")
    s = Scheduler(cfg, num_pages=14, num_slots=16)
    prompt = Request(0, tuple(range(100, 148)), 1)
    arrivals = {rnd: [Request(rnd + 1, tuple(range(1000 + 4 * rnd, 1004 + 4 * rnd)), 3)] for rnd in range(100)}
    arrivals[1].append(prompt)
    if overlap:
        _run_overlapped(s, arrivals, 1000)
    else:
        for rnd in range(1000):
            for req in arrivals.get(rnd, ()):
                s.add(req)
            plan = s.schedule()
            if plan.rows:
                s.commit(plan, {r.request_id: 7 for r in plan.rows if r.sample})
            if prompt.is_finished:
                break
    assert prompt.is_finished and prompt.num_preemptions == 0
    assert s.requests[1].first_token_round is not None and prompt.first_token_round is not None
    assert prompt.first_token_round <= 10, prompt.first_token_round
