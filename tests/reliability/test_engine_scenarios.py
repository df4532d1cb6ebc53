"""Named fault scenarios at the engine level, on the shadow executor (symbolic device memory: every
context, state and checkpoint read is checked against the request's real tokens). Each asserts: no
crash, every accepted request completes or ends with a clear error, zero leaked pages or slots
after a flush, no pending checkpoint read, completed greedy outputs equal the cold run; and that
the scenario really happened (the abort hit a producer with waiting consumers, the pool was short,
...). The policy is a parameter: every caching policy runs every scenario."""

from __future__ import annotations

import random

import pytest

from radixflow_jax.cache.tree import iter_nodes
from radixflow_jax.engine.config import EngineFailure
from radixflow_jax.reliability.faults import Fault
from radixflow_jax.reliability.harness import Harness, shadow_of
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.scheduler.request import RequestStatus
from tests.reliability.scenarios import CACHING_POLICIES, GREEDY, check_run, cold_outputs, engine, tokens

policies = pytest.mark.parametrize("policy", CACHING_POLICIES)


def _shared_prefix(seed: int, n: int, prefix_len: int = 96) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = tokens(rng, prefix_len)
    return [prefix + tokens(rng, 5 + i % 7) for i in range(n)]


def _consumers_of(h: Harness, producer_key: int) -> list[int]:
    """Submissions now waiting on a pending checkpoint of ``producer_key``'s request."""
    core, pid = h.core, h.request_id(producer_key)
    cache = core.scheduler.memory.cache
    out = []
    for req in core.scheduler.waiting:
        if cache.match(req.tokens, touch=False, shared=False).consumer_of == pid:
            out.append(h._key_of[req.request_id])
    return out


def _while_round_runs(h: Harness, fn) -> None:
    """Runs ``fn(plan)`` between planning and commit: pending checkpoints exist only then."""
    original = h.executor.on_execute

    def hook(plan) -> None:
        original(plan)
        fn(plan)

    h.executor.on_execute = hook


def _prefilling(h: Harness, key: int) -> bool:
    rid = h.request_id(key)
    req = h.core.scheduler.requests.get(rid) if rid is not None else None
    return req is not None and req.status is RequestStatus.RUNNING and req.num_computed < len(req.prompt)


@policies
def test_abort_producer_mid_prefill_while_consumers_wait(policy: str) -> None:
    prompts = _shared_prefix(1, 6)
    h = Harness(engine(policy))
    for i, p in enumerate(prompts):
        h.submit(p, GREEDY, at_round=0 if i == 0 else 1)
    seen: list[list[int]] = []

    def abort_producer(plan) -> None:
        if not seen and _prefilling(h, 0):
            waiting = _consumers_of(h, 0)
            if waiting:
                seen.append(waiting)
                assert h.abort(0)

    _while_round_runs(h, abort_producer)
    report = h.run()
    assert seen and len(seen[0]) >= 2, "the producer was never aborted with consumers waiting"
    assert report.outputs[0].finish_reason == "abort"
    assert report.by_reason()["length"] == len(prompts) - 1
    check_run(h, report, cold_outputs(prompts, [GREEDY] * len(prompts)))
    # the consumers fell back to what the producer had committed before its abort (or recomputed)
    assert all(report.outputs[k].cached_tokens % 16 == 0 for k in seen[0])


def test_abort_producer_while_consumers_are_paired_with_it() -> None:
    """Policy pair: the producer is aborted while the round that pairs consumers with it runs. The
    shadow device runs the round as the step does (the partners start from the producer's in-round
    emits); the commit skips the partners' rows and they recompute from committed state."""
    prompts = _shared_prefix(5, 6, prefix_len=32)
    h = Harness(engine("pair", max_num_batched_tokens=64))  # room for the partners in the producer's round
    for p in prompts:
        h.submit(p, GREEDY, at_round=0)
    aborted: list[tuple[int, list[int]]] = []
    rolled: list[int] = []  # each partner's roll-back count right after the abort

    def abort_paired_producer(plan) -> None:
        if aborted:
            return
        partners = [r for r in plan.rows if r.pair_slot is not None]
        pairs_with = partners[0].pair_slot if partners else None
        producer = next((r for r in plan.rows if any(s == pairs_with for _, s in r.emits)), None)
        if producer is not None:
            aborted.append((h._key_of[producer.request_id], [h._key_of[r.request_id] for r in partners]))
            assert h.abort(aborted[0][0])
            rolled.extend(h.core.scheduler.requests[r.request_id].num_rollbacks for r in partners)

    _while_round_runs(h, abort_paired_producer)
    report = h.run()
    assert aborted and aborted[0][1], "no producer was aborted while consumers were paired with it"
    producer_key, partner_keys = aborted[0]
    assert report.outputs[producer_key].finish_reason == "abort"
    assert report.by_reason()["length"] == len(prompts) - 1
    assert shadow_of(h.core).pair_reads >= len(partner_keys)  # the paired rows really ran paired
    assert rolled and all(n == 1 for n in rolled), rolled
    check_run(h, report, cold_outputs(prompts, [GREEDY] * len(prompts)))


@policies
def test_abort_consumers(policy: str) -> None:
    prompts = _shared_prefix(2, 6)
    h = Harness(engine(policy))
    for i, p in enumerate(prompts[:5]):
        h.submit(p, GREEDY, at_round=0 if i == 0 else 1)
    late = h.submit(prompts[5], GREEDY, at_round=30)  # after the producer finished: it must hit
    aborted: list[int] = []

    def abort_consumers(plan) -> None:
        if not aborted:
            for key in _consumers_of(h, 0):
                assert h.abort(key)
                aborted.append(key)

    _while_round_runs(h, abort_consumers)
    report = h.run()
    assert len(aborted) >= 2, "no consumer was waiting to be aborted"
    assert report.outputs[0].finish_reason == "length"
    assert report.by_reason()["abort"] == len(aborted)
    assert report.outputs[late].cached_tokens >= 64  # the producer's checkpoints were committed and read
    check_run(h, report, cold_outputs(prompts, [GREEDY] * len(prompts)))


@policies
def test_abort_between_planning_and_commit(policy: str) -> None:
    """Aborts while the round that runs the request is executing (producers, consumers, decodes)."""
    rng = random.Random(3)
    prompts = _shared_prefix(3, 12) + [tokens(rng, 40) for _ in range(4)]
    h = Harness(engine(policy))
    aborted_in_round = []
    for i, p in enumerate(prompts):
        abort_at = 2 + i if i % 3 == 0 else None
        h.submit(p, GREEDY, at_round=i // 2, abort_at=abort_at, mid_round=True)
    original = h.executor.on_execute

    def spy(plan) -> None:
        before = h.aborts
        original(plan)
        if h.aborts > before:
            aborted_in_round.append({r.request_id for r in plan.rows})

    h.executor.on_execute = spy
    report = h.run()
    assert report.aborts >= 3 and aborted_in_round, "no abort happened while its round ran"
    check_run(h, report, cold_outputs(prompts, [GREEDY] * len(prompts)))


@policies
def test_state_pool_at_the_minimum(policy: str) -> None:
    """One request slot and nothing for checkpoints: requests run one at a time, cold."""
    prompts = _shared_prefix(4, 5)
    h = Harness(engine(policy, num_slots=2))
    for p in prompts:
        h.submit(p, GREEDY)
    report = h.run()
    assert sum(r.checkpoints_skipped for r in h.core.records) > 0
    assert max(r.num_rows for r in h.core.records) == 1
    check_run(h, report, cold_outputs(prompts, [GREEDY] * len(prompts)))


@policies
def test_kv_pool_at_the_minimum(policy: str) -> None:
    """Exactly one max_model_len request fits; the rest waits, preempts and recomputes."""
    rng = random.Random(5)
    prompts = [tokens(rng, 200), *_shared_prefix(5, 4, prefix_len=64), tokens(rng, 120)]
    params = [SamplingParams(max_tokens=56, ignore_eos=True)] + [SamplingParams(max_tokens=20, ignore_eos=True)] * 5
    h = Harness(engine(policy, num_pages=256 // 8 + 1))
    for p, sp in zip(prompts, params):
        h.submit(p, sp)
    report = h.run()
    assert report.preemptions > 0
    check_run(h, report, cold_outputs(prompts, params))


@policies
def test_every_checkpoint_locked(policy: str) -> None:
    """For a stretch of rounds every checkpoint is pinned (locked): no slot can be evicted, so
    admissions wait for memory and plantings are skipped, yet nothing asserts or livelocks, and no
    pinned checkpoint is evicted; afterwards everything completes."""
    prompts = _shared_prefix(6, 10, prefix_len=64)
    h = Harness(engine(policy, num_slots=6))
    for i, p in enumerate(prompts):
        h.submit(p, GREEDY, at_round=0 if i < 2 else 6)
    starved = []

    def pin(h: Harness, tick: int) -> None:
        cache = h.core.scheduler.memory.cache
        if tick == 5:
            for node in iter_nodes(cache.root):
                if node.checkpoint is not None:
                    assert node.checkpoint.committed  # between rounds nothing is pending
                    cache.lock(node)
                    h.pinned.append(node)
            assert len(h.pinned) >= 3, "too few checkpoints to pin"
        elif tick == 20:
            assert all(node.checkpoint is not None for node in h.pinned), "a locked checkpoint was evicted"
            for node in h.pinned:
                cache.unlock(node)
            h.pinned.clear()

    def starving(plan) -> None:
        if h.pinned and (plan.stats.stopped_by_memory or plan.stats.checkpoints_skipped):
            starved.append(plan)

    h.between_rounds.append(pin)
    _while_round_runs(h, starving)
    report = h.run()
    assert len(starved) >= 3, "pinning every checkpoint never starved an admission or a placement"
    check_run(h, report, cold_outputs(prompts, [GREEDY] * len(prompts)))


@policies
def test_preemption_storm(policy: str) -> None:
    """Many long decodes in a small KV pool: preempted and recomputed over and over."""
    prompts = _shared_prefix(7, 16, prefix_len=48)
    params = [SamplingParams(max_tokens=40, ignore_eos=True)] * len(prompts)
    h = Harness(engine(policy, num_pages=26, max_num_seqs=8))
    for p, sp in zip(prompts, params):
        h.submit(p, sp)
    report = h.run()
    assert report.preemptions >= 20, report.preemptions
    check_run(h, report, cold_outputs(prompts, params))


@policies
@pytest.mark.parametrize("when", ["before", "after", "donated"])
def test_step_raises_then_recovers(policy: str, when: str) -> None:
    prompts = _shared_prefix(8, 10)
    h = Harness(engine(policy, faults=(Fault(4, when), Fault(11, when))))
    for i, p in enumerate(prompts):
        h.submit(p, GREEDY, at_round=i)
    report = h.run()
    assert report.step_failures == 2 and report.resets == 2
    assert report.by_reason()["length"] == len(prompts)  # every request retried and completed
    assert sum(o.cached_tokens for o in report.outputs.values()) > 0  # the cache works after the flushes
    check_run(h, report, cold_outputs(prompts, [GREEDY] * len(prompts)))


@policies
def test_step_failing_twice_in_a_row_fails_its_requests_and_the_engine_serves_on(policy: str) -> None:
    prompts = _shared_prefix(9, 8)
    h = Harness(engine(policy, faults=(Fault(3, "donated", times=2),)))
    for i, p in enumerate(prompts):
        h.submit(p, GREEDY, at_round=0 if i < 3 else 10)
    report = h.run()
    reasons = report.by_reason()
    assert reasons["error"] >= 1 and reasons["length"] >= 5
    for out in report.outputs.values():
        if out.finish_reason == "error":
            assert "injected donated fault" in out.error and "2 rounds in a row" in out.error
    check_run(h, report, cold_outputs(prompts, [GREEDY] * len(prompts)))


@policies
def test_recovery_failing_or_too_many_failed_rounds_stops_the_engine(policy: str) -> None:
    for core, message in (
        (engine(policy, faults=(Fault(2),), fail_reset=True), "recovery from a failed step"),
        (engine(policy, faults=(Fault(2, times=10),), step_retries=10), "4 rounds failed in a row"),
    ):
        h = Harness(core)
        for p in _shared_prefix(10, 3):
            h.submit(p, GREEDY)
        with pytest.raises(EngineFailure, match=message):
            h.run()
