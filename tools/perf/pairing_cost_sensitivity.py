"""How much does `pair`'s simulated gain depend on the assumed cost of its extra scan?

The simulated H200 charges a round with paired consumers one more kernel per recurrent layer
(``DeviceSpec.kernel_launch_s``, an assumption) plus the pre-pass work (``sim/pairing_cost.py``);
the TPU specs charge a second scan with ``grid_step_s`` per grid step. This reruns steady-state rows
of docs/results.md section 1 (same arrivals: the rate found there for native at utilization ~0.8)
with those constants scaled, and prints native's and pair's mean latency side by side. The
simulator is deterministic: one run per cell.

    python tools/perf/pairing_cost_sensitivity.py                       # ~3 minutes
    python tools/perf/pairing_cost_sensitivity.py --scales 0,1,4,16 --device tpu-v6e
"""

from __future__ import annotations

import argparse
import dataclasses

from radixflow_jax.bench.paper import ENGINE, sessions
from radixflow_jax.bench.run import BenchConfig, run_sim
from radixflow_jax.sim.specs import ROUND_OVERHEAD_GRAPH_S, get_device_spec, get_model_spec

ROWS = (("qwen3.5-9b", "race", 24.6), ("qwen3.5-27b", "race", 8.8), ("nemotron-h-8b", "race", 23.4))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scales", default="0,1,4,16", help="multiples of the launch / grid-step constants")
    p.add_argument("--device", default="h200")
    p.add_argument("--requests", type=int, default=1500)
    args = p.parse_args()
    scales = [float(x) for x in args.scales.split(",")]
    base = get_device_spec(args.device)
    print(f"device {args.device}: kernel_launch_s {base.kernel_launch_s:g}, grid_step_s {base.grid_step_s:g}, "
          f"backend {base.backend}")  # fmt: skip
    print("| model | workload @ articles/s | scale | native mean lat (s) | pair mean lat (s) | pair vs native |")
    print("|---|---|---|---|---|---|")
    for name, workload, rate in ROWS:
        reqs = sessions(workload, args.requests, rate)
        cfg = BenchConfig(policies=("native", "pair"), engine=ENGINE, overhead_s=ROUND_OVERHEAD_GRAPH_S)
        for scale in scales:
            dev = dataclasses.replace(
                base, kernel_launch_s=base.kernel_launch_s * scale, grid_step_s=base.grid_step_s * scale
            )
            nat, pair = run_sim(get_model_spec(name), dev, reqs, cfg)
            change = (pair.mean_latency_s - nat.mean_latency_s) / nat.mean_latency_s
            print(f"| {name} | {workload} @{rate:g} | {scale:g}x | {nat.mean_latency_s:.3f} | "
                  f"{pair.mean_latency_s:.3f} | {change:+.1%} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
