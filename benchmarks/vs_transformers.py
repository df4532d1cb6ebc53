"""Throughput of ``radixflow_jax.LLM`` against ``transformers`` batched ``generate``, same model, same run.

What is measured
  * One tiny hybrid model (a Qwen3.5-text config: Gated DeltaNet + full attention, 3:1) is built
    with ``transformers.Qwen3_5ForCausalLM(config)`` from a fixed torch seed and written as a HF
    directory; both engines load that directory. The output head is re-drawn with a larger scale
    (``--head-std``) so greedy choices have clear margins and the agreement count is meaningful.
  * Workload: ``--requests`` prompts over ``--prefixes`` shared prefixes (request ``i`` uses prefix
    ``i % prefixes``), each ``--prefix-len`` random ids plus ``--suffix-len`` random ids of its own
    (seeded), ``--output-len`` output tokens each, greedy, EOS ignored.
  * Ours: output tokens / wall time of one ``LLM.generate`` call over all prompts. Compilation is
    done before the clock starts: ``--warmup planned`` (default) replays the workload through the
    same scheduler with a recording executor and compiles exactly the step variants it selects;
    ``--warmup all`` compiles every variant (``LLM(..., warmup=True)``). Either way each variant
    also runs once on a padding batch before the clock starts. Compiles that still happen inside the
    timed call are counted and printed.
  * transformers: output tokens / wall time of batched ``generate`` (``do_sample=False``,
    ``max_new_tokens``) in batches of ``--hf-batch``, under ``torch.inference_mode`` with
    ``torch.set_num_threads(--threads)``; the model loads once and every path is warmed up first.
  * Agreement: how many requests produced the same output ids token for token (reported only).

Two comparisons from one run, headlined equally, engine only first (``--modes`` picks one):
  * ``engine_only``: no prefix cache on either side: ours with the prefix cache off, transformers
    computing every prompt in full (left padding, attention mask).
  * ``prefix_cache``: ours with the prefix cache on; transformers given the same reuse: the distinct
    prefixes are prefilled once in one forward, and each batch continues from a copy of that cache
    expanded to its rows (``radixflow_jax/bench/vs_hf.py``; batches hold one suffix length, because a
    hybrid cache cannot be continued across left padding: the module's docstring says why).
Each headline is the median of the per-run ratios (runs interleave ours, theirs, ours, theirs, ...
in each mode) with its min-max and interquartile range, not a ratio of medians.

The transformers configuration (``--hf-config``, default ``auto``): ``eager`` (``DynamicCache``),
``static`` (``cache_implementation="static"``) or ``compile`` (static cache plus ``generate``'s
``torch.compile`` of the decode forward, forced on for the CPU). ``auto`` warms each up on every
mode's path, times it (``--hf-probe-repeats``, the best of them counts), prints each one's times or
error and uses the fastest that works; its choice is in the output and the JSON.

Run (from the repository root, with the venv active)::

    python benchmarks/vs_transformers.py --quick            # a few minutes (the compile probe included)
    python benchmarks/vs_transformers.py                    # full: 64 requests, ~30 min on 2 loaded cores
    python benchmarks/vs_transformers.py --json out.json    # also write the results as JSON

The model, workload, engine options and planned warm-up live in ``radixflow_jax/bench/synthetic.py``
(the ``tools/perf`` experiments replay the same setup). Compiled step variants are kept in a
persistent XLA cache (``--jax-cache``, default ``$RADIXFLOW_CACHE/xla-cache-bench``; ``--jax-cache ''``
turns it off), so a rerun starts faster.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import platform
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from radixflow_jax.bench.args import PrefixWorkload
from radixflow_jax.bench.synthetic import (
    ModelShape, add_setup_args, configure_jax, planned_variants, setup_from_args, step_by_kind, vocab_of, write_model,
)  # fmt: skip
from radixflow_jax.bench.vs_hf import (
    HF_CONFIGS, fastest, plain_generate, plan_reuse, probe_configs, ratio_spread, reuse_generate,
)  # fmt: skip

if TYPE_CHECKING:  # heavy imports stay lazy so --help is instant
    from transformers import PreTrainedModel

    from radixflow_jax.engine.config import RoundRecord
    from radixflow_jax.models.api import LoadedModel
    from radixflow_jax.engine.params import SamplingParams
    from radixflow_jax.llm import LLM


@dataclasses.dataclass(frozen=True)
class EngineRun:
    """One engine's timed run: ``outputs[i]`` are request ``i``'s output ids."""

    name: str
    seconds: float
    output_tokens: int
    outputs: list[list[int]]
    details: dict[str, Any]

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


# ------------------------------------------------------------------------------------- ours
def build_llm(
    model: str | LoadedModel, args: argparse.Namespace, w: PrefixWorkload, prompts: list[list[int]],
    params: SamplingParams, prefix_cache: bool,
) -> LLM:  # fmt: skip
    """A fresh engine per run (empty prefix cache, fresh round-cost fit). ``model`` is the HF directory
    for the first engine and its ``LoadedModel`` afterwards, so weights load once and engines of the
    same shape share their compiled step variants."""
    from radixflow_jax import LLM

    llm = LLM(
        model, dtype="float32", max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
        max_model_len=w.prefix_len + w.suffix_len + w.output_len, policy="pair" if prefix_cache else "no-cache",
        warmup=args.warmup == "all", bucket_mode=args.buckets,
    )  # fmt: skip
    if args.warmup == "planned":
        llm.engine.executor.warmup(planned_variants(llm, prompts, params))
    return llm


def step_by_variant(records: Sequence[RoundRecord]) -> dict[str, dict[str, float]]:
    """Rounds, real tokens and step seconds per ``T{token slots}xR{row slots}`` bucket."""
    out: dict[str, dict[str, float]] = {}
    for r in records:
        entry = out.setdefault(f"T{r.token_slots}xR{r.row_slots}", {"rounds": 0, "tokens": 0, "step_s": 0.0})
        entry["rounds"] += 1
        entry["tokens"] += r.num_tokens
        entry["step_s"] += r.step_s
    return out


def run_ours(
    source: dict[str, Any], args: argparse.Namespace, w: PrefixWorkload, prompts: list[list[int]], mode: str
) -> EngineRun:
    """One timed ``LLM.generate`` of ``mode`` (``engine_only``: prefix cache off) on a fresh engine;
    ``source["model"]`` is the directory, replaced by the loaded model after the first build."""
    from radixflow_jax import SamplingParams

    params = SamplingParams(max_tokens=w.output_len, ignore_eos=True)
    t0 = time.perf_counter()
    llm = build_llm(source["model"], args, w, prompts, params, prefix_cache=mode == "prefix_cache")
    source["model"] = llm.model
    step = llm.engine.executor.step
    setup_s, compiles_before = time.perf_counter() - t0, step.num_compiles
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    records = llm.engine.records
    details = {
        "prefix_cache": mode == "prefix_cache",
        "setup_s": setup_s,
        "compiled_variants": compiles_before,
        "compile_s": step.compile_seconds,
        "compiles_in_timed_run": step.num_compiles - compiles_before,
        "rounds": len(records),
        "computed_tokens": sum(r.num_tokens for r in records),
        "cached_prompt_tokens": sum(o.cached_tokens for o in outs),
        "plan_s": sum(r.plan_s for r in records),
        "build_s": sum(r.build_s for r in records),
        "step_s": sum(r.step_s for r in records),
        "step_s_by_variant": step_by_variant(records),
        "step_by_kind": step_by_kind(records),
        "padding_fraction": 1 - sum(r.num_tokens for r in records) / max(sum(r.token_slots for r in records), 1),
    }
    token_ids = [list(o.token_ids) for o in outs]
    return EngineRun("radixflow_jax", seconds, sum(map(len, token_ids)), token_ids, details)


# ------------------------------------------------------------------------------------- transformers
def hf_paths(model: PreTrainedModel, args: argparse.Namespace, w: PrefixWorkload, prompts: list[list[int]]
             ) -> dict[str, Callable[[str], list[list[int]]]]:  # fmt: skip
    """The transformers side of each mode: ``fn(config) -> outputs``, timed as a whole."""
    plan = plan_reuse(prompts, w.prefix_len, args.hf_batch)
    return {
        "engine_only": lambda c: plain_generate(model, prompts, args.hf_batch, w.output_len, c),
        "prefix_cache": lambda c: reuse_generate(model, prompts, plan, w.output_len, c),
    }


def setup_transformers(
    model_dir: str, args: argparse.Namespace, w: PrefixWorkload, prompts: list[list[int]], modes: Sequence[str]
) -> tuple[dict[str, Callable[[str], list[list[int]]]], str, dict[str, Any]]:
    """Loads the model once, then either probes every configuration (``--hf-config auto``: each warmed
    up on every mode's path, then timed; the fastest that works is used) or warms up the one given.
    Returns the paths, the configuration used and the probe's report."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    paths = {m: fn for m, fn in hf_paths(model, args, w, prompts).items() if m in modes}
    auto = args.hf_config == "auto"
    configs = HF_CONFIGS if auto else tuple(dict.fromkeys(("eager", args.hf_config)))  # eager: the reference
    probe = probe_configs(paths, configs, repeats=args.hf_probe_repeats if auto else 0,
                          log=functools.partial(print, flush=True))  # fmt: skip
    chosen = fastest(probe) if auto else args.hf_config
    if probe[chosen].error is not None:
        print(f"transformers configuration {chosen!r} failed ({probe[chosen].error}); using eager")
        chosen = "eager"
    report = {"chosen": chosen, "setup_s": time.perf_counter() - t0, "threads": torch.get_num_threads(),
              "attn_implementation": getattr(model.config, "_attn_implementation", None),
              "probe": {c: dataclasses.asdict(r) for c, r in probe.items()}}  # fmt: skip
    return paths, chosen, report


def run_transformers(paths: dict[str, Callable[[str], list[list[int]]]], mode: str, config: str,
                     w: PrefixWorkload, prompts: list[list[int]]) -> EngineRun:  # fmt: skip
    """One timed transformers run of ``mode`` in ``config``."""
    start = time.perf_counter()
    outputs = paths[mode](config)
    seconds = time.perf_counter() - start
    computed = sum(map(len, prompts))
    if mode == "prefix_cache":  # each distinct prefix once, then every suffix
        computed = len({tuple(p[: w.prefix_len]) for p in prompts}) * w.prefix_len + computed - w.requests * w.prefix_len
    details = {"config": config, "computed_prompt_tokens": computed}
    return EngineRun("transformers", seconds, sum(map(len, outputs)), outputs, details)


# ------------------------------------------------------------------------------------- report
def agreement(a: EngineRun, b: EngineRun) -> tuple[int, float]:
    """``(requests with identical outputs, mean length of the common leading run / output length)``."""
    same, prefix = 0, []
    for x, y in zip(a.outputs, b.outputs):
        same += x == y
        n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        prefix.append(n / max(len(x), 1))
    return same, float(np.mean(prefix)) if prefix else 0.0


def versions() -> dict[str, str]:
    import jax
    import torch
    import transformers

    return {"python": platform.python_version(), "jax": jax.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "numpy": np.__version__, "jax_backend": jax.default_backend(),
            "cpu_count": str(os.cpu_count()), "platform": platform.platform()}  # fmt: skip


MODES = ("engine_only", "prefix_cache")
TITLES = {
    "engine_only": "engine only (no prefix cache on either side)",
    "prefix_cache": "with the prefix cache (ours: prefix cache on; transformers: each shared prefix prefilled "
                    "once, its cache copied into the batch)",
}  # fmt: skip


def headline(mode: str, ratios: dict[str, Any], ours: list[EngineRun], hf: list[EngineRun]) -> str:
    """One mode's headline: the median of per-run ratios with its spread and both sides' tok/s."""
    def tps(runs: list[EngineRun]) -> str:
        return f"{min(r.tokens_per_s for r in runs):.1f}-{max(r.tokens_per_s for r in runs):.1f}"

    return (f"{TITLES[mode]}: {ratios['median']:.2f}x (median of {len(ratios['runs'])} per-run ratios; "
            f"min-max {ratios['min']:.2f}-{ratios['max']:.2f}, IQR {ratios['q1']:.2f}-{ratios['q3']:.2f}; "
            f"ours {tps(ours)} tok/s, transformers {tps(hf)} tok/s)")  # fmt: skip


def print_details(mode: str, ours: EngineRun, hf: EngineRun, same: int, prefix_frac: float, total: int) -> None:
    """The median runs of one mode: greedy agreement, prompt tokens computed, our round breakdown."""
    d = ours.details
    print(f"\n[{mode}] median runs: radixflow_jax {ours.tokens_per_s:.1f} tok/s ({ours.seconds:.2f}s), "
          f"transformers {hf.tokens_per_s:.1f} tok/s ({hf.seconds:.2f}s, {hf.details['config']})")  # fmt: skip
    print(f"  greedy agreement: {same}/{total} requests identical token for token "
          f"(mean matching leading fraction {prefix_frac:.2f})")  # fmt: skip
    print(f"  prompt tokens computed: ours {d['computed_tokens'] - ours.output_tokens + total} "
          f"({d['cached_prompt_tokens']} from the prefix cache), transformers {hf.details['computed_prompt_tokens']}")
    print(f"  ours: {d['rounds']} rounds, plan {d['plan_s']:.3f}s build {d['build_s']:.3f}s step {d['step_s']:.3f}s; "
          f"{d['compiles_in_timed_run']} compiles inside the timed run; padding "
          f"{100 * d['padding_fraction']:.0f}% of token slots")  # fmt: skip
    print("  ours, step time per round kind: " + ", ".join(
        f"{k} {v['rounds']}x {v['tokens']} tok {v['step_s']:.2f}s ({v['ms_per_token']:.2f} ms/tok)"
        for k, v in d["step_by_kind"].items()))  # fmt: skip


def print_probe(report: dict[str, Any]) -> None:
    """Each transformers configuration tried: its error, or its warm-up and timed seconds."""
    for c, r in report["probe"].items():
        if r["error"] is not None:
            print(f"  transformers {c}: failed: {r['error']}")
        else:
            timed = ", ".join(f"{x:.2f}s" for x in r["seconds"]) or "not timed"
            print(f"  transformers {c}: warm-up (compiles) {r['warmup_s']:.1f}s, timed {timed}, "
                  f"outputs equal to eager: {r['same_as_eager']}")  # fmt: skip
    print(f"  transformers configuration used: {report['chosen']}")


def fmt_load(load: Sequence[float]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_setup_args(p)
    p.add_argument("--hf-batch", type=int, default=64, help="transformers batch size")
    p.add_argument("--hf-config", choices=("auto", *HF_CONFIGS), default="auto",
                   help="transformers configuration; auto probes each and uses the fastest that works")  # fmt: skip
    p.add_argument("--hf-probe-repeats", type=int, default=2,
                   help="timed probe rounds per configuration (auto; the best counts)")  # fmt: skip
    p.add_argument("--modes", choices=("both", *MODES), default="both",
                   help="which comparison(s) to run (--no-prefix-cache means engine_only)")  # fmt: skip
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    p.add_argument("--warmup", choices=("planned", "all"), default="planned")
    p.add_argument("--json", default=None, help="write the results to this path")
    args = p.parse_args(argv)
    if args.no_prefix_cache:
        args.modes = "engine_only"
    return args


def _median_run(runs: list[EngineRun]) -> EngineRun:
    return sorted(runs, key=lambda r: r.tokens_per_s)[len(runs) // 2]


def _side(runs: list[EngineRun]) -> dict[str, Any]:
    m = _median_run(runs)
    return {"tokens_per_s": m.tokens_per_s, "seconds": m.seconds, "output_tokens": m.output_tokens, **m.details,
            "tokens_per_s_runs": [r.tokens_per_s for r in runs], "seconds_runs": [r.seconds for r in runs]}  # fmt: skip


def summarize(mode: str, ours: list[EngineRun], hf: list[EngineRun], requests: int) -> dict[str, Any]:
    """One mode's result: both sides (median runs and every run), the per-run ratios, agreement."""
    ratios = ratio_spread([a.tokens_per_s / b.tokens_per_s for a, b in zip(ours, hf)])
    same, prefix_frac = agreement(_median_run(ours), _median_run(hf))
    print_details(mode, _median_run(ours), _median_run(hf), same, prefix_frac, requests)
    return {"title": TITLES[mode], "ratio": ratios, "radixflow_jax": _side(ours), "transformers": _side(hf),
            "agreement": {"identical": same, "requests": requests, "mean_matching_fraction": prefix_frac}}  # fmt: skip


def run(args: argparse.Namespace, model_dir: str, w: PrefixWorkload, shape: ModelShape) -> dict[str, Any]:
    """Probes/warms transformers, then interleaves ``--repeats`` rounds of (ours, transformers) per
    mode, engine-only first; prints both headlines from the one run."""
    prompts = w.prompts(vocab_of(model_dir))
    modes = MODES if args.modes == "both" else (args.modes,)
    load_before = os.getloadavg()
    print(f"workload: {w}\nmodel: {shape} in {model_dir}\nload average before {fmt_load(load_before)}", flush=True)
    paths, config, hf_report = setup_transformers(model_dir, args, w, prompts, modes)
    print_probe(hf_report)
    source: dict[str, Any] = {"model": model_dir}
    runs: dict[str, tuple[list[EngineRun], list[EngineRun]]] = {m: ([], []) for m in modes}
    for i in range(max(args.repeats, 1)):  # interleaved: ours, theirs, ours, theirs, ... per mode
        for m in modes:
            runs[m][0].append(run_ours(source, args, w, prompts, m))
            runs[m][1].append(run_transformers(paths, m, config, w, prompts))
            a, b = runs[m][0][-1], runs[m][1][-1]
            ratio, load = a.tokens_per_s / b.tokens_per_s, fmt_load(os.getloadavg())
            print(f"run {i + 1} {m}: radixflow_jax {a.tokens_per_s:.1f} tok/s, transformers {b.tokens_per_s:.1f} "
                  f"tok/s, ratio {ratio:.2f}x, load {load}", flush=True)  # fmt: skip
    results = {m: summarize(m, *runs[m], w.requests) for m in modes}
    load_after = os.getloadavg()
    print()
    for m in modes:
        print(headline(m, results[m]["ratio"], *runs[m]))
    print(f"transformers configuration: {config}; load average (1/5/15 min) before {fmt_load(load_before)}, "
          f"after {fmt_load(load_after)}")  # fmt: skip
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "workload": dataclasses.asdict(w),
        "model": dataclasses.asdict(shape),
        "engine": {
            "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_batched_tokens,
            "warmup": args.warmup, "buckets": args.buckets,
        },
        "transformers_setup": {**hf_report, "batch_size": args.hf_batch},
        "repeats": max(args.repeats, 1),
        **results,
        "loadavg_1_5_15": {"before": load_before, "after": load_after},
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    w, shape = setup_from_args(args)
    configure_jax(args.jax_cache)
    with tempfile.TemporaryDirectory(prefix="rfj-bench-") as tmp:
        if args.model_dir is None:
            model_dir = write_model(shape, os.path.join(tmp, "model"), args.seed, args.head_std)
        else:
            model_dir = args.model_dir
        result = run(args, model_dir, w, shape)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
