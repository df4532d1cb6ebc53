"""The section-5 burst of docs/results.md with overlap off and on, side by side: rounds, reuse and
mean latency per policy for a tiny attention-only control and a tiny hybrid (the model executor).

What is measured
  * The workload of ``paper_table.py --tiny-only`` (RACE, per-article bursts at 50 articles/s,
    32 requests) on an engine of 8 rows and 512 tokens per round, for each model and each mode
    (``overlap=False`` then ``overlap=True``): ``--repeats`` interleaved runs per policy on fresh
    engines over one loaded model (``bench.run.run_model``), medians reported. Rounds and reuse are
    the scheduler's; latency is wall time with first-use compiles off the engine's clock.
  * The load average is printed before and after: on a shared machine, read the side-by-side
    differences, not the absolute times.

Run (repository root, venv active)::

    python tools/perf/overlap_burst.py
    python tools/perf/overlap_burst.py --models tiny-qwen3 --repeats 5
"""

from __future__ import annotations

import argparse
import os

from radixflow_jax.bench.run import BenchConfig, run_model
from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.paths import xla_cache_dir

POLICIES = ("native", "radixflow", "pair")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny-qwen3,tiny-qwen3.5", help="comma-separated presets")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"load average before: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    requests = generate(WorkloadSpec("race", num_requests=32, arrival="burst", rate=50.0, seed=0))
    print("| model | mode | rounds " + " / ".join(POLICIES) + " | reuse | mean latency (s) |")
    print("|---|---|---|---|---|")
    for name in args.models.split(","):
        for overlap in (False, True):
            engine = EngineConfig.from_options(
                max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024,
                compilation_cache_dir=xla_cache_dir(), overlap=overlap,
            )  # fmt: skip
            results = run_model(name, requests, BenchConfig(policies=POLICIES, engine=engine), repeats=args.repeats)
            rounds = " / ".join(str(r.rounds) for r in results)
            reuse = " / ".join(f"{r.reuse:.1%}" for r in results)
            latency = " / ".join(f"{r.mean_latency_s:.3f}" for r in results)
            mode = "overlap" if overlap else "synchronous"
            print(f"| {name} | {mode} | {rounds} | {reuse} | {latency} |", flush=True)
    print(f"load average after: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
