"""Cold start-up with empty caches, as a new user meets it, for the three entry points:

* ``llm`` (in this process): ``LLM(model)`` plus a first ``generate``; prints each phase, the
  variants that compiled and the CPU time.
* ``serve``: ``radixflow serve`` as a subprocess; seconds until ``/health`` answers and until the
  first completion (16 tokens) comes back.
* ``batch``: ``radixflow batch`` over ``--batch-prompts`` short prompts; seconds until the output's
  first line is written and until the job ends.

Each run points ``RADIXFLOW_CACHE`` and the persistent XLA cache at fresh temporary directories
(``--xla-cache`` keeps one instead, to time a warm start). ``--repeats N`` runs each entry point N
times, interleaved, and prints the median and the range; the load average is printed before every
run (the machine may be shared).

    python benchmarks/startup.py                              # llm, serve and batch, once each
    python benchmarks/startup.py --what serve,batch --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable


def _env(tmp: str) -> dict[str, str]:
    """The environment of a cold subprocess: its own empty ``RADIXFLOW_CACHE`` (presets, kernels)."""
    return {**os.environ, "RADIXFLOW_CACHE": os.path.join(tmp, "radixflow")}


def run_llm(args: argparse.Namespace, tmp: str) -> dict[str, float]:
    t_start = time.perf_counter()
    os.environ["RADIXFLOW_CACHE"] = os.path.join(tmp, "radixflow")
    from radixflow_jax import LLM, SamplingParams

    llm = LLM(args.model, warmup=args.warmup, compilation_cache_dir=args.xla_cache or os.path.join(tmp, "xla"))
    t_build = time.perf_counter()
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    llm.generate(["Which option is the best title?", "A question about the passage."], params)
    t_first = time.perf_counter()
    step = llm.engine.executor.step
    return {"engine_built_s": t_build - t_start, "first_outputs_s": t_first - t_start,
            "variants_compiled": float(step.num_compiles)}  # fmt: skip


def run_serve(args: argparse.Namespace, tmp: str) -> dict[str, float]:
    import httpx

    port = 18000 + os.getpid() % 1000
    xla = args.xla_cache or os.path.join(tmp, "xla")
    cmd = [sys.executable, "-m", "radixflow_jax.cli", "serve", "--model", args.model, "--port", str(port),
           "--compilation-cache-dir", xla]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=_env(tmp), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"radixflow serve exited with {proc.returncode}")
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        healthy = time.perf_counter() - start
        body = {"model": args.model, "prompt": "Which option is the best title?", "max_tokens": 16, "ignore_eos": True}
        r = httpx.post(url + "/v1/completions", json=body, timeout=600.0)
        r.raise_for_status()
        return {"healthy_s": healthy, "first_answer_s": time.perf_counter() - start}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def run_batch(args: argparse.Namespace, tmp: str) -> dict[str, float]:
    src, out = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
    with open(src, "w") as f:
        for i in range(args.batch_prompts):
            prompt = f"Question {i}: which option is the best title for passage {i % 7}?"
            f.write(json.dumps({"id": f"r{i}", "prompt": prompt, "max_tokens": 8}) + "\n")
    xla = args.xla_cache or os.path.join(tmp, "xla")
    cmd = [sys.executable, "-m", "radixflow_jax.cli", "batch", "--model", args.model, "--input", src, "--output", out,
           "--no-progress", "--compile-cache", xla]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=_env(tmp), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = None
    while proc.poll() is None:
        if first is None and os.path.exists(out) and os.path.getsize(out) > 0:
            first = time.perf_counter() - start
        time.sleep(0.1)
    if proc.returncode != 0:
        raise RuntimeError(f"radixflow batch exited with {proc.returncode}")
    done = time.perf_counter() - start
    return {"first_line_s": done if first is None else first, "done_s": done}


RUNS: dict[str, Callable[[argparse.Namespace, str], dict[str, float]]] = {
    "llm": run_llm, "serve": run_serve, "batch": run_batch,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-qwen3.5")
    p.add_argument("--what", default="llm,serve,batch", help=f"comma-separated, of {', '.join(RUNS)}")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--warmup", choices=("lazy", "all"), default="lazy", help="llm: the LLM's warm-up")
    p.add_argument("--batch-prompts", type=int, default=300)
    p.add_argument("--xla-cache", default=None, help="persistent XLA cache directory (default: a fresh one)")
    args = p.parse_args(argv)
    what = args.what.split(",")
    if "llm" in what and (args.repeats > 1 or len(what) > 1):
        what = [w for w in what if w != "llm"] + ["llm"]  # in-process and caches JAX state: last, once
    results: dict[str, list[dict[str, float]]] = {w: [] for w in what}
    for rep in range(args.repeats):
        for name in what:
            if name == "llm" and rep > 0:
                continue
            with tempfile.TemporaryDirectory(prefix="rfj-startup-") as tmp:
                load = os.getloadavg()[0]
                res = RUNS[name](args, tmp)
            results[name].append(res)
            fields = ", ".join(f"{k} {v:.1f}" for k, v in res.items())
            print(f"{name} run {rep + 1}: {fields} (load {load:.1f} before, {os.cpu_count()} CPUs)", flush=True)
    for name, runs in results.items():
        for key in runs[0]:
            values = sorted(r[key] for r in runs)
            print(f"{name} {key}: median {statistics.median(values):.1f} (range {values[0]:.1f}-{values[-1]:.1f}, "
                  f"{len(values)} runs)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
