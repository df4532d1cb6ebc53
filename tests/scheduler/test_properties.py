"""Property tests of the scheduler without a model: random arrivals, shared prefixes, aborts (also
between ``schedule()`` and ``commit()``, while the round runs), tiny pools and token budgets of 48
and of one grid (8), under every policy. The tree and pool invariants hold after every plan and
every commit, no plan exceeds the budgets or holds more than ``max_num_seqs`` running requests,
no decode row waits two rounds in a row for tokens, every accepted request
finishes, no page or slot leaks, every checkpoint a row emits lies inside its span (a decode row's
after its one token, which the step relies on), a paired consumer (policy ``pair``) starts from an
emit of an unpaired row of its own round and is never committed after its producer left, and
RadixFlow's reuse is never lower than native's by more than one request's prefix. ``pair+cost``:
policy ``pair`` with a round cost, so its fill and pairing rules decline too. Every policy runs with
and without overlap (each plan launched before the previous one commits); pools of 16 pages make
two long requests preempt or wait for each other (two such livelocked under overlap until
2026-12-01)."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixflow_jax.scheduler.request import Request, RequestStatus
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.scheduler import Scheduler

PREFIXES = [tuple(range(1000 * i, 1000 * i + 40)) for i in range(1, 4)]


@st.composite
def workloads(draw):
    n = draw(st.integers(2, 14))
    reqs = []
    for i in range(n):
        prefix = PREFIXES[draw(st.integers(0, len(PREFIXES) - 1))][: draw(st.integers(0, 40))]
        suffix = tuple(draw(st.lists(st.integers(5, 60), min_size=1, max_size=12)))
        arrival = draw(st.integers(0, 6))  # the round it arrives in
        abort_at = draw(st.one_of(st.none(), st.integers(0, 8)))
        mid_round = draw(st.booleans())  # abort between schedule() and commit() of that round
        reqs.append((i, prefix + suffix, draw(st.integers(1, 5)), arrival, (abort_at, mid_round)))
    pages = draw(st.integers(16, 60))  # 16: two long requests cannot both finish their prompts at once
    slots = draw(st.integers(3, 12))
    budget = draw(st.sampled_from([8, 48]))  # 8: one grid, decode rows leave a prompt no grid position
    return reqs, pages, slots, budget


def _check(s: Scheduler) -> None:
    s.memory.pages.check_invariants()
    if s.memory.slots is not None:
        s.memory.slots.check_invariants()
    if s.memory.cache is not None:
        s.memory.cache.check_invariants()


def _padded_cost(rows) -> float:
    """A round cost that jumps at powers of two of the round's tokens (so pair's fill and pairing
    rules both admit and decline)."""
    tokens = sum(len(r.tokens) for r in rows)
    return 1.0 + max(8, 1 << max(tokens - 1, 0).bit_length())


def _commit(s: Scheduler, plan, emitted_by) -> None:
    for row in plan.rows:  # nothing commits a state that started from a producer that left
        if row.pair_slot is not None and s.requests[row.request_id].status is RequestStatus.RUNNING:
            assert s.requests[emitted_by[row.pair_slot].request_id].status is RequestStatus.RUNNING
    s.commit(plan, {r.request_id: 7 for r in plan.rows if r.sample})
    _check(s)


def _run(
    policy: str, reqs, pages: int, slots: int, budget: int = 48, overlap: bool = False
) -> tuple[Scheduler, set[int]]:
    """``overlap``: each plan is launched and commits after the next one is planned, as the engine's
    overlap loop runs them (a plan that would plant on a token still in flight first commits it)."""
    costed = policy == "pair+cost"
    cfg = SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=budget, page_size=4, grid=8, hybrid=True,
                          policy="pair" if costed else policy)  # fmt: skip
    s = Scheduler(cfg, num_pages=pages, num_slots=slots)
    if costed:
        s.round_cost = _padded_cost
    accepted: set[int] = set()
    skipped_decoders: set[int] = set()
    in_flight = None
    for round_index in range(400):
        for rid, prompt, max_tokens, arrival, _ in reqs:
            if arrival == round_index:
                try:
                    s.add(Request(rid, prompt, max_tokens))
                    accepted.add(rid)
                except ValueError:
                    pass
        for rid, _, _, _, (abort_at, mid) in reqs:
            if abort_at == round_index and not mid and rid in accepted:
                s.abort(rid)
        if in_flight is not None and s.plants_on_unknown():
            _commit(s, *in_flight)
            in_flight = None
        if not s.has_work() and round_index > 6 and in_flight is None:
            break
        plan = s.schedule()
        _check(s)
        assert plan.num_tokens <= budget and len(plan.rows) <= 3
        riders = sum(1 for r in plan.rows if r.is_rider)  # each takes one emit (its own state) that is no checkpoint
        assert plan.stats.checkpoints_planted == sum(len(r.emits) for r in plan.rows) - riders  # round records count these
        assert plan.stats.admitted <= len(plan.rows)
        assert sum(len(r.output) < r.max_tokens for r in s.running) <= 3  # max_num_seqs caps admission
        planned = {r.request_id for r in plan.rows}
        decoding = {r.request_id for r in s.running if r.remaining == 1 and len(r.output) < r.max_tokens}
        if plan.stats.waited_for_pages:  # short of pages, a decode row may wait for a commit in flight
            skipped_decoders = set()
        else:  # but never two rounds in a row for tokens
            assert not (decoding - planned) & skipped_decoders, "a decode row skipped two rounds in a row"
            skipped_decoders = decoding - planned
        for row in plan.rows:  # a source checkpoint is one the tree holds (committed), never a free slot
            assert row.copy_from is None or s.memory.slots.refcount(row.copy_from) > 0
        for row in plan.rows:  # checkpoints lie inside (start, end]: a one-token row emits after its token
            assert all(0 < offset <= len(row.tokens) for offset, _ in row.emits)
        emitted_by = {slot: row for row in plan.rows if row.pair_slot is None for _, slot in row.emits}
        for row in plan.rows:  # a paired consumer starts from an unpaired row's emit in this very round
            if row.pair_slot is not None:
                producer = emitted_by[row.pair_slot]
                assert (row.start - producer.start, row.pair_slot) in producer.emits
                assert row.pages[: row.start // 4] == producer.pages[: row.start // 4]
        if overlap and plan.rows:
            s.launch(plan)  # the engine launches a plan as soon as it is made
        for rid, _, _, _, (abort_at, mid) in reqs:
            if abort_at == round_index and mid and rid in accepted:
                s.abort(rid)  # the round is running: its result for rid must be dropped at commit
                _check(s)
        if not overlap:
            _commit(s, plan, emitted_by)
            continue
        if in_flight is not None:
            _commit(s, *in_flight)
        in_flight = (plan, emitted_by) if plan.rows else None
    assert not s.has_work(), "livelock: work left after 400 rounds"
    return s, accepted


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_both_policies_finish_everything_without_leaks(data) -> None:
    reqs, pages, slots, budget = data
    reuse = {}
    for policy, overlap in itertools.product(("native", "radixflow", "pair", "pair+cost"), (False, True)):
        s, accepted = _run(policy, reqs, pages, slots, budget, overlap)
        for rid in accepted:
            req = s.requests[rid]
            assert req.is_finished
            if req.finish_reason != "abort":
                assert req.finish_reason == "length" and len(req.output) == req.max_tokens
        s.memory.flush()
        assert s.memory.pages.num_used == 0
        assert s.memory.slots.num_used == 0
        reuse[policy, overlap] = sum(s.requests[r].cached_tokens for r in accepted)
    no_abort = all(a is None for *_, (a, _) in reqs)
    if no_abort:
        longest = max(len(p) for _, p, *_ in reqs)
        for overlap in (False, True):
            for policy in ("radixflow", "pair", "pair+cost"):
                assert reuse[policy, overlap] >= reuse["native", overlap] - longest
