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
  * transformers: output tokens / wall time of batched ``generate`` (left padding, attention mask,
    ``do_sample=False``, ``max_new_tokens``) in batches of ``--hf-batch``, under
    ``torch.inference_mode`` with ``torch.set_num_threads(--threads)``, after a one-batch warm-up.
  * Agreement: how many requests produced the same output ids token for token (reported only).

Our engine computes each shared prefix once (prefix cache); ``transformers`` recomputes it for
every request. ``--no-prefix-cache`` turns the cache off to separate engine from cache effects.

Run (from the repository root, with the venv active)::

    python benchmarks/vs_transformers.py --quick            # ~1-2 minutes
    python benchmarks/vs_transformers.py                    # full: 64 requests, ~10 minutes
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
import json
import os
import platform
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from radixflow_jax.bench.args import PrefixWorkload
from radixflow_jax.bench.synthetic import (
    PAD_ID, ModelShape, add_setup_args, configure_jax, planned_variants, setup_from_args, step_by_kind, vocab_of,
    write_model,
)  # fmt: skip

if TYPE_CHECKING:  # heavy imports stay lazy so --help is instant
    import torch
    from transformers import PreTrainedModel

    from radixflow_jax.engine.config import RoundRecord
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
    model_dir: str, args: argparse.Namespace, w: PrefixWorkload, prompts: list[list[int]], params: SamplingParams
) -> LLM:
    from radixflow_jax import LLM

    llm = LLM(
        model_dir, dtype="float32", max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
        max_model_len=w.prefix_len + w.suffix_len + w.output_len, enable_prefix_cache=not args.no_prefix_cache,
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


def run_ours(model_dir: str, args: argparse.Namespace, w: PrefixWorkload, prompts: list[list[int]]) -> EngineRun:
    from radixflow_jax import SamplingParams

    params = SamplingParams(max_tokens=w.output_len, ignore_eos=True)
    t0 = time.perf_counter()
    llm = build_llm(model_dir, args, w, prompts, params)
    step = llm.engine.executor.step
    setup_s, compiles_before = time.perf_counter() - t0, step.num_compiles
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    records = llm.engine.records
    details = {
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
def left_pad(batch: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` as int64 tensors, padded on the left with ``PAD_ID``."""
    import torch

    width = max(map(len, batch))
    ids = torch.full((len(batch), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, p in enumerate(batch):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def hf_generate(model: PreTrainedModel, batch: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    import torch

    ids, mask = left_pad(batch)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
            pad_token_id=PAD_ID, eos_token_id=None,
        )  # fmt: skip
    return out[:, ids.shape[1] :].tolist()


def run_transformers(model_dir: str, args: argparse.Namespace, w: PrefixWorkload, prompts: list[list[int]]) -> EngineRun:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf_generate(model, prompts[: min(2, len(prompts))], 2)  # warm-up: first-call allocations
    setup_s = time.perf_counter() - t0
    outputs: list[list[int]] = []
    start = time.perf_counter()
    for i in range(0, len(prompts), args.hf_batch):
        outputs.extend(hf_generate(model, prompts[i : i + args.hf_batch], w.output_len))
    seconds = time.perf_counter() - start
    details = {"setup_s": setup_s, "batch_size": args.hf_batch, "threads": torch.get_num_threads(),
               "attn_implementation": getattr(model.config, "_attn_implementation", None)}  # fmt: skip
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


def print_table(ours: EngineRun, hf: EngineRun, same: int, prefix_frac: float, total: int) -> None:
    print()
    print(f"{'engine':<16}{'output tok':>12}{'wall s':>10}{'tok/s':>10}")
    for run in (ours, hf):
        print(f"{run.name:<16}{run.output_tokens:>12}{run.seconds:>10.2f}{run.tokens_per_s:>10.1f}")
    print(f"ratio radixflow_jax / transformers: {ours.tokens_per_s / hf.tokens_per_s:.2f}x")
    print(f"greedy agreement: {same}/{total} requests identical token for token "
          f"(mean matching leading fraction {prefix_frac:.2f})")  # fmt: skip
    d = ours.details
    print(f"ours: {d['rounds']} rounds, {d['computed_tokens']} tokens computed, {d['cached_prompt_tokens']} prompt "
          f"tokens from the prefix cache; plan {d['plan_s']:.3f}s build {d['build_s']:.3f}s step {d['step_s']:.3f}s; "
          f"{d['compiled_variants']} variants compiled in {d['compile_s']:.1f}s before timing, "
          f"{d['compiles_in_timed_run']} compiles inside the timed run")  # fmt: skip
    print("ours, step time per bucket: " + ", ".join(
        f"{k} {v['rounds']}x {v['step_s']:.2f}s" for k, v in d["step_s_by_variant"].items()))  # fmt: skip
    print("ours, step time per round kind: " + ", ".join(
        f"{k} {v['rounds']}x {v['tokens']} tok {v['step_s']:.2f}s ({v['ms_per_token']:.2f} ms/tok)"
        for k, v in d["step_by_kind"].items()))  # fmt: skip
    print(f"ours, padding: {100 * d['padding_fraction']:.0f}% of token slots")


def fmt_load(load: Sequence[float]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_setup_args(p)
    p.add_argument("--hf-batch", type=int, default=64, help="transformers batch size")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    p.add_argument("--warmup", choices=("planned", "all"), default="planned")
    p.add_argument("--json", default=None, help="write the results to this path")
    return p.parse_args(argv)


def _median_run(runs: list[EngineRun]) -> EngineRun:
    return sorted(runs, key=lambda r: r.tokens_per_s)[len(runs) // 2]


def run(args: argparse.Namespace, model_dir: str, w: PrefixWorkload, shape: ModelShape) -> dict[str, Any]:
    prompts = w.prompts(vocab_of(model_dir))
    load_before = os.getloadavg()
    print(f"workload: {w}\nmodel: {shape} in {model_dir}", flush=True)
    ours_runs, hf_runs = [], []
    for i in range(max(args.repeats, 1)):  # interleaved: ours, transformers, ours, transformers, ...
        ours_runs.append(run_ours(model_dir, args, w, prompts))
        hf_runs.append(run_transformers(model_dir, args, w, prompts))
        print(f"run {i + 1}: radixflow_jax {ours_runs[-1].tokens_per_s:.1f} tok/s, transformers "
              f"{hf_runs[-1].tokens_per_s:.1f} tok/s, load {fmt_load(os.getloadavg())}", flush=True)  # fmt: skip
    ours, hf = _median_run(ours_runs), _median_run(hf_runs)
    same, prefix_frac = agreement(ours, hf)
    print_table(ours, hf, same, prefix_frac, w.requests)
    ratios = [a.tokens_per_s / b.tokens_per_s for a, b in zip(ours_runs, hf_runs)]
    print(f"median of {len(ours_runs)} interleaved runs; per-run ratios " + ", ".join(f"{r:.2f}x" for r in ratios))
    print(f"load average (1/5/15 min) before {fmt_load(load_before)}, after {fmt_load(os.getloadavg())}")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "workload": dataclasses.asdict(w),
        "model": dataclasses.asdict(shape),
        "engine": {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_batched_tokens,
                   "prefix_cache": not args.no_prefix_cache, "warmup": args.warmup,
                   "buckets": args.buckets},  # fmt: skip
        "radixflow_jax": {"tokens_per_s": ours.tokens_per_s, "seconds": ours.seconds,
                          "output_tokens": ours.output_tokens, **ours.details,
                          "tokens_per_s_runs": [r.tokens_per_s for r in ours_runs]},  # fmt: skip
        "transformers": {"tokens_per_s": hf.tokens_per_s, "seconds": hf.seconds,
                         "output_tokens": hf.output_tokens, **hf.details,
                         "tokens_per_s_runs": [r.tokens_per_s for r in hf_runs]},  # fmt: skip
        "ratio": ours.tokens_per_s / hf.tokens_per_s,
        "ratio_runs": ratios,
        "loadavg_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "agreement": {"identical": same, "requests": w.requests, "mean_matching_fraction": prefix_frac},
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
