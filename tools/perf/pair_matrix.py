"""Policy ``pair`` vs native and radixflow on the simulated H200 (issue 12's acceptance matrix):
session arrivals (RACE 1500 requests, QuALITY 300) at rates where native's utilization is about
0.6, 0.8 and 0.9 (the 0.8 rates of docs/results.md section 1, scaled by 0.75 and 1.12), for
qwen3.5-9b, qwen3.5-27b and qwen3.5-35b-a3b. Prints one markdown row per case.

    python tools/perf/pair_matrix.py            # sessions
    python tools/perf/pair_matrix.py --bursts   # the burst rows of docs/results.md section 3
"""

from __future__ import annotations

from radixflow_jax.bench.paper import CONTROL, HYBRIDS, OVERLOAD, sessions, sim_runs

RATES_08 = {  # articles/s at native utilization ~0.8 (docs/results.md section 1)
    ("qwen3.5-9b", "race"): 20.0, ("qwen3.5-27b", "race"): 8.26, ("qwen3.5-35b-a3b", "race"): 26.4,
    ("qwen3.5-9b", "quality"): 2.4, ("qwen3.5-27b", "quality"): 0.868, ("qwen3.5-35b-a3b", "quality"): 5.51,
}  # fmt: skip
SCALES = (0.75, 1.0, 1.12)


def main() -> None:
    print("| model | workload | articles/s | native util | mean lat native / radixflow / pair (s) | pair vs native | pair vs radixflow | rounds n / rf / pair | reuse n / rf / pair |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, workload), rate08 in RATES_08.items():
        n = 1500 if workload == "race" else 300
        for scale in SCALES:
            rate = round(rate08 * scale, 3)
            nat, flow, pair = sim_runs(name, "h200", sessions(workload, n, rate), policies=("native", "radixflow", "pair"))
            lat = [r.mean_latency_s for r in (nat, flow, pair)]
            print(
                f"| {name} | {workload} | {rate} | {nat.utilization:.2f} | {lat[0]:.3f} / {lat[1]:.3f} / {lat[2]:.3f} "
                f"| {lat[2] / lat[0] - 1:+.1%} | {lat[2] / lat[1] - 1:+.1%} | {nat.rounds} / {flow.rounds} / {pair.rounds} "
                f"| {nat.reuse:.1%} / {flow.reuse:.1%} / {pair.reuse:.1%} |",
                flush=True,
            )




def bursts() -> None:
    """The burst rows of docs/results.md section 3 (every hybrid and the control) with ``pair``."""
    from radixflow_jax.bench.workloads import WorkloadSpec, generate

    print("| model | workload | mean lat native / radixflow / pair (s) | pair vs native | pair vs radixflow | reuse n / rf / pair |")
    print("|---|---|---|---|---|---|")
    for workload, arrival, rate, n in OVERLOAD:
        reqs = generate(WorkloadSpec(workload, num_requests=n, arrival=arrival, rate=rate, seed=0))
        for name, device in HYBRIDS + (CONTROL,):
            nat, flow, pair = sim_runs(name, device, reqs, policies=("native", "radixflow", "pair"))
            lat = [r.mean_latency_s for r in (nat, flow, pair)]
            print(
                f"| {name} ({device}) | {workload} {arrival} @{rate:g}/s, {n} req | {lat[0]:.3f} / {lat[1]:.3f} / "
                f"{lat[2]:.3f} | {lat[2] / lat[0] - 1:+.1%} | {lat[2] / lat[1] - 1:+.1%} "
                f"| {nat.reuse:.1%} / {flow.reuse:.1%} / {pair.reuse:.1%} |",
                flush=True,
            )


if __name__ == "__main__":
    import sys

    bursts() if sys.argv[1:] == ["--bursts"] else main()
