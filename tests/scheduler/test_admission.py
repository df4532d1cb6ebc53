"""The admission core without a model: native stops at a consumer, radixflow fills the round."""

from __future__ import annotations

import pytest

from radixflow_jax.scheduler.request import Request
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.scheduler import Scheduler

ARTICLE = tuple(range(100, 132))  # 32 tokens: checkpoints at 8, 16, 24, 32


def _sched(policy: str, budget: int = 64, **kw) -> Scheduler:
    cfg = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=budget, page_size=4, grid=8, hybrid=True, policy=policy, **kw
    )
    return Scheduler(cfg, num_pages=64, num_slots=32)


def _queue(s: Scheduler) -> None:
    s.add(Request(1, ARTICLE + (1, 2, 3, 4, 5), max_tokens=2))  # producer
    s.add(Request(2, ARTICLE + (6, 7, 8, 9, 10), max_tokens=2))  # consumer of request 1
    s.add(Request(3, tuple(range(200, 210)), max_tokens=2))  # independent
    s.add(Request(4, tuple(range(300, 310)), max_tokens=2))  # independent


def _run(s: Scheduler) -> list[list[int]]:
    rounds = []
    while s.has_work():
        plan = s.schedule()
        assert plan.rows, "no progress"
        rounds.append([r.request_id for r in plan.rows])
        s.commit(plan, {r.request_id: 0 for r in plan.rows if r.sample})
        s.memory.pages.check_invariants()
    return rounds


def test_native_stops_at_consumer_radixflow_fills_round() -> None:
    native, flow = _sched("native"), _sched("radixflow")
    _queue(native)
    _queue(flow)
    p_native, p_flow = native.schedule(), flow.schedule()
    assert [r.request_id for r in p_native.rows] == [1]
    assert p_native.stats.stopped_by_consumer and p_native.stats.consumers_blocked == 1
    assert p_native.stats.shadow_rows == 2 and p_native.stats.shadow_tokens == 20
    assert sorted(r.request_id for r in p_flow.rows) == [1, 3, 4]
    assert p_flow.stats.consumers_waiting == 1 and not p_flow.stats.stopped_by_consumer
    producer = p_flow.rows[0]
    assert [off for off, _ in producer.emits] == [8, 16, 24, 32, 37]  # the grid, then the exact prompt end
    # next round: the consumer reuses the committed checkpoint at depth 32 under both policies
    for s, plan in ((native, p_native), (flow, p_flow)):
        s.commit(plan, {r.request_id: 0 for r in plan.rows if r.sample})
        nxt = s.schedule()
        consumer = next(r for r in nxt.rows if r.request_id == 2)
        assert consumer.start == 32 and consumer.copy_from is not None
        assert s.requests[2].cached_tokens == 32


@pytest.mark.parametrize("policy", ["native", "radixflow", "no-cache"])
def test_everything_finishes_and_pools_drain(policy: str) -> None:
    s = _sched(policy)
    _queue(s)
    rounds = _run(s)
    assert all(s.requests[i].is_finished for i in (1, 2, 3, 4))
    assert all(len(s.requests[i].output) == 2 for i in (1, 2, 3, 4))
    s.memory.flush()
    assert s.memory.pages.num_used == 0
    assert s.memory.slots is None or s.memory.slots.num_used == 0
    assert len(rounds) >= 2


def test_two_articles_fewer_rounds_same_reuse() -> None:
    def run(policy: str) -> tuple[list[list[int]], int]:
        s = _sched(policy, budget=128)
        other = tuple(range(500, 532))
        for rid, prompt in enumerate([ARTICLE + (1, 2), ARTICLE + (3, 4), other + (5, 6), other + (7, 8)]):
            s.add(Request(rid, prompt, max_tokens=1))
        rounds = _run(s)
        return rounds, sum(r.cached_tokens for r in s.requests.values())

    native, native_reuse = run("native")
    flow, flow_reuse = run("radixflow")
    assert native == [[0], [1, 2], [3]]
    assert flow == [[0, 2], [1, 3]]
    assert native_reuse == flow_reuse == 64


def test_consumer_wait_is_bounded() -> None:
    s = _sched("radixflow", budget=128, max_consumer_wait=0)
    _queue(s)
    plan = s.schedule()
    assert sorted(r.request_id for r in plan.rows) == [1, 2, 3, 4]  # no waiting at all
    consumer = next(r for r in plan.rows if r.request_id == 2)
    assert consumer.start == 0 and consumer.copy_from is None  # cold prefill: never reads pending


def test_bad_requests_are_refused() -> None:
    s = _sched("radixflow")
    with pytest.raises(ValueError, match="exceeds the KV pool"):
        s.add(Request(9, tuple(range(300)), max_tokens=10))
    with pytest.raises(ValueError, match="empty"):
        s.add(Request(10, (), max_tokens=1))
    s.add(Request(11, (1, 2), max_tokens=1))
    with pytest.raises(ValueError, match="already in use"):
        s.add(Request(11, (1, 2), max_tokens=1))
    with pytest.raises(ValueError, match="unknown policy"):
        SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=64, page_size=4, grid=8, hybrid=True, policy="x")


def test_lpm_admits_longest_cached_prefix_first() -> None:
    s = _sched("radixflow", budget=128, queue_order="lpm")
    s.add(Request(1, ARTICLE + (1, 2, 3), max_tokens=1))
    while s.has_work():  # cache the article
        plan = s.schedule()
        s.commit(plan, {r.request_id: 0 for r in plan.rows if r.sample})
    s.add(Request(2, tuple(range(700, 740)), max_tokens=1))  # arrives first, no cached prefix
    s.add(Request(3, ARTICLE + (9, 9), max_tokens=1))  # arrives later, 32 cached tokens
    plan = s.schedule()
    assert [r.request_id for r in plan.rows][0] == 3


def test_preemption_under_a_tiny_pool_still_finishes_everything() -> None:
    cfg = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=64, page_size=4, grid=8, hybrid=True, policy="radixflow"
    )
    s = Scheduler(cfg, num_pages=24, num_slots=8)
    for i in range(4):
        s.add(Request(i, tuple(range(100 * i, 100 * i + 20)), max_tokens=30))
    preempted = 0
    while s.has_work():
        plan = s.schedule()
        preempted += plan.stats.preempted
        s.commit(plan, {r.request_id: 1 for r in plan.rows if r.sample})
    assert preempted > 0
    assert all(len(s.requests[i].output) == 30 for i in range(4))
    s.memory.flush()
    assert s.memory.pages.num_used == 0 and s.memory.slots.num_used == 0


def test_a_budget_of_one_grid_does_not_starve_a_prompt_behind_decode_rows() -> None:
    """Budget == grid (8): two decode rows leave 6 tokens, which hold no grid position past a
    prompt's start, so the prompt used to get no tokens until both decoders had finished (30
    rounds). A round that starves a prompt behind decode rows only is now followed by a
    prefill-first round: the prompt's five spans alternate with decode rounds, and a decoder skips
    one round at a time at most."""
    s = _sched("radixflow", budget=8)
    s.add(Request(1, (1, 2, 3), max_tokens=30))
    s.add(Request(2, (4, 5, 6), max_tokens=30))
    plans = []
    while s.has_work():
        if len(plans) == 2:
            s.add(Request(3, tuple(range(400, 440)), max_tokens=2))  # 40 tokens: five grid spans
        plan = s.schedule()
        assert plan.rows and plan.num_tokens <= 8
        plans.append(plan)
        s.commit(plan, {r.request_id: 0 for r in plan.rows if r.sample})
    assert all(len(s.requests[i].output) == s.requests[i].max_tokens for i in (1, 2, 3))
    rows = [{r.request_id: len(r.tokens) for r in p.rows} for p in plans]
    prompt_rounds = [i for i, r in enumerate(rows) if r.get(3, 0) > 1]
    assert [rows[i][3] for i in prompt_rounds] == [8] * 5
    assert prompt_rounds == [3, 5, 7, 9, 11]  # every other round from the first one it was starved in
    assert all(plans[i].stats.prefill_first for i in prompt_rounds)
    assert not any(p.stats.prefill_first for i, p in enumerate(plans) if i not in prompt_rounds)
    for rid in (1, 2):
        ran = [i for i, r in enumerate(rows) if rid in r]
        assert max(b - a for a, b in zip(ran, ran[1:])) == 2  # skipped the prompt's rounds, one at a time
    assert 3 in rows[12] and 1 in rows[13], "the prompt sampled while the decoders still ran"


def test_a_prompt_ahead_in_the_running_list_does_not_stall_a_decoder() -> None:
    """A prompt admitted by a prefill-first round runs ahead of a request admitted after it. When
    that request decodes, the prompt's spans (the whole budget of one grid) must not take its token
    in every round: decode rows are planned before running prompts, and the prompt gets its spans
    in the prefill-first rounds in between (found by review, 2026-12-01)."""
    s = _sched("radixflow", budget=8)
    s.add(Request(1, (1, 2, 3), max_tokens=3))  # a decoder
    s.add(Request(2, tuple(range(400, 480)), max_tokens=2))  # 80 tokens: ten grid spans
    s.add(Request(3, (7, 8, 9, 10, 11), max_tokens=12))  # fits beside the decoder, then decodes
    rows = []
    while s.has_work():
        plan = s.schedule()
        rows.append({r.request_id: len(r.tokens) for r in plan.rows})
        s.commit(plan, {r.request_id: 0 for r in plan.rows if r.sample})
    assert all(len(s.requests[i].output) == s.requests[i].max_tokens for i in (1, 2, 3))
    ran = [i for i, r in enumerate(rows) if 3 in r]
    assert max(b - a for a, b in zip(ran, ran[1:])) <= 2  # it skips one round at a time at most
    prompt = [i for i, r in enumerate(rows) if r.get(2, 0) > 1]
    assert len(prompt) == 10 and prompt[-1] < ran[-1], "the prompt finished its spans while request 3 decoded"


def test_a_chunk_row_names_the_token_after_it() -> None:
    """A prompt split over rounds: each chunk's row names the prompt token its next chunk starts
    with (``RowPlan.next_token``, what MTP drafts pair with the chunk's last hidden state); the row
    that samples names none."""
    s = _sched("radixflow", budget=16)
    prompt = tuple(range(100, 140))
    s.add(Request(1, prompt, max_tokens=1))
    seen = []
    while s.has_work():
        plan = s.schedule()
        row = plan.rows[0]
        end = row.start + len(row.tokens)
        seen.append((end, row.next_token))
        s.commit(plan, {r.request_id: 0 for r in plan.rows if r.sample})
    assert seen[:-1] == [(end, prompt[end]) for end, _ in seen[:-1]] and len(seen) > 1
    assert seen[-1] == (len(prompt), -1)
