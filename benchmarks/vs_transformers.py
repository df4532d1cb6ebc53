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

Compiled step variants are kept in a persistent XLA cache (``--jax-cache``, default
``$RADIXFLOW_CACHE/xla-cache-bench``; ``--jax-cache ''`` turns it off), so a rerun starts faster.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:  # heavy imports stay lazy so --help is instant
    import torch
    from transformers import PreTrainedModel

    from radixflow_jax.engine.core import RoundRecord
    from radixflow_jax.llm import LLM
    from radixflow_jax.engine.params import SamplingParams
    from radixflow_jax.engine.protocol import DeferredRound, StepResult
    from radixflow_jax.runner.inputs import SamplingRow
    from radixflow_jax.runner.shapes import ShapeConfig, Variant
    from radixflow_jax.scheduler.plan import RoundPlan


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The Qwen3.5-text dimensions of the benchmark model."""

    hidden: int = 512
    intermediate: int = 1536
    layers: int = 8
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    linear_key_heads: int = 4
    linear_value_heads: int = 8
    linear_head_dim: int = 64
    vocab: int = 4096


@dataclasses.dataclass(frozen=True)
class Workload:
    requests: int = 64
    prefixes: int = 8
    prefix_len: int = 256
    suffix_len: int = 32
    output_len: int = 32
    seed: int = 0


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


QUICK_WORKLOAD = Workload(requests=16, prefixes=4, prefix_len=128, suffix_len=32, output_len=16)
QUICK_SHAPE = ModelShape(hidden=256, intermediate=768, layers=4, heads=4, head_dim=64, linear_key_heads=2,
                         linear_value_heads=4)  # fmt: skip
PAD_ID = 0


# ------------------------------------------------------------------------------------- inputs
def layer_types(layers: int) -> list[str]:
    """Three Gated DeltaNet layers, then one full-attention layer, repeated (Qwen3.5's pattern)."""
    return ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]


def write_model(shape: ModelShape, directory: str, seed: int, head_std: float) -> str:
    """Writes a randomly initialised ``Qwen3_5ForCausalLM`` as a HF directory; returns it."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, linear_num_key_heads=shape.linear_key_heads,
        linear_num_value_heads=shape.linear_value_heads, linear_key_head_dim=shape.linear_head_dim,
        linear_value_head_dim=shape.linear_head_dim, layer_types=layer_types(shape.layers),
        max_position_embeddings=4096, tie_word_embeddings=False, pad_token_id=PAD_ID, eos_token_id=None,
        bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, head_std / math.sqrt(shape.hidden))
    model.save_pretrained(directory)
    return directory


def vocab_of(model_dir: str) -> int:
    with open(os.path.join(model_dir, "config.json")) as f:
        return int(json.load(f)["vocab_size"])


def make_prompts(w: Workload, vocab: int) -> list[list[int]]:
    """``w.requests`` prompts; request ``i`` starts with prefix ``i % w.prefixes``. Ids avoid ``PAD_ID``."""
    rng = np.random.default_rng(w.seed)
    prefixes = rng.integers(1, vocab, size=(w.prefixes, w.prefix_len)).tolist()
    suffixes = rng.integers(1, vocab, size=(w.requests, w.suffix_len)).tolist()
    return [prefixes[i % w.prefixes] + suffixes[i] for i in range(w.requests)]


# ------------------------------------------------------------------------------------- ours
class VariantRecorder:
    """An executor that runs nothing: records the step variant each round selects, samples id 1."""

    def __init__(self, shapes: ShapeConfig, supports_overlap: bool, num_slots: int):
        self.shapes = shapes
        self.num_slots = num_slots  # the device pool's (the decode window is fitted into it)
        self.variants: set[Variant] = set()
        from radixflow_jax.engine.protocol import ExecutorCapabilities

        # plan as the real engine does (overlap changes the rounds)
        self.capabilities = ExecutorCapabilities(overlap=supports_overlap)

    def launch(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow], prev: object = None) -> DeferredRound:
        from radixflow_jax.engine.protocol import DeferredRound

        return DeferredRound(plan, sampling)

    def collect(self, handle: DeferredRound) -> StepResult:
        return self.execute(handle.plan, handle.sampling)

    def execute(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow]) -> StepResult:
        from radixflow_jax.engine.protocol import StepResult

        from radixflow_jax.runner.window import select_round

        v, _ = select_round(plan, self.shapes, self.num_slots)
        self.variants.add(v)
        return StepResult({r.request_id: 1 for r in plan.rows if r.sample}, v.num_tokens, v.num_rows, 0.0, 0.0)


def planned_variants(llm: LLM, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Variant]:
    """The variants the workload will select: the same scheduler config and pools, a recording
    executor. With EOS ignored the plan does not depend on the sampled ids."""
    from radixflow_jax.engine.build import wire_engine

    ex = llm.engine.executor
    recorder = VariantRecorder(ex.shapes, llm.engine.overlap, ex.num_slots)
    dry = wire_engine(llm.engine.wiring, lambda shapes: recorder)
    for ids in prompts:
        dry.add_request(ids, params)
    dry.run_until_done()
    return sorted(recorder.variants, key=lambda v: (v.num_tokens, v.num_rows, v.num_decode))


def build_llm(
    model_dir: str, args: argparse.Namespace, w: Workload, prompts: list[list[int]], params: SamplingParams
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


def step_by_kind(records: Sequence[RoundRecord]) -> dict[str, dict[str, float]]:
    """Per round kind (decode-only, mixed, prefill-only): rounds, real tokens, decode rows, step
    seconds and milliseconds per real token."""
    out: dict[str, dict[str, float]] = {}
    for r in records:
        e = out.setdefault(r.kind, {"rounds": 0, "tokens": 0, "decode_rows": 0, "step_s": 0.0})
        e["rounds"] += 1
        e["tokens"] += r.num_tokens
        e["decode_rows"] += r.num_decode
        e["step_s"] += r.step_s
    for e in out.values():
        e["ms_per_token"] = 1e3 * e["step_s"] / max(e["tokens"], 1)
    return out


def step_by_variant(records: Sequence[RoundRecord]) -> dict[str, dict[str, float]]:
    """Rounds, real tokens and step seconds per ``T{token slots}xR{row slots}`` bucket."""
    out: dict[str, dict[str, float]] = {}
    for r in records:
        entry = out.setdefault(f"T{r.token_slots}xR{r.row_slots}", {"rounds": 0, "tokens": 0, "step_s": 0.0})
        entry["rounds"] += 1
        entry["tokens"] += r.num_tokens
        entry["step_s"] += r.step_s
    return out


def run_ours(model_dir: str, args: argparse.Namespace, w: Workload, prompts: list[list[int]]) -> EngineRun:
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


def run_transformers(model_dir: str, args: argparse.Namespace, w: Workload, prompts: list[list[int]]) -> EngineRun:
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


def configure_jax(cache_dir: str) -> None:
    import jax

    if cache_dir:
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from radixflow_jax.models.presets import cache_root

    d, s = Workload(), ModelShape()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small model and workload (~1-2 minutes)")
    p.add_argument("--requests", type=int, default=None, help=f"default {d.requests} ({QUICK_WORKLOAD.requests} quick)")
    p.add_argument("--prefixes", type=int, default=None)
    p.add_argument("--prefix-len", type=int, default=None)
    p.add_argument("--suffix-len", type=int, default=None)
    p.add_argument("--output-len", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=None, help=f"model width (default {s.hidden})")
    p.add_argument("--layers", type=int, default=None, help=f"layers, 3 GDN : 1 attention (default {s.layers})")
    p.add_argument("--head-std", type=float, default=8.0, help="lm_head std * sqrt(hidden) (greedy margins)")
    p.add_argument("--model-dir", default=None, help="use this HF directory instead of writing a new model")
    p.add_argument("--hf-batch", type=int, default=64, help="transformers batch size")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    p.add_argument("--max-num-seqs", type=int, default=None, help="our row budget (default: --requests, max 64)")
    p.add_argument("--max-batched-tokens", type=int, default=1024, help="our token budget per round")
    p.add_argument("--no-prefix-cache", action="store_true", help="run our engine without the prefix cache")
    p.add_argument("--warmup", choices=("planned", "all"), default="planned")
    p.add_argument("--buckets", choices=("fine", "pow2", "fixed"), default="fine", help="our bucket mode")
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs of each engine; the median is reported")
    p.add_argument("--jax-cache", default=os.path.join(cache_root(), "xla-cache-bench"))
    p.add_argument("--json", default=None, help="write the results to this path")
    return p.parse_args(argv)


def resolve(args: argparse.Namespace) -> tuple[Workload, ModelShape]:
    base_w, base_s = (QUICK_WORKLOAD, QUICK_SHAPE) if args.quick else (Workload(), ModelShape())
    given = {k: getattr(args, k) for k in ("requests", "prefixes", "prefix_len", "suffix_len", "output_len")}
    w = dataclasses.replace(base_w, seed=args.seed, **{k: v for k, v in given.items() if v is not None})
    shape = dataclasses.replace(
        base_s, **{k: v for k, v in (("hidden", args.hidden), ("layers", args.layers)) if v is not None}
    )
    if args.max_num_seqs is None:
        args.max_num_seqs = min(w.requests, 64)
    return w, shape


def _median_run(runs: list[EngineRun]) -> EngineRun:
    return sorted(runs, key=lambda r: r.tokens_per_s)[len(runs) // 2]


def run(args: argparse.Namespace, model_dir: str, w: Workload, shape: ModelShape) -> dict[str, Any]:
    prompts = make_prompts(w, vocab_of(model_dir))
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
    w, shape = resolve(args)
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
