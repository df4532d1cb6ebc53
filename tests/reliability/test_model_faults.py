"""Faults on the model executor (the real jitted step, tiny-qwen3.5 on the CPU): failed steps of
every kind, including one whose donated pools are gone (deleted buffers: a step that ran on them
again would raise), and a short soak with random aborts (between rounds and while a round runs)
and a failed step, auditing the engine before and after every round. Completed greedy outputs
equal the cold (cache-off) run."""

from __future__ import annotations

import dataclasses

import pytest

from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.reliability.faults import Fault, FaultyExecutor
from radixflow_jax.reliability.harness import Harness, HarnessReport
from radixflow_jax.engine.build import build_engine
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.engine.build import assemble_engine
from tests.engine.workloads import SMALL_FIXED, shared_prefix_prompts

# the fixed-bucket engine shape of tests/engine/test_engine.py: one step variant, shared through the
# persistent XLA cache (failed steps, resets and aborts do not depend on the bucket)
CONFIG = EngineConfig.from_options(**SMALL_FIXED)
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("tiny-qwen3.5")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return shared_prefix_prompts(num_prefixes=2, per_prefix=4, prefix_len=150, suffix_len=10, vocab=500)


@pytest.fixture(scope="module")
def base(model) -> EngineCore:
    """One model executor (its compiled variants) that every engine of this module runs on."""
    return build_engine(model, CONFIG)


def _run(base: EngineCore, prompts, *, faults=(), aborts=(), **options) -> tuple[Harness, HarnessReport]:
    spec = dataclasses.replace(base.spec, config=CONFIG.with_options(**options))
    base.executor.reset()  # zeroed pools, the same compiled variants
    core = assemble_engine(spec, lambda shapes: FaultyExecutor(base.executor, faults))
    h = Harness(core)
    for i, p in enumerate(prompts):
        abort_at, mid = aborts[i] if i < len(aborts) else (None, False)
        h.submit(p, PARAMS, at_round=i // 3, abort_at=abort_at, mid_round=mid)
    return h, h.run()


@pytest.fixture(scope="module")
def cold(base, prompts) -> list[list[int]]:
    _, report = _run(base, prompts, policy="no-cache")
    assert report.by_reason()["length"] == len(prompts)
    return [report.outputs[i].token_ids for i in range(len(prompts))]


def _check(h: Harness, report: HarnessReport, cold: list[list[int]]) -> None:
    assert h.violations == [] and not report.refused
    for key, tokens in report.completed().items():
        assert tokens == cold[key], key
    mem = h.core.scheduler.memory
    assert mem.pages.num_used == 0 and mem.slots.num_used == 0


def test_model_soak_failed_steps_of_every_kind_and_random_aborts(base, prompts, cold) -> None:
    """Failed steps before the device ran, after it ran, and with the donated pools deleted, plus
    aborts between rounds and while a round runs: the engine rebuilds, retries and completes every
    request that was not aborted with the cold outputs, the audit passing before and after every round."""
    aborts = [(None, False), (3, True), (None, False), (None, False), (4, False), (None, False), (6, True)]
    faults = (Fault(2, "before"), Fault(5, "donated"), Fault(9, "after"))
    # two retries: a request may wait (not run) between two failed rounds, which then count as in a row
    h, report = _run(base, prompts, faults=faults, aborts=aborts, step_retries=2)
    reasons = report.by_reason()
    assert report.step_failures == 3 and report.resets == 3 and report.audits == 2 * report.ticks
    assert reasons["abort"] >= 2 and reasons["length"] >= 4 and reasons["error"] == 0, reasons
    assert reasons["abort"] + reasons["length"] == len(prompts)
    assert sum(o.cached_tokens for o in report.outputs.values()) > 0
    _check(h, report, cold)
