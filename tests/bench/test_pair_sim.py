"""Policy ``pair`` on the simulated executor (roofline H200): with the cost-aware fill rule it beats
radixflow on mean latency at steady state and stays within 2 % of native, at equal reuse (a small slice of the
acceptance matrix of ``tools/perf/pair_matrix.py``)."""

from __future__ import annotations

from radixflow_jax.bench.run import BenchConfig, run_sim
from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.sim.specs import get_device_spec, get_model_spec


def test_pair_beats_native_and_radixflow_on_dense_hybrid_sessions() -> None:
    requests = generate(WorkloadSpec("race", num_requests=400, arrival="sessions", rate=20.0, seed=0))
    cfg = BenchConfig(
        policies=("native", "radixflow", "pair"),
        engine=EngineConfig.from_options(max_num_seqs=64, max_num_batched_tokens=8192),
    )
    (native, flow, pair), records = run_sim(
        get_model_spec("qwen3.5-9b"), get_device_spec("h200"), requests, cfg, with_records=True
    )
    assert pair.mean_latency_s < flow.mean_latency_s  # the 1500-request rows are in docs/results.md
    # on this 400-request slice (warm-up dominated) pair is held within 2 % of native; the 1500-request rows of
    # docs/results.md are the acceptance numbers
    assert pair.mean_latency_s <= 1.02 * native.mean_latency_s
    assert abs(pair.reuse - flow.reuse) <= 0.01
    assert pair.rounds < flow.rounds
    assert pair.consumers_paired > 0
