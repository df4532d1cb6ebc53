"""Where one round of ``benchmarks/vs_transformers.py`` spends its time, op by op, from a
``jax.profiler`` trace of the compiled step.

What it does
  * Runs the vs_transformers model and workload once (``radixflow_jax.bench.synthetic.capture_round``;
    its workload, model and engine options apply) and keeps the inputs of the first round of
    ``--round`` (``decode``: 64 decode rows; ``mixed``: 64 decode rows and at least 512 prefill
    token slots; ``prefill``: the workload's first round).
  * Compiles that round's step variant, runs it a few times untimed, then ``--calls`` times under
    ``jax.profiler.trace`` (the trace lands in ``--trace-dir``; TensorBoard/XProf read it too).
  * Reads the trace's ``*.trace.json.gz`` (no extra package needed) and the optimised HLO of the
    program, and prints per call: the wall time of the step, the op time grouped by what the op
    computes (its ``op_name`` in the HLO metadata, e.g. ``jit(step)/dot_general``), the weight
    matmuls per weight (time and GFLOP/s), and the slowest single ops with their shapes.

How to read it
  * XLA:CPU runs independent ops on two threads at once (the MLP's gate and up projections, for
    example), and a matmul's op time covers its own threads, so op times add up to more than the
    wall time; compare ops with each other, and the wall time between programs.
  * The weight-matmul rate is ``2 * M * N * K`` over the op's time, for the fusion that holds the
    weight; a fusion that reads several weights counts all their matmuls under one ``a+b`` entry
    (before 2026-12-01 it counted only the first, and ``out_proj``, fused with ``in_proj_z``, read
    80 GFLOP/s instead of 160).
  * Thread occupancy: for the median call, the wall time during which 0, 1 or 2+ of XLA's worker
    threads ran something: an op of their own, or a slice of another thread's op (the thread-pool
    regions a multi-threaded matmul hands out). Time with one thread busy is work the program
    leaves sequential (loops, in-place writes, single-threaded fusions) on a 2-core machine.

    python tools/perf/round_profile.py --round mixed
    python tools/perf/round_profile.py --round decode --top 40
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile
from typing import Any

from radixflow_jax.bench import synthetic

_WRAPPERS = ("ThunkExecutor", "ThreadpoolListener", "SlinkyThreadPool", "PjitFunction", "CommonPjRt", "$", "end: ")


def op_index(hlo: str) -> dict[str, tuple[str, str, str]]:
    """HLO instruction name -> (result shape, operands text, ``op_name`` metadata)."""
    out = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+) [\w\-]+\(([^)]*)\)", line)
        if m:
            what = re.search(r'op_name="([^"]*)"', line)
            out.setdefault(m.group(1), (m.group(2), m.group(3), what.group(1) if what else ""))
    return out


def weight_rates(times: dict[str, float], hlo: str, ops: dict[str, tuple[str, str, str]]) -> dict[str, list[float]]:
    """Per weight (layer index dropped): [ms per call, GFLOP] over the fusions that read it. A fusion
    that reads several weights (XLA:CPU fuses, e.g., the Gated DeltaNet's ``in_proj_z`` matmul, the
    gated norm and ``out_proj`` into one YNNPACK fusion) is one entry named ``a+b``, with the FLOPs
    of all its matmuls: ``2 * M * out * in`` per weight, ``M`` the fusion's leading result dim."""
    shapes = dict(re.findall(r"%(params__[\w.]+) = f32\[([\d,]+)\]", hlo))
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for name, ms in times.items():
        shape, operands, _ = ops.get(name, ("", "", ""))
        dims = re.match(r"f32\[(\d+),(\d+)\]", shape)
        weights = sorted({w for w in re.findall(r"%(params__[\w.]+)", operands) if shapes.get(w, "").count(",") == 1})
        if not weights or not dims or not ops[name][2].endswith("dot_general"):
            continue
        m, flops, keys = int(dims.group(1)), 0, []
        for weight in weights:
            key = re.sub(r"params__model____layers___\d+___", "", weight).replace("____weight___value", "")
            keys.append(re.sub(r"\.\d+$", "", key.replace("____", ".")).replace("params__", ""))
            rows, cols = (int(x) for x in shapes[weight].split(","))
            flops += 2 * m * rows * cols
        entry = out["+".join(sorted(keys))]
        entry[0] += ms
        entry[1] += flops / 1e9
    return out


def occupancy(events: list[dict[str, Any]]) -> tuple[float, dict[int, float]]:
    """``(wall ms, {busy threads: ms})`` of the median call: a worker is busy while it runs an op or
    a ``ThreadpoolListener`` region (its share of another thread's parallel op)."""
    waits = (e for e in events if e["name"] == "ThunkExecutor::Execute (wait for completion)")
    walls = sorted(waits, key=lambda e: e["dur"])
    if not walls:
        return float("nan"), {}
    call = walls[len(walls) // 2]
    t0, t1 = call["ts"], call["ts"] + call["dur"]
    workers = {e["tid"] for e in events if e["name"] == "ThunkExecutor::Execute"}
    spans: dict[int, list[tuple[float, float]]] = collections.defaultdict(list)
    opened: dict[int, float] = {}
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["tid"] not in workers or not t0 <= e["ts"] <= t1:
            continue
        if e["name"] == "ThreadpoolListener::StartRegion":
            opened[e["tid"]] = e["ts"]
        elif e["name"] == "ThreadpoolListener::StopRegion" and e["tid"] in opened:
            spans[e["tid"]].append((opened.pop(e["tid"]), e["ts"]))
        elif not e["name"].startswith(_WRAPPERS):
            spans[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    edges = []
    for iv in spans.values():
        merged: list[list[float]] = []
        for a, b in sorted(iv):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        edges += [(a, 1) for a, _ in merged] + [(b, -1) for _, b in merged]
    busy, last, acc = 0, t0, collections.Counter()
    for t, step in sorted(edges):
        acc[busy] += t - last
        busy, last = busy + step, t
    acc[busy] += t1 - last
    return call["dur"] / 1e3, {k: v / 1e3 for k, v in sorted(acc.items())}


def summarize(trace_dir: str, hlo: str, calls: int, top: int) -> None:
    path = sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*.trace.json.gz")))[-1]
    with gzip.open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    walls = [e["dur"] for e in events if e["name"] == "ThunkExecutor::Execute (wait for completion)"]
    times: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if not e["name"].startswith(_WRAPPERS):
            times[e["name"]] += e["dur"] / calls / 1e3
    ops = op_index(hlo)
    wall = sorted(walls)[len(walls) // 2] / 1e3 if walls else float("nan")
    total = sum(times.values())
    print(f"step wall time per call (median of {len(walls)}): {wall:.1f} ms; op time per call: {total:.1f} ms")
    call_ms, occ = occupancy(events)
    print(f"thread occupancy of the median call ({call_ms:.1f} ms): "
          + ", ".join(f"{k} busy {v:.1f} ms" for k, v in occ.items()))  # fmt: skip
    by_what: dict[str, float] = collections.defaultdict(float)
    for name, ms in times.items():
        by_what[ops.get(name, ("", "", "(runtime)"))[2] or "(no metadata)"] += ms
    print("\nop time by what the op computes (HLO op_name), ms per call:")
    for what, ms in sorted(by_what.items(), key=lambda x: -x[1])[:top]:
        print(f"  {ms:8.2f}  {what}")
    print("\nweight matmuls (fusions that read a weight), ms per call and GFLOP/s:")
    for key, (ms, gflop) in sorted(weight_rates(times, hlo, ops).items(), key=lambda x: -x[1][0]):
        print(f"  {ms:8.2f}  {gflop / ms * 1e3:6.0f} GFLOP/s  {key}")
    print(f"\nslowest {top} ops, ms per call:")
    for name, ms in sorted(times.items(), key=lambda x: -x[1])[:top]:
        shape, _, what = ops.get(name, ("", "", ""))
        print(f"  {ms:8.3f}  {name:44s} {shape[:34]:34s} {what[-60:]}")


def main(argv: list[str] | None = None) -> None:
    import jax

    from radixflow_jax.runner.step import CompiledStep

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--round", choices=("decode", "mixed", "prefill"), default="decode")
    p.add_argument("--calls", type=int, default=5, help="profiled calls (after 3 untimed ones)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--trace-dir", default=None, help="where the trace goes (default: a new temporary directory)")
    synthetic.add_setup_args(p)
    args = p.parse_args(argv)
    llm, variant, inputs = synthetic.capture_round(args, args.round)
    ex = llm.engine.executor
    step = CompiledStep(ex.model.graphdef, ex.model.params, ex.cache, ex.shapes, ex.step.kernels, ex.penalty_window,
                        mask_words=ex.step.mask_words)  # fmt: skip
    program = step._compile(variant)
    device_inputs = jax.tree_util.tree_map(jax.device_put, inputs)
    cache, params = ex.cache, ex.model.params
    out: Any = None
    for _ in range(3):
        cache, out = program(params, cache, device_inputs)
    jax.block_until_ready(out)
    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="rfj-profile-")
    load = os.getloadavg()
    with jax.profiler.trace(trace_dir):
        for _ in range(args.calls):
            cache, out = program(params, cache, device_inputs)
        jax.block_until_ready(out)
    ex.cache = cache
    print(f"round: {variant}, {args.calls} profiled calls, trace in {trace_dir}, load average {load[0]:.2f}")
    summarize(trace_dir, program.as_text(), args.calls, args.top)


if __name__ == "__main__":
    main()
