"""Policy ``pair`` without a model: a consumer joins its producer's round from the pending depth,
holds a paired reference (its own references on the producer's pending pages), and is rolled back
when the producer leaves before the commit fence."""

from __future__ import annotations

from radixflow_jax.scheduler.request import Request, RequestStatus
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.scheduler import Scheduler

PREFIX = tuple(range(100, 140))  # 40 shared tokens: grid 8, page 4


def _scheduler(policy: str) -> Scheduler:
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128, page_size=4, grid=8, hybrid=True, policy=policy)
    s = Scheduler(cfg, num_pages=80, num_slots=24)
    for i in range(4):
        s.add(Request(i, PREFIX + (i + 1, i + 2, i + 3), 2))
    return s


def _drain(s: Scheduler) -> int:
    rounds = 0
    while s.has_work():
        plan = s.schedule()
        s.commit(plan, {r.request_id: 7 for r in plan.rows if r.sample})
        s.memory.cache.check_invariants()
        rounds += 1
    return rounds


def test_consumers_join_the_producers_round_from_the_pending_depth() -> None:
    s = _scheduler("pair")
    plan = s.schedule()
    producer, *consumers = plan.rows
    assert producer.pair_slot is None and producer.start == 0
    assert plan.stats.consumers_paired == 3 and len(consumers) == 3
    for row in consumers:
        assert (row.start - producer.start, row.pair_slot) in producer.emits
        assert row.start == 40 and row.copy_from is None
        assert row.pages[:10] == producer.pages[:10]  # the producer's pending pages, referenced
        assert all(s.memory.pages.refcount(p) >= 2 for p in row.pages[:10])
    assert s.memory.cache.paired() == {0: (1, 2, 3)}
    s.commit(plan, {r.request_id: 7 for r in plan.rows if r.sample})
    assert s.memory.cache.paired() == {}  # the commit fence ends the pairing
    assert [s.requests[i].cached_tokens for i in range(4)] == [0, 40, 40, 40]
    _drain(s)
    s.memory.flush()
    assert s.memory.pages.num_used == 0 and s.memory.slots.num_used == 0


def test_pair_needs_fewer_rounds_than_radixflow_at_equal_reuse() -> None:
    flow, pair = _scheduler("radixflow"), _scheduler("pair")
    assert _drain(pair) < _drain(flow)
    cached = [sum(s.requests[i].cached_tokens for i in range(4)) for s in (flow, pair)]
    assert cached[0] == cached[1] == 120


def test_producer_abort_between_plan_and_commit_rolls_partners_back() -> None:
    s = _scheduler("pair")
    plan = s.schedule()
    s.abort(0)  # the round is running
    s.memory.cache.check_invariants()
    assert s.memory.cache.paired() == {}
    for rid in (1, 2, 3):
        req = s.requests[rid]
        assert req.status is RequestStatus.WAITING and req.num_computed == 0 and req.num_rollbacks == 1
        assert not req.pages and req.slot is None
    s.commit(plan, {r.request_id: 7 for r in plan.rows if r.sample})
    assert all(s.requests[rid].num_computed == 0 and not s.requests[rid].output for rid in (1, 2, 3))
    _drain(s)
    assert [s.requests[i].finish_reason for i in range(4)] == ["abort", "length", "length", "length"]
    s.memory.flush()
    assert s.memory.pages.num_used == 0 and s.memory.slots.num_used == 0


def test_consumer_abort_drops_only_its_paired_reference() -> None:
    s = _scheduler("pair")
    plan = s.schedule()
    s.abort(2)
    assert s.memory.cache.paired() == {0: (1, 3)}
    s.commit(plan, {r.request_id: 7 for r in plan.rows if r.sample})
    _drain(s)
    s.memory.flush()
    assert s.memory.pages.num_used == 0 and s.memory.slots.num_used == 0


def test_radixflow_never_pairs() -> None:
    s = _scheduler("radixflow")
    plan = s.schedule()
    assert all(r.pair_slot is None for r in plan.rows) and plan.stats.consumers_paired == 0
    assert plan.stats.consumers_waiting == 3


def _bucketed_cost(rows) -> float:
    """A round-cost model like the simulator's: a fixed cost plus the padded token slots (powers of two)."""
    tokens = sum(len(r.tokens) for r in rows)
    return 0.001 + 1e-4 * max(16, 1 << (tokens - 1).bit_length())


def _fill_round(fills: list[int]):
    """Producer + paired consumer (46 tokens: a 64-slot round), then unrelated fill requests."""
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, page_size=4, grid=8, hybrid=True, policy="pair")
    s = Scheduler(cfg, num_pages=120, num_slots=24)
    s.round_cost = _bucketed_cost
    s.add(Request(0, PREFIX + (1, 2, 3), 1))
    s.add(Request(1, PREFIX + (4, 5, 6), 1))
    for i, n in enumerate(fills):
        s.add(Request(2 + i, tuple(range(1000 * (i + 1), 1000 * (i + 1) + n)), 1))
    return s.schedule()


def test_fill_in_the_padding_is_free() -> None:
    plan = _fill_round([10])  # 56 tokens: still 64 slots
    assert plan.stats.consumers_paired == 1 and plan.stats.fill_declined == 0 and len(plan.rows) == 3


def test_lone_fill_growing_the_round_is_declined() -> None:
    # 106 tokens: 128 slots; the jump is paid by the 2 rows in the round and serves only itself
    plan = _fill_round([60])
    assert plan.stats.fill_declined == 1 and [r.request_id for r in plan.rows] == [0, 1]


def test_fill_whose_slack_carries_followers_is_admitted() -> None:
    # the same fill with two short requests behind it that ride the 128-slot round it opens: the
    # jump serves those two a round earlier, which outweighs what it costs the two already in it
    plan = _fill_round([60, 10, 10])
    assert plan.stats.fill_declined == 0 and sorted(r.request_id for r in plan.rows) == [0, 1, 2, 3, 4]


def _pair_round(num_consumers: int):
    """Producer (43 tokens) and an unrelated 20-token request fill a 64-slot round; each consumer's
    3 tokens would grow it to 128 slots."""
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, page_size=4, grid=8, hybrid=True, policy="pair")
    s = Scheduler(cfg, num_pages=120, num_slots=24)
    s.round_cost = _bucketed_cost
    s.add(Request(0, PREFIX + (1, 2, 3), 1))
    s.add(Request(1, tuple(range(5000, 5020)), 1))
    for i in range(num_consumers):
        s.add(Request(2 + i, PREFIX + (10 + i, 11, 12), 1))
    return s.schedule()


def test_lone_consumer_growing_the_round_waits() -> None:
    # the jump (64 -> 128 slots) is paid by the 2 rows in the round and saves only the consumer's own round
    plan = _pair_round(1)
    assert plan.stats.pairs_declined == 1 and plan.stats.consumers_paired == 0
    assert plan.stats.consumers_waiting == 1 and [r.request_id for r in plan.rows] == [0, 1]


def test_consumer_whose_waiting_siblings_are_served_pairs() -> None:
    # with two siblings waiting the jump saves three consumers a round; the siblings then ride its slack
    plan = _pair_round(3)
    assert plan.stats.pairs_declined == 0 and plan.stats.consumers_paired == 3
    assert sorted(r.request_id for r in plan.rows) == [0, 1, 2, 3, 4]


def test_a_consumer_short_of_pages_waits_for_its_finishing_producer() -> None:
    """Overlap, page pressure: consumer C was paired with producer V in the round in flight, whose
    only token V samples. In the next plan C needs pages. V finishes at that round's commit, so it is
    no victim: C gets no row and no second one (review, 2026-12-01: C once preempted V, went back
    to the queue with it and got a running row and an admission in the same plan), waits one commit
    and then runs from the checkpoint V planted."""
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128, page_size=4, grid=8, hybrid=True, policy="pair")
    s = Scheduler(cfg, num_pages=32, num_slots=24)
    s.add(Request(0, PREFIX + tuple(range(1, 21)), max_tokens=1))  # producer V
    s.add(Request(1, PREFIX + tuple(range(500, 580)), max_tokens=2))  # consumer C, 80 tokens of its own
    first = s.schedule()
    assert [r.pair_slot is not None for r in first.rows] == [False, True]  # C paired with V
    s.launch(first)
    plan = s.schedule()
    assert plan.rows == () and plan.stats.preempted == 0 and s.requests[1].num_rollbacks == 0
    s.commit(first, {r.request_id: 7 for r in first.rows if r.sample})
    assert s.requests[0].is_finished
    after = s.schedule()
    assert [r.request_id for r in after.rows] == [1] and after.rows[0].start > 0  # no restart


def test_preemption_under_page_pressure_never_leaves_a_stale_row_in_the_plan() -> None:
    """Overlap, page pressure, pair (review, 2026-12-01): in round 3 consumer C's decode row is
    planned before the running prompts. X, admitted after C's producer V, once preempted V for a
    page, and V's roll-back took C back to the queue with its row still in the plan: launched, that
    row left C with an unknown token for an output and C never finished. Victims are now admitted
    after the request short of pages (X preempts itself), and a victim that already has a row loses
    it (V, older, takes C's pages and C's row leaves the plan). Every plan holds only rows of
    running requests in their current epoch, and all four finish."""
    prefix = tuple(range(100, 116))
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=24, page_size=4, grid=8, hybrid=True, policy="pair")
    s = Scheduler(cfg, num_pages=9, num_slots=16)
    y = Request(9, (500, 501), 30)
    v, c = Request(0, prefix + tuple(range(200, 209)), 1), Request(1, prefix + (300, 301, 302), 2)
    x = Request(2, (400, 401, 402, 403), 2)
    s.add(y)
    in_flight = None
    for rnd in range(200):
        if rnd == 2:
            for r in (v, c, x):
                s.add(r)
        plan = s.schedule()
        assert all(r.epoch == s.requests[r.request_id].epoch for r in plan.rows)
        assert all(s.requests[r.request_id] in s.running for r in plan.rows)
        assert plan.num_tokens <= 24 and len(plan.rows) <= 4
        if rnd == 3:
            assert plan.stats.preempted == 2 and x.num_preemptions == 1 and c.num_preemptions == 1
            assert 1 not in {r.request_id for r in plan.rows}
        if plan.rows:
            s.launch(plan)
        if in_flight is not None:
            s.commit(in_flight, {r.request_id: 7 for r in in_flight.rows if r.sample})
            s.memory.cache.check_invariants()
        in_flight = plan if plan.rows else None
        if not s.has_work() and in_flight is None:
            break
    assert all(r.finish_reason == "length" and len(r.output) == r.max_tokens for r in (v, c, x, y))
