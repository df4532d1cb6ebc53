"""Issue-level checks of the paper's comparison on the real tiny models (model executor, CPU) and
of the simulated executor calibrated against it. Latency is compared in rounds (deterministic);
wall-clock comparisons belong to ``radixflow bench``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from radixflow_jax.bench.driver import drive
from radixflow_jax.bench.run import calibrate, mirror_sim_engine
from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.engine.core import EngineConfig
from radixflow_jax.engine.llm import build_engine
from radixflow_jax.models import load

CONFIG = EngineConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=256, warmup=False)


def _workload() -> list:
    spec = WorkloadSpec("race", num_requests=20, seed=3, arrival="all", article_len=120, question_len=20, max_tokens=2)
    return generate(spec)


def _run(model, policy: str):
    engine = build_engine(model, dataclasses.replace(CONFIG, policy=policy))
    outputs = drive(engine, _workload())
    return engine, outputs


def _stats(engine, outputs):
    reuse = sum(o.cached_tokens for o in outputs) / sum(o.prompt_tokens for o in outputs)
    latency_rounds = float(np.mean([o.finish_round for o in outputs]))
    return len(engine.records), latency_rounds, reuse


@pytest.fixture(scope="module")
def hybrid():
    return load("tiny-qwen3.5")


def test_radixflow_fewer_rounds_same_reuse_same_outputs(hybrid) -> None:
    native_engine, native_out = _run(hybrid, "native")
    flow_engine, flow_out = _run(hybrid, "radixflow")
    n_rounds, n_latency, n_reuse = _stats(native_engine, native_out)
    f_rounds, f_latency, f_reuse = _stats(flow_engine, flow_out)
    assert f_rounds < n_rounds
    assert f_latency < n_latency
    assert abs(f_reuse - n_reuse) <= 0.01 and f_reuse > 0.3
    assert [o.token_ids for o in flow_out] == [o.token_ids for o in native_out]
    assert sum(r.bubble_tokens for r in native_engine.records) > 0
    assert sum(r.bubble_tokens for r in flow_engine.records) == 0


def test_attention_only_control_is_unchanged() -> None:
    control = load("tiny-qwen3")
    n_rounds, _, _ = _stats(*_run(control, "native"))
    f_rounds, _, _ = _stats(*_run(control, "radixflow"))
    assert abs(f_rounds - n_rounds) <= 0.02 * n_rounds


def test_calibrated_simulator_predicts_the_model_executor(hybrid) -> None:
    engine, outputs = _run(hybrid, "radixflow")
    measured = sum(r.plan_s + r.build_s + r.step_s for r in engine.records)
    sim = mirror_sim_engine(engine, calibrate(engine))
    sim_outputs = drive(sim, _workload(), wait=sim.clock.advance)
    assert len(sim.records) == len(engine.records)
    assert [(r.num_tokens, r.num_rows) for r in sim.records] == [(r.num_tokens, r.num_rows) for r in engine.records]
    assert [o.cached_tokens for o in sim_outputs] == [o.cached_tokens for o in outputs]
    predicted = sum(r.step_s for r in sim.records)
    assert abs(predicted - measured) <= 0.2 * measured
