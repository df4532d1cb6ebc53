"""Overlap on and off, side by side: host time on the critical path per round, step time per round
kind, and throughput, with one model executor (the same compiled variants) for both modes.

What is measured
  * ``--requests`` greedy requests over ``--prefixes`` shared prefixes (prompts of ``--prefix-len +
    --suffix-len`` tokens), ``--output-len`` tokens each, on ``--model`` (tiny-qwen3.5) with
    ``--max-num-seqs`` rows per round: mostly decode rounds, where the host's share is largest.
  * One untimed run per mode (compiles what it needs), then ``--repeats`` timed runs per mode,
    interleaved (off, on, off, on, ...). Per mode, the median over repeats of: wall seconds, output
    tokens/s, the per-round median and total of ``RoundRecord.host_s`` (host time on the critical
    path: from the previous round's result to this round's dispatch while no round was in flight;
    0 for a round launched while the previous one ran), plan + build per round, and ``step_s`` per
    token by round kind. The load average is printed before and after: on a shared machine, read
    ratios from interleaved runs, not absolute times.
  * Greedy outputs of every run must equal the first run's (the script exits 1 otherwise).

Run (repository root, venv active)::

    python tools/perf/overlap.py
    python tools/perf/overlap.py --repeats 5 --json overlap.json
    python tools/perf/overlap.py --requests 4 --output-len 4 --repeats 1   # a quick look
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import time

from radixflow_jax.bench.args import PrefixWorkload, add_workload_args, workload_from_args
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.engine.build import build_engine
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.engine.build import assemble_engine
from radixflow_jax.models import load

WORKLOAD = PrefixWorkload(requests=32, prefixes=4, prefix_len=128, suffix_len=16, output_len=32)


def prompts_of(args: PrefixWorkload) -> list[list[int]]:
    """Deterministic ids (no random draw): request ``i`` is prefix ``i % prefixes`` and its own suffix."""
    out = []
    for i in range(args.requests):
        p = i % args.prefixes
        prefix = [(7 * p + 13 * t) % 400 + 10 for t in range(args.prefix_len)]
        out.append(prefix + [(31 * i + 3 * t) % 400 + 10 for t in range(args.suffix_len)])
    return out


def run_once(base: EngineCore, config: EngineConfig, overlap: bool, prompts, params) -> tuple[dict, list]:
    spec = dataclasses.replace(base.spec, config=dataclasses.replace(config, overlap=overlap), tokenizer=None)
    base.executor.reset()
    core = assemble_engine(spec, lambda shapes: base.executor)
    ids = [core.add_request(p, params) for p in prompts]
    compiles = base.executor.step.num_compiles
    start = time.perf_counter()
    core.run_until_done()
    wall = time.perf_counter() - start
    outs = [core.output(i).token_ids for i in ids]
    recs = core.records
    by_kind: dict[str, list[float]] = {}
    for r in recs:
        e = by_kind.setdefault(r.kind, [0, 0, 0.0])
        e[0] += 1
        e[1] += r.num_tokens
        e[2] += r.step_s
    return {
        "wall_s": wall,
        "tok_per_s": sum(map(len, outs)) / wall,
        "rounds": len(recs),
        "overlapped_rounds": sum(r.overlapped for r in recs),
        "host_ms_median": 1e3 * statistics.median(r.host_s for r in recs),
        "host_s_total": sum(r.host_s for r in recs),
        "plan_build_ms_median": 1e3 * statistics.median(r.plan_s + r.build_s for r in recs),
        "step_ms_per_token": {k: 1e3 * v[2] / max(v[1], 1) for k, v in by_kind.items()},
        "compiles": base.executor.step.num_compiles - compiles,
    }, outs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-qwen3.5")
    add_workload_args(ap, WORKLOAD, seed=False)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--max-batched-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    config = EngineConfig.from_options(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens, page_size=16,
        max_model_len=args.prefix_len + args.suffix_len + args.output_len + 16, warmup=False,
    )  # fmt: skip
    base = build_engine(load(args.model), config)
    prompts = prompts_of(workload_from_args(args, WORKLOAD))
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    load_before = os.getloadavg()
    reference = None
    for overlap in (False, True):  # untimed: compiles the variants each mode needs
        _, outs = run_once(base, config, overlap, prompts, params)
        reference = reference or outs
        if outs != reference:
            print("greedy outputs differ between overlap off and on", file=sys.stderr)
            return 1
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for _ in range(args.repeats):
        for overlap in (False, True):
            stats, outs = run_once(base, config, overlap, prompts, params)
            if outs != reference:
                print("greedy outputs differ between runs", file=sys.stderr)
                return 1
            runs["on" if overlap else "off"].append(stats)
    load_after = os.getloadavg()
    print(f"{datetime.date.today()}  {args.model}: {args.requests} requests, prompts {args.prefix_len}+{args.suffix_len}, "
          f"{args.output_len} output tokens, {args.max_num_seqs} rows; median of {args.repeats} interleaved runs; "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")  # fmt: skip
    summary = {}
    for mode, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0] if isinstance(rs[0][k], (int, float))}
        kinds = {k: statistics.median(r["step_ms_per_token"].get(k, 0.0) for r in rs) for k in rs[0]["step_ms_per_token"]}
        summary[mode] = {**med, "step_ms_per_token": kinds}
        print(f"overlap {mode:3}: {med['wall_s']:.2f} s, {med['tok_per_s']:.0f} tok/s, {med['rounds']:.0f} rounds "
              f"({med['overlapped_rounds']:.0f} overlapped); host on the critical path {med['host_ms_median']:.3f} ms/round "
              f"median, {med['host_s_total']:.3f} s total; plan+build {med['plan_build_ms_median']:.3f} ms/round median; "
              f"step ms/token " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(kinds.items()))
              + f"; compiles in timed runs {sum(r['compiles'] for r in rs)}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "load": [load_before, load_after], "runs": runs, "median": summary}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
