"""Calibrate the round-cost estimator on the executor we can measure, and score it on a held-out run.

What is measured (model executor, CPU, one process):
  * **fit run**: workload A (RACE sessions, 16 output tokens, policy ``radixflow``) on a fresh engine; a line over
    the estimator's features (per round, per token slot, per row slot, per attention pair, per
    pairing token; ``engine/roundcost.py``) is fitted to its rounds' build + step times;
  * **held-out run**: workload B (RACE in bursts, other article and question lengths, more output
    tokens, policy ``pair``, another seed) on another fresh engine; none of its rounds is in the fit.
    Each held-out round's time is predicted from its features; the relative error is reported
    (median, p90, per round kind) beside a constant-per-round baseline (the fit run's mean);
  * **simulated time**: a simulated mirror of the held-out engine (same configuration and shapes)
    runs workload B on the fitted line (planning time included) on a virtual clock; its total round
    time and mean latency are printed beside the measured ones;
  * **noise**: the spread of one variant's repeated round times in the fit run (median over variants
    of the standard deviation of log time): the size of ``radixflow bench --sim-noise`` that makes
    the simulator vary like this executor.
Step variants compile on first use; compiling is never part of a round's step time.
``--repeats N`` alternates N fit / held-out pairs (fresh engines each) and reports medians.

Run (from the repository root, venv active)::

    python benchmarks/calibrate_cost.py                 # tiny-qwen3.5, about 3-4 minutes on 2 cores
    python benchmarks/calibrate_cost.py --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

from radixflow_jax.bench.calibration import CalibrationReport, calibration_report
from radixflow_jax.bench.driver import drive, summarize
from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.roundcost import LinearRoundCost


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-qwen3.5")
    p.add_argument("--fit-requests", type=int, default=48)
    p.add_argument("--held-requests", type=int, default=40)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def _workloads(args: argparse.Namespace, seed: int) -> tuple[list, list]:
    fit = generate(WorkloadSpec("race", num_requests=args.fit_requests, seed=seed, arrival="sessions", rate=20.0,
                                max_tokens=16))  # fmt: skip
    held = generate(WorkloadSpec("race", num_requests=args.held_requests, seed=seed + 100, arrival="burst", rate=30.0,
                                 article_len=220, question_len=40, max_tokens=10))  # fmt: skip
    return fit, held


def _one(model: Any, args: argparse.Namespace, ec: EngineConfig, seed: int) -> dict[str, Any]:
    from radixflow_jax.engine.build import build_engine
    from radixflow_jax.sim.engines import mirror_sim_engine

    fit_reqs, held_reqs = _workloads(args, seed)
    fit_engine = build_engine(model, ec.with_options(policy="radixflow"))
    drive(fit_engine, fit_reqs)
    held_engine = build_engine(model, ec.with_options(policy="pair"))
    held_out = drive(held_engine, held_reqs)
    report = calibration_report(fit_engine.records, held_engine.records)
    sim = mirror_sim_engine(held_engine, LinearRoundCost.from_records(fit_engine.records, with_plan=True))
    sim_out = drive(sim, held_reqs, wait=sim.clock.advance)
    measured = summarize("pair", held_engine, held_out, len(held_reqs))
    simulated = summarize("pair", sim, sim_out, len(held_reqs))
    busy = sum(r.plan_s + r.build_s + r.step_s for r in held_engine.records)
    return {
        "report": report, "summary": report.summary(), "measured_busy_s": busy,
        "simulated_busy_s": sum(r.step_s for r in sim.records), "measured_mean_latency_s": measured.mean_latency_s,
        "simulated_mean_latency_s": simulated.mean_latency_s, "measured_rounds": len(held_engine.records),
        "simulated_rounds": len(sim.records),
    }  # fmt: skip


def _print(runs: list[dict[str, Any]], load: tuple[float, ...], commit: str) -> None:
    med = {k: statistics.median(r["summary"][k] for r in runs) for k in runs[0]["summary"]}
    last: CalibrationReport = runs[-1]["report"]
    print(f"\ncommit {commit}, load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}, {len(runs)} repeat(s)")
    print(f"fit: {last.fit_rounds} rounds; held-out: {last.held_out_rounds} rounds (none in the fit)")
    print("coefficients (last repeat): " + ", ".join(f"{k} {v:.3g} s" for k, v in last.coef.items()))
    print(f"{'estimator':<28}{'median rel. error':>18}{'p90 rel. error':>16}")
    print(f"{'fitted line':<28}{med['median_error']:>18.1%}{med['p90_error']:>16.1%}")
    print(f"{'constant per round (mean)':<28}{med['baseline_median_error']:>18.1%}{med['baseline_p90_error']:>16.1%}")
    for kind, (n, line_err, base_err) in sorted(last.by_kind.items()):
        print(f"  {kind:<10} {n:>4} rounds: line {line_err:.1%}, constant {base_err:.1%} (median)")
    for key, label in (("busy_s", "total round time s"), ("mean_latency_s", "mean latency s"), ("rounds", "rounds")):
        m = statistics.median(r[f"measured_{key}"] for r in runs)
        s = statistics.median(r[f"simulated_{key}"] for r in runs)
        print(f"held-out {label}: measured {m:.3f}, simulated on the fitted line {s:.3f} ({(s - m) / m:+.1%})")
    noise = [r["report"].noise for r in runs if r["report"].noise is not None]
    if noise:
        print(f"round-time noise within a variant (sd of log time, median): {statistics.median(noise):.3f}")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.repeats < 1 or args.fit_requests < 1 or args.held_requests < 1:
        print("--repeats, --fit-requests and --held-requests must be >= 1", file=sys.stderr)
        return 2
    from radixflow_jax.models.api import load

    load0 = os.getloadavg()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    model = load(args.model)
    ec = EngineConfig.from_options(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024, warmup=False)
    runs = [_one(model, args, ec, seed) for seed in range(args.repeats)]
    _print(runs, load0, commit)
    if args.json:
        out = [{k: v for k, v in r.items() if k != "report"} | {"coef": r["report"].coef, "noise": r["report"].noise,
                                                                 "by_kind": r["report"].by_kind} for r in runs]
        with open(args.json, "w") as f:
            json.dump({"commit": commit, "model": args.model, "runs": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
