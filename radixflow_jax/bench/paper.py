"""The paper's comparison grid, shared by ``benchmarks/paper_table.py`` (which regenerates
``docs/results.md``) and ``tools/perf/pair_matrix.py``: the hybrid models with their simulated
devices, the full-attention control, the overload bursts, the engine budgets, and one simulated run
of a set of policies. No JAX: the simulated executor only."""

from __future__ import annotations

from typing import Sequence

from radixflow_jax.bench.driver import RunResult
from radixflow_jax.bench.run import BenchConfig, run_sim
from radixflow_jax.bench.workloads import BenchRequest, WorkloadSpec, generate
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.sim.specs import ROUND_OVERHEAD_GRAPH_S, get_device_spec, get_model_spec

HYBRIDS = (
    ("qwen3.5-4b", "h200"),
    ("qwen3.5-9b", "h200"),
    ("qwen3.5-27b", "h200"),
    ("qwen3.5-35b-a3b", "h200"),
    ("qwen3-next-80b-a3b", "h200x2"),
    ("nemotron-h-8b", "h200"),
)
CONTROL = ("qwen3-8b", "h200")
OVERLOAD = (("race", "burst", 80.0, 1500), ("quality", "burst", 8.0, 300))  # workload, arrival, rate, requests
ENGINE = EngineConfig.from_options(max_num_seqs=64, max_num_batched_tokens=8192)


def sim_runs(
    name: str,
    device: str,
    requests: Sequence[BenchRequest],
    overhead: float = ROUND_OVERHEAD_GRAPH_S,
    buckets: str = "fine",
    policies: Sequence[str] = ("native", "radixflow"),
) -> list[RunResult]:
    """One simulated run per policy of ``requests`` on model spec ``name`` over ``device``, padded
    to the runner's ``buckets`` mode (``fine``: the engine's default)."""
    engine = ENGINE.with_options(bucket_mode=buckets)
    cfg = BenchConfig(policies=tuple(policies), engine=engine, overhead_s=overhead)
    return run_sim(get_model_spec(name), get_device_spec(device), list(requests), cfg)


def sessions(workload: str, n: int, rate: float) -> list[BenchRequest]:
    """``n`` requests of ``workload`` in per-article sessions at ``rate`` articles/s (seed 0)."""
    return generate(WorkloadSpec(workload, num_requests=n, arrival="sessions", rate=rate, seed=0))
