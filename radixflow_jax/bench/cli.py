"""``radixflow bench``: one workload, several policies side by side, one table (and JSON / plots).

With no arguments: the ``tiny-qwen3.5`` preset on the model executor, the ``race`` workload in
per-article bursts, ``native``, ``radixflow`` and ``pair``. On the model executor it first runs
every policy once untimed (``--warmup-runs``, default 1: the step variants the workload uses compile
there, and nothing a first round loads falls on a timed run), then ``--repeats`` (default
:data:`MODEL_REPEATS`) timed runs with the policies interleaved within each repeat (native,
radixflow, pair, native, ...), so drift of the machine hits every policy alike. The table holds the
medians over the repeats; each policy's change against the first is the median of its per-repeat
changes, printed with their min-max range. The simulated executor is deterministic: one run, no
warm-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
from typing import Any

from radixflow_jax.bench.driver import COLUMNS, RunResult
from radixflow_jax.bench.repeats import Change, Repeated, paired_changes
from radixflow_jax.bench.run import BenchConfig, model_runner, run_policies, sim_runner
from radixflow_jax.bench.sweep import format_sweep, parse_rates, plot_sweep, sweep, sweep_json
from radixflow_jax.runner.shapes import MODES
from radixflow_jax.bench.workloads import ARRIVALS, WORKLOADS, BenchRequest, WorkloadSpec, generate
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.sim.specs import DEVICE_SPECS, MODEL_SPECS, get_device_spec, get_model_spec
from radixflow_jax.paths import xla_cache_dir

# timed repeats of a model-executor run by default: with 5, the sign of pair's and radixflow's change
# in mean latency against native on the default workload held in every default run measured
# (docs/performance.md, "Start-up and `radixflow bench`")
MODEL_REPEATS = 5

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-qwen3.5", help="preset, model directory, or a model spec (sim)")
    p.add_argument("--executor", choices=("model", "sim"), default=None, help="default: sim for a spec name")
    p.add_argument("--device", default="h200", help=f"sim device: {', '.join(DEVICE_SPECS)}")
    p.add_argument("--workload", default="race", help=f"{', '.join(WORKLOADS)} or a .jsonl file")
    p.add_argument("--policies", default="native,radixflow,pair")
    p.add_argument("--num-requests", type=int, default=None)
    p.add_argument("--arrival", default="burst", choices=ARRIVALS)
    p.add_argument("--rate", type=float, default=None, help="burst, sessions: articles/s; poisson: requests/s")
    p.add_argument("--session-window", type=float, default=0.0, help="sessions: spread an article's questions (s)")
    p.add_argument("--sweep-rates", default=None, help="R1,R2,...: run every policy at each rate (latency vs load)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"timed runs per policy, interleaved (medians and spreads; default {MODEL_REPEATS} on the model executor, 1 on sim)")  # fmt: skip
    p.add_argument("--warmup-runs", type=int, default=None,
                   help="untimed runs of every policy first (default 1 on the model executor, 0 on sim)")  # fmt: skip
    p.add_argument("--buckets", default="fine", choices=MODES, help="step shapes rounds are padded to (runner/shapes.py)")
    p.add_argument("--mixed-layout", default="auto", choices=("auto", "window", "packed"),
                   help="where decoding rows of rounds with prompts run (runner/shapes.py; auto: packed on the CPU "
                   "model executor)")  # fmt: skip
    p.add_argument("--speculative", default=None, choices=("ngram",),
                   help="speculative decoding of greedy requests: ngram drafts (scheduler/drafts.py)")
    p.add_argument("--spec-acceptance", default=None,
                   help="sim with --speculative: per drafted position, the probability its token is accepted "
                        "given the earlier ones were, comma-separated (the last repeats), e.g. 0.72")
    p.add_argument("--sim-noise", type=float, default=0.0, help="sim: relative noise of round times (seeded)")
    p.add_argument(
        "--round-overhead-ms", type=float, default=None, help="sim: fixed cost per round (default: the device spec's)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replicas", type=int, default=1, help="sim: data-parallel engine replicas behind a router")
    p.add_argument("--router", default="prefix", help="--replicas: prefix | round-robin | least-loaded")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=None, help="override the workload's output length")
    p.add_argument("--turns", type=int, default=None, help="multiturn, agentic: turns per conversation (4, 5)")
    p.add_argument("--think-time", type=float, default=0.0,
                   help="multiturn, agentic: mean seconds from an answer to the next turn (exponential, seeded)")
    p.add_argument("--num-state-slots", type=int, default=None,
                   help="the device's recurrent-state slots (default: sized from memory)")
    p.add_argument("--host-cache-gb", type=float, default=None,
                   help="host tier for evicted checkpoints and KV pages, GiB (default: model executor an eighth "
                        "of RAM, at most 4; sim none; 0: off)")
    p.add_argument("--host-kv-fraction", type=float, default=None,
                   help="the host tier's share for KV pages, 0-1 (default: the device pools' split by bytes)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--json", dest="json_out", default=None)
    p.add_argument("--plot", default=None, help="PNG path: slot occupancy per round and latency CDFs")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-compile-cache", action="store_true", help="do not keep compiled steps on disk")
    p.add_argument("--url", default=None, help="send the workload to a running `radixflow serve` over HTTP instead")
    p.add_argument("--api-key", default=None, help="--url: the server's API key")
    p.add_argument("--served-model-name", default=None, help="--url: the model id to send")
    p.add_argument("--concurrency", type=int, default=None, help="--url: at most this many requests in flight")


def _requests(args: argparse.Namespace, executor: str, encode: Any, rate: float | None = None) -> list[BenchRequest]:
    if args.workload.endswith(".jsonl"):
        from radixflow_jax.bench.jsonl import read_jsonl

        return read_jsonl(args.workload, encode)
    default_n = 40 if executor == "model" else 2000
    if rate is None:
        rate = args.rate if args.rate is not None else (50.0 if executor == "model" else 400.0)
    spec = WorkloadSpec(
        args.workload,
        num_requests=args.num_requests or default_n,
        seed=args.seed,
        arrival=args.arrival,
        rate=rate,
        max_tokens=args.max_tokens,
        session_window=args.session_window,
        turns=args.turns,
        think_time=args.think_time,
    )
    return generate(spec, encode)


def _progress(enabled: bool) -> Any:
    if not enabled:
        return None

    def show(policy: str, done: int, total: int) -> None:
        if done != total and (30 * done // max(total, 1)) == (30 * (done - 1) // max(total, 1)):
            return  # redraw only when the bar grows
        bar = "#" * (30 * done // max(total, 1))
        sys.stderr.write(f"\r{policy:>10} [{bar:<30}] {done}/{total}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


def _change_cell(change: Change, points: bool, spread: bool) -> str:
    """``-3.8%`` (one repeat, or the same change in every repeat) or ``-3.8% [-9.1,+2.0]``: the
    median per-repeat change and its range (in %, or points of reuse)."""
    fmt = (lambda x: f"{x:+.1f}pt") if points else (lambda x: f"{x:+.1%}")
    if not spread or change.lo == change.hi:
        return fmt(change.median)
    lo, hi = (f"{x:+.1f}" if points else f"{100 * x:+.1f}" for x in (change.lo, change.hi))
    return f"{fmt(change.median)} [{lo},{hi}]"


def format_table(reps: list[Repeated]) -> str:
    """The medians of every policy, then each later policy's change against the first: the median of
    its per-repeat changes, with their min-max range in brackets when there are several repeats."""
    runs = [r.median for r in reps]
    head = ["policy"] + [c[1] for c in COLUMNS]
    rows = [[r.policy] + [fmt.format(getattr(r, key)) for key, _, fmt in COLUMNS] for r in runs]
    for rep in reps[1:]:
        changes = paired_changes(reps[0], rep)
        spread = len(rep.runs) > 1
        cells = []
        for key, _, _ in COLUMNS:
            if key in changes:
                cells.append(_change_cell(changes[key], False, spread))
            elif key == "reuse":
                cells.append(_change_cell(changes["reuse_points"], True, spread))
            else:
                cells.append("")
        rows.append([f"{rep.median.policy} vs {runs[0].policy}"] + cells)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = ["  ".join(str(c).rjust(w) for c, w in zip(line, widths)) for line in [head] + rows]
    return "\n".join(lines)


def format_spreads(reps: list[Repeated]) -> str:
    """One line per policy: the min-max range of the headline metrics over the repeats, and the
    step programs compiled inside its timed runs (their time is off the clock, but a compile
    disturbs the rounds around it); then whether each change's sign held in every repeat."""
    lines = []
    for rep in reps:
        n = len(rep.runs)
        lat, rounds = rep.spread["mean_latency_s"], rep.spread["rounds"]
        compiles = sum(r.compiles for r in rep.runs)
        lines.append(
            f"{rep.median.policy}: {n} repeats, mean latency {lat[0]:.3f}-{lat[1]:.3f} s, "
            f"rounds {rounds[0]:.0f}-{rounds[1]:.0f}, step programs compiled in timed runs {compiles}"
        )
        if rep.median.drafted_tokens:  # speculative decoding
            drafted, accepted = rep.median.drafted_tokens, rep.median.accepted_tokens
            lines[-1] += f", drafts accepted {accepted}/{drafted} ({accepted / drafted:.0%}, the median run)"
    for rep in reps[1:]:
        lat = paired_changes(reps[0], rep)["mean_latency_s"]
        held = "held in every repeat" if lat.sign_stable else "NOT the same in every repeat"
        lines.append(
            f"{rep.median.policy} vs {reps[0].median.policy}: mean latency {lat.median:+.1%} "
            f"(IQR {lat.q1:+.1%} to {lat.q3:+.1%}); its sign {held}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``radixflow bench``: checks every option before any work, then runs the workload (over
    HTTP, on simulated replicas, at each sweep rate, or once) and prints its table."""
    if args.url:  # over HTTP: the server owns the engine and the policy
        from radixflow_jax.bench.http import run_url

        return run_url(args, _requests(args, "model", None))
    policies, executor, rates = _checked(args)
    cfg, seqs, tokens = _bench_config(args, executor, policies)
    progress = _progress(not args.no_progress)
    model = None
    if executor == "model":
        from radixflow_jax.models.api import load

        model = load(args.model, dtype=args.dtype)
    encode = model.encode if model is not None and model.tokenizer else None
    config = _run_config(args, executor, cfg, seqs, tokens)
    if args.workload == "agentic":  # written as text: say what turned it into ids
        config["text_encoder"] = "the model's tokenizer" if encode is not None else "WordIds (one id per word)"
    if args.replicas > 1:
        from radixflow_jax.bench.cluster import run_cluster_cli

        return run_cluster_cli(args, cfg, _requests(args, executor, encode), config)
    run_at = functools.partial(_run_at, args, executor, cfg, model, encode, progress)
    if rates:
        _report_sweep(args, sweep(rates, lambda rate: run_at(rate)[1]), config)
    else:
        _report_runs(args, *run_at(None), config)
    return 0


def _checked(args: argparse.Namespace) -> tuple[tuple[str, ...], str, list[float] | None]:
    """The policies, the executor (``sim`` for a model spec) and the sweep rates, after every
    check of the options that needs no model (``ValueError`` names the first option at fault)."""
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    from radixflow_jax.scheduler.admission import get_policy

    for p in policies:
        get_policy(p)
    is_spec = args.model in MODEL_SPECS
    executor = args.executor or ("sim" if is_spec else "model")
    if executor == "sim" and not is_spec:
        raise ValueError(f"--executor sim needs a model spec ({', '.join(MODEL_SPECS)}), got {args.model!r}")
    if executor == "model" and is_spec:
        raise ValueError(f"{args.model!r} is a model spec: use --executor sim, or a preset / directory")
    if args.rate is not None and not args.rate > 0:
        raise ValueError(f"--rate must be > 0, got {args.rate}")
    if args.num_requests is not None and args.num_requests < 1:
        raise ValueError(f"--num-requests must be >= 1, got {args.num_requests}")
    if args.repeats is None:  # the defaults per executor (the simulated one is deterministic)
        args.repeats = MODEL_REPEATS if executor == "model" else 1
    if args.warmup_runs is None:
        args.warmup_runs = 1 if executor == "model" else 0
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.warmup_runs < 0:
        raise ValueError(f"--warmup-runs must be >= 0, got {args.warmup_runs}")
    if args.think_time < 0:
        raise ValueError(f"--think-time must be >= 0, got {args.think_time}")
    if args.session_window < 0:
        raise ValueError(f"--session-window must be >= 0, got {args.session_window}")
    if args.round_overhead_ms is not None and args.round_overhead_ms < 0:
        raise ValueError(f"--round-overhead-ms must be >= 0, got {args.round_overhead_ms}")
    if executor == "model" and (args.round_overhead_ms is not None or args.sim_noise):
        raise ValueError("--round-overhead-ms and --sim-noise apply to the simulated executor only")
    if args.sim_noise < 0:
        raise ValueError(f"--sim-noise must be >= 0, got {args.sim_noise}")
    if args.replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {args.replicas}")
    if args.replicas > 1:
        from radixflow_jax.replicas.router import RouterConfig

        RouterConfig(policy=args.router)  # refuses an unknown router before any work
    if args.replicas > 1 and (executor != "sim" or args.sweep_rates or args.repeats > 1):
        raise ValueError("--replicas runs simulated replicas: use --executor sim, without --sweep-rates/--repeats")
    rates = parse_rates(args.sweep_rates) if args.sweep_rates else None
    if rates and args.workload.endswith(".jsonl"):
        raise ValueError("--sweep-rates needs a generated workload (a JSONL file carries its own arrival times)")
    if args.plot and not os.path.splitext(args.plot)[1]:
        raise ValueError("--plot needs a file name such as out.png")
    return policies, executor, rates


def _bench_config(args: argparse.Namespace, executor: str, policies: tuple[str, ...]) -> tuple[BenchConfig, int, int]:
    """The bench configuration, with the engine's row and token budgets (defaults per executor)."""
    seqs = args.max_num_seqs or (8 if executor == "model" else 64)
    tokens = args.max_num_batched_tokens or (512 if executor == "model" else 8192)
    cache_dir = None if args.no_compile_cache else xla_cache_dir()
    engine = EngineConfig.from_options(
        max_num_seqs=seqs, max_num_batched_tokens=tokens, seed=args.seed, compilation_cache_dir=cache_dir,
        bucket_mode=args.buckets, mixed_layout=args.mixed_layout, speculative=args.speculative,
        num_state_slots=args.num_state_slots, host_cache_gb=args.host_cache_gb,
        host_kv_fraction=args.host_kv_fraction,
    )
    overhead = args.round_overhead_ms / 1e3 if args.round_overhead_ms is not None else None
    acceptance = tuple(float(a) for a in args.spec_acceptance.split(",")) if args.spec_acceptance else ()
    cfg = BenchConfig(policies=policies, engine=engine, overhead_s=overhead, sim_noise=args.sim_noise,
                      spec_acceptance=acceptance)  # fmt: skip
    return cfg, seqs, tokens


def _run_config(args: argparse.Namespace, executor: str, cfg: BenchConfig, seqs: int, tokens: int) -> dict[str, Any]:
    """The ``config`` block of the JSON output (sim: the device's cost-model parameters too)."""
    config = {
        "model": args.model,
        "executor": executor,
        "device": args.device if executor == "sim" else "cpu",
        "workload": args.workload,
        "arrival": args.arrival,
        "session_window": args.session_window,
        "think_time": args.think_time,
        "num_state_slots": args.num_state_slots,
        "host_cache_gb": args.host_cache_gb,
        "host_kv_fraction": args.host_kv_fraction,
        "seed": args.seed,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": tokens,
        "policies": list(cfg.policies),
        "repeats": args.repeats,
        "warmup_runs": args.warmup_runs,
        "buckets": args.buckets,
        "mixed_layout": args.mixed_layout,
        "speculative": args.speculative,
        "spec_acceptance": args.spec_acceptance,
        "round_cost": "fitted to the executor's own rounds (engine/roundcost.py)",
    }
    if executor == "sim":
        dev, overhead = get_device_spec(args.device), cfg.overhead_s
        config.update(
            sim_noise=args.sim_noise,
            round_overhead_s=overhead if overhead is not None else dev.round_overhead_s,
            overhead_source=dev.overhead_source if overhead is None else "--round-overhead-ms",
            mfu=dev.mfu,
            mbu=dev.mbu,
            host_link_bytes_s=dev.host_link_bandwidth,
            host_link_latency_s=dev.host_link_latency_s,
        )
    return config


def _run_at(
    args: argparse.Namespace, executor: str, cfg: BenchConfig, model: Any, encode: Any, progress: Any,
    rate: float | None,
) -> tuple[list[BenchRequest], list[Repeated], dict]:
    """Every policy on the workload at ``rate`` (None: the option's or the default), ``args.repeats`` times."""
    requests = _requests(args, executor, encode, rate)
    if executor == "sim":
        runner = sim_runner(get_model_spec(args.model), get_device_spec(args.device), requests, cfg, progress)
    else:
        runner = model_runner(model, requests, cfg, progress=progress)
    reps, records = run_policies(runner, cfg, args.repeats, args.warmup_runs)
    return requests, reps, records


def _report_sweep(args: argparse.Namespace, points: Any, config: dict[str, Any]) -> None:
    """Prints the sweep table; writes ``--json`` and ``--plot`` when asked."""
    print(format_sweep(points))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"config": config, "sweep": sweep_json(points)}, f, indent=2)
    if args.plot:
        plot_sweep(args.plot, points)


def _report_runs(
    args: argparse.Namespace, requests: list[BenchRequest], reps: list[Repeated], records: dict, config: dict[str, Any]
) -> None:
    """Prints the policy table (and the spreads over repeats); writes ``--json`` (runs, every
    repeat, every round record) and ``--plot`` when asked."""
    runs = [r.median for r in reps]
    print(format_table(reps))
    if args.repeats > 1:
        print(format_spreads(reps))
    config["num_requests"] = len(requests)
    if args.json_out:
        changes = [{}] + [
            {k: dataclasses.asdict(c) for k, c in paired_changes(reps[0], r).items()} for r in reps[1:]
        ]
        payload = {
            "config": config,
            "runs": [dict(r.median.as_dict(), spread=r.spread, change=c) for r, c in zip(reps, changes)],
            "repeats": {r.median.policy: [x.as_dict() for x in r.runs] for r in reps},
            "round_records": {p: [dataclasses.asdict(r) for r in recs] for p, recs in records.items()},
        }
        with open(args.json_out, "w") as f:
            json.dump(payload, f, indent=2)
    if args.plot:
        from radixflow_jax.bench.plots import plot_runs

        plot_runs(args.plot, runs, records)
