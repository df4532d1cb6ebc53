"""Speculative decoding on the simulator: a verify row's drafts are accepted with the given
probability per position (seeded), rounds carry verify rows like the model executor's, and an
engine without the acceptance refuses the option."""

from __future__ import annotations

import pytest

from radixflow_jax.bench.run import BenchConfig, sim_runner
from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.sim.engines import build_sim_engine
from radixflow_jax.sim.specs import DEVICE_SPECS, MODEL_SPECS


def _run(acceptance: tuple[float, ...], speculative: str | None):
    requests = generate(WorkloadSpec("multiturn", 24, seed=1, arrival="all"))
    ec = EngineConfig.from_options(max_num_seqs=16, max_num_batched_tokens=1024, speculative=speculative)
    cfg = BenchConfig(policies=("pair",), engine=ec, spec_acceptance=acceptance)
    run = sim_runner(MODEL_SPECS["qwen3.5-9b"], DEVICE_SPECS["h200"], requests, cfg)
    return run("pair")


def test_acceptance_sets_what_a_verify_row_yields() -> None:
    plain, _ = _run((), None)
    sure, recs = _run((1.0,), "ngram")
    assert sure.drafted_tokens > 0 and sure.accepted_tokens == sure.drafted_tokens
    never, _ = _run((0.0,), "ngram")
    assert never.drafted_tokens > 0 and never.accepted_tokens == 0
    half, _ = _run((0.9, 0.5), "ngram")
    assert 0 < half.accepted_tokens < half.drafted_tokens
    # the same work: every request runs to its max_tokens; whole drafts take fewer rounds
    assert sure.completed == never.completed == plain.completed == 24
    assert sure.rounds < half.rounds < never.rounds
    assert sure.mean_latency_s < plain.mean_latency_s


def test_a_simulated_engine_needs_the_acceptance() -> None:
    ec = EngineConfig.from_options(speculative="ngram")
    with pytest.raises(ValueError, match="acceptance per position"):
        build_sim_engine(MODEL_SPECS["qwen3.5-9b"], DEVICE_SPECS["h200"], ec)
