"""Overlap on the shadow device (no JAX): every context, state and checkpoint read of every row is
checked (``reliability/shadow.py``) while the engine plans round r+1 before round r commits, under a
short page pool (preemption), aborts between rounds and while rounds run, and failed rounds. The
shadow runs the rounds in launch order, as the device does; a row's ``UNKNOWN_TOKEN`` input is the
sample of the round launched before it, and the KV and state it reads are checked against the
request's tokens as they were when the row was launched."""

from __future__ import annotations

import dataclasses
import random
import types
from typing import Mapping

import pytest

from radixflow_jax.engine.config import ServingClock
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.reliability.faults import Fault, FaultyExecutor
from radixflow_jax.reliability.harness import Harness
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.engine.protocol import ExecutorCapabilities, StepResult
from radixflow_jax.reliability.shadow import ShadowExecutor
from radixflow_jax.sim.executor import VirtualClock
from radixflow_jax.engine.build import assemble_engine
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.runner.inputs import SamplingRow
from radixflow_jax.scheduler.plan import UNKNOWN_TOKEN, RoundPlan
from tests.reliability.scenarios import BASE, CACHING_POLICIES, cold_outputs, tokens


@dataclasses.dataclass
class _ShadowLaunch:
    """A launched round: run by the shadow at ``collect``; ``sampled`` once collected."""

    plan: RoundPlan
    sampling: Mapping[int, SamplingRow]
    prev: _ShadowLaunch | None
    snapshot: dict[int, list[int]]
    sampled: dict[int, int] | None = None
    compile_s: float = 0.0


class LaunchOrderShadow:
    """The shadow executor behind ``launch`` / ``collect`` (see the module docstring)."""

    capabilities = ExecutorCapabilities(overlap=True)

    def __init__(self, inner: ShadowExecutor):
        self.inner = inner
        self.core: EngineCore | None = None
        self.spliced = 0  # rows whose input token came from the previous round's samples
        self._truth: dict[int, list[int]] = {}
        inner.truth = lambda rid: self._truth[rid]

    def execute(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow]) -> StepResult:
        return self.collect(self.launch(plan, sampling))

    def launch(
        self, plan: RoundPlan, sampling: Mapping[int, SamplingRow], prev: _ShadowLaunch | None = None
    ) -> _ShadowLaunch:
        reqs = self.core.scheduler.requests
        snapshot = {row.request_id: list(reqs[row.request_id].tokens) for row in plan.rows}
        return _ShadowLaunch(plan, sampling, prev, snapshot)

    def collect(self, handle: _ShadowLaunch) -> StepResult:
        plan, sampling, prev, snapshot = handle.plan, handle.sampling, handle.prev, handle.snapshot
        before = prev.sampled if prev is not None else {}  # the previous round's samples (collected first)
        rows, truth = [], {}
        for row in plan.rows:
            if row.tokens[-1] == UNKNOWN_TOKEN:
                row = dataclasses.replace(row, tokens=row.tokens[:-1] + (before[row.request_id],))
                self.spliced += 1
            assert UNKNOWN_TOKEN not in row.tokens and UNKNOWN_TOKEN not in snapshot[row.request_id][: row.start]
            truth[row.request_id] = snapshot[row.request_id][: row.start] + list(row.tokens)
            rows.append(row)
        self._truth = truth
        result = self.inner.execute(dataclasses.replace(plan, rows=tuple(rows)), sampling)
        handle.sampled = result.sampled
        return result

    def reset(self) -> None:
        self.inner.reset()

    def lose_device_state(self) -> None:
        self.inner.lose_device_state()


def _spec(config, *, hybrid: bool, num_pages: int, num_slots: int) -> EngineSpec:
    return EngineSpec(
        config=config,
        hybrid=hybrid,
        chunk_sizes=(16,) if hybrid else (),
        num_pages=num_pages,
        num_slots=num_slots,
        max_model_len=BASE.max_model_len,
    )


def _engine(policy: str, *, num_pages: int, faults=()) -> tuple[EngineCore, LaunchOrderShadow]:
    config = BASE.with_options(policy=policy, overlap=True)
    clock = VirtualClock()
    shadow = ShadowExecutor(config.scheduler.page_size, hybrid=True, vocab=1000, clock=clock)
    adapter = LaunchOrderShadow(shadow)
    spec = _spec(config, hybrid=True, num_pages=num_pages, num_slots=16)
    core = assemble_engine(spec, lambda shapes: FaultyExecutor(adapter, faults), clock=clock)
    adapter.core = core
    assert core.overlap
    return core, adapter


@pytest.mark.parametrize("policy", CACHING_POLICIES)
def test_overlap_reads_check_out_under_preemption_aborts_and_faults(policy: str) -> None:
    rng = random.Random(7)
    prefixes = [tokens(rng, 40), tokens(rng, 56)]
    # even requests share a prefix (cache hits, checkpoints), odd ones do not (the pool runs short)
    prompts = [(prefixes[i % 4 // 2] if i % 2 == 0 else tokens(rng, 56)) + tokens(rng, 3 + i % 5) for i in range(12)]
    params = [SamplingParams(max_tokens=24, ignore_eos=True)] * len(prompts)
    cold = cold_outputs(prompts, params)
    core, adapter = _engine(policy, num_pages=30, faults=(Fault(4, "donated"), Fault(9, "after"), Fault(13, "before")))
    core.step_retries = 3
    h = Harness(core)
    aborts = {2: (3, True), 5: (5, False), 9: (8, True)}
    for i, p in enumerate(prompts):
        abort_at, mid = aborts.get(i, (None, False))
        h.submit(p, params[i], at_round=i // 3, abort_at=abort_at, mid_round=mid)
    report = h.run()
    assert adapter.inner.violations == [] and h.violations == []
    assert report.step_failures == 3 and report.preemptions > 0 and adapter.spliced > 0
    assert sum(r.overlapped for r in core.records) > len(core.records) // 2
    reasons = report.by_reason()
    assert reasons["abort"] >= 2 and reasons["error"] == 0, reasons
    for key, out in report.completed().items():
        assert out == cold[key], key
    mem = core.scheduler.memory
    assert mem.pages.num_used == 0 and mem.slots.num_used == 0


def _attention_only_run(policy: str, overlap: bool, prompts: list[list[int]]) -> tuple[EngineCore, object]:
    config = BASE.with_options(policy=policy, overlap=overlap)
    clock = VirtualClock()
    shadow = ShadowExecutor(config.scheduler.page_size, hybrid=False, vocab=1000, clock=clock)
    adapter = LaunchOrderShadow(shadow)
    spec = _spec(config, hybrid=False, num_pages=120, num_slots=1)
    core = assemble_engine(spec, lambda shapes: adapter, clock=clock)
    adapter.core = core
    h = Harness(core)
    for p in prompts:
        h.submit(p, SamplingParams(max_tokens=4, ignore_eos=True))
    report = h.run()
    assert adapter.inner.violations == [] and h.violations == []
    return core, report


@pytest.mark.parametrize("policy", CACHING_POLICIES)
def test_attention_only_overlap_keeps_burst_reuse(policy: str) -> None:
    """Attention-only models: a round in flight publishes the pages it writes as pending KV, so its
    prompts' siblings planned meanwhile wait for its commit and hit, as without overlap (before,
    they computed the shared prefix cold: burst reuse of the tiny control halved, docs/results.md)."""
    rng = random.Random(3)
    articles = [tokens(rng, 40) for _ in range(3)]
    prompts = [articles[i // 4] + tokens(rng, 4 + i % 3) for i in range(12)]  # 4 questions per article
    cold = cold_outputs(prompts, [SamplingParams(max_tokens=4, ignore_eos=True)] * len(prompts))
    reuse = {}
    for overlap in (False, True):
        core, report = _attention_only_run(policy, overlap, prompts)
        assert core.overlap == overlap
        outs = report.completed()
        assert [outs[i] for i in range(len(prompts))] == cold
        reuse[overlap] = sum(o.cached_tokens for o in report.outputs.values())
        core.scheduler.memory.flush()
        assert core.scheduler.memory.pages.num_used == 0
    assert reuse[True] >= reuse[False] > 0, reuse


class CompilingOnFirstUse:
    """A JAX-free overlap executor whose second launch reports ``compile_s`` seconds of first-use
    compiling on its handle and result (no time passes: the engine's bookkeeping is what is checked).
    ``paused_at_collect`` records the engine clock's paused seconds when each round is collected."""

    capabilities = ExecutorCapabilities(overlap=True)

    def __init__(self, compile_s: float):
        self.compile_s, self.launches = compile_s, 0
        self.core: EngineCore | None = None
        self.paused_at_collect: list[float] = []

    def execute(self, plan: RoundPlan, sampling) -> StepResult:
        return self.collect(self.launch(plan, sampling))

    def launch(self, plan: RoundPlan, sampling, prev: object = None) -> types.SimpleNamespace:
        self.launches += 1
        return types.SimpleNamespace(plan=plan, compile_s=self.compile_s if self.launches == 2 else 0.0)

    def collect(self, handle: types.SimpleNamespace) -> StepResult:
        self.paused_at_collect.append(self.core.clock.paused_s)
        sampled = {row.request_id: 7 for row in handle.plan.rows if row.sample}
        return StepResult(sampled, handle.plan.num_tokens, len(handle.plan.rows), 0.0, 0.001, compile_s=handle.compile_s)

    def reset(self) -> None:
        pass


def test_first_use_compile_inside_a_launch_is_off_the_serving_clock() -> None:
    """Overlap: a compile inside round r+1's launch happens before round r commits, so the engine
    takes it off its serving clock when the launch returns: round r's finishers (stamped at its
    commit, right after its collect) do not carry it in their latency, and it is taken off once
    (before, only at r+1's commit)."""
    config = BASE.with_options(policy="radixflow", overlap=True)
    executor = CompilingOnFirstUse(compile_s=0.5)
    core = assemble_engine(_spec(config, hybrid=True, num_pages=80, num_slots=16), lambda shapes: executor)
    executor.core = core
    assert core.overlap and isinstance(core.clock, ServingClock)
    for i in range(2):  # the first finishes in round 1, committed after round 2's launch
        core.add_request([5 + i, 6, 7, 8], SamplingParams(max_tokens=1 + 2 * i, ignore_eos=True))
    finished_in = {}
    while core.has_unfinished():
        finished_in.update((o.request_id, o.finish_round) for o in core.step() if o.finish_time is not None)
    assert finished_in[min(finished_in)] == 1 and executor.launches >= 3
    assert executor.paused_at_collect[0] == 0.5  # round 1 collected (and committed) after the pause
    assert core.clock.paused_s == 0.5  # once, not again at round 2's commit



@pytest.mark.parametrize("policy", CACHING_POLICIES)
def test_two_requests_in_a_short_pool_finish_under_overlap(policy: str) -> None:
    """Two requests of 11 and 12 pages in a 16-page pool, the engine's overlap loop on the shadow
    (the case of ``tests/scheduler/test_overlap_liveness.py`` with page and grid doubled). Before
    2026-12-01 the one short of pages preempted the other while that one's last token was in
    flight, and the two did so to each other forever (600 rounds without an end here); now both
    finish, with the cold run's outputs."""
    rng = random.Random(3)
    late, early = tokens(rng, 72), tokens(rng, 88)
    params = [SamplingParams(max_tokens=6, ignore_eos=True), SamplingParams(max_tokens=12, ignore_eos=True)]
    cold = cold_outputs([early, late], params)
    core, adapter = _engine(policy, num_pages=17)  # id 0 is reserved
    h = Harness(core)
    h.submit(early, params[0], at_round=0)
    h.submit(late, params[1], at_round=1)
    report = h.run(max_ticks=600)
    assert adapter.inner.violations == [] and h.violations == []
    assert report.by_reason()["length"] == 2, report.by_reason()
    for key, out in report.completed().items():
        assert out == cold[key], key


@pytest.mark.parametrize("policy", CACHING_POLICIES)
def test_overlap_conversations_return_through_the_host_tier(policy: str) -> None:
    """Overlapped rounds over a host tier: turns find their exact ends demoted and read them back
    (host reads into their slots, or restores), a fault voids rounds in flight; every read checks
    out against the launch-order shadow and every output equals the cold run."""
    from radixflow_jax.reliability.soak import cold_tokens

    config = BASE.with_options(policy=policy, overlap=True)
    clock = VirtualClock()
    adapter = LaunchOrderShadow(ShadowExecutor(config.scheduler.page_size, hybrid=True, vocab=1000, clock=clock))
    spec = dataclasses.replace(_spec(config, hybrid=True, num_pages=200, num_slots=1 + 4 + 2), num_host_slots=32)
    core = assemble_engine(spec, lambda shapes: FaultyExecutor(adapter, (Fault(12, "donated"),)), clock=clock)
    adapter.core = core
    rng = random.Random(11)
    h = Harness(core)
    turn_of: dict[int, int] = {}
    params = SamplingParams(max_tokens=6, ignore_eos=True)

    def finished(key: int, out) -> None:
        if turn_of[key] + 1 < 4:
            nxt = h.follow_up(h.subs[key].prompt + out.token_ids + tokens(rng, rng.choice([1, 5, 19])), params)
            turn_of[nxt] = turn_of[key] + 1

    h.on_finished.append(finished)
    for s in range(6):
        turn_of[h.submit(tokens(rng, rng.randint(20, 40)), params, at_round=s)] = 0
    report = h.run()
    assert adapter.inner.violations == [] and h.violations == [] and report.step_failures == 1
    assert report.by_reason()["length"] == 24
    for key, out in report.completed().items():
        assert out == cold_tokens(h.subs[key].prompt, 6, 1000), key
    assert sum(r.restored for r in core.records) > 5
    assert sum(r.overlapped for r in core.records) > len(core.records) // 2
