"""The setup of ``benchmarks/vs_transformers.py``, shared with the ``tools/perf`` experiments that
replay it (``pairing_prep``, ``round_ablation``, ``round_profile``): a randomly initialised
Qwen3.5-text hybrid written as a HF directory, the shared-prefix workload, our engine's options,
the *planned* warm-up (compile exactly the step variants the workload selects) and the capture of
one round's step inputs.

Heavy imports (JAX, torch, transformers) happen inside the functions, so a script's ``--help`` is
instant. The model is deterministic in ``(shape, seed, head_std)``; the prompts in
``(workload, vocab)``; the planned variants in the engine's configuration and the prompts (EOS is
ignored, so the plan does not depend on sampled ids).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import tempfile
import unittest.mock
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from radixflow_jax.bench.args import PrefixWorkload, add_workload_args, workload_from_args
from radixflow_jax.paths import cache_root

if TYPE_CHECKING:
    from radixflow_jax.engine.config import RoundRecord
    from radixflow_jax.engine.params import SamplingParams
    from radixflow_jax.engine.protocol import DeferredRound, StepResult
    from radixflow_jax.llm import LLM
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


WORKLOAD = PrefixWorkload()
QUICK_WORKLOAD = PrefixWorkload(requests=16, prefixes=4, prefix_len=128, suffix_len=32, output_len=16)
QUICK_SHAPE = ModelShape(
    hidden=256, intermediate=768, layers=4, heads=4, head_dim=64, linear_key_heads=2, linear_value_heads=4
)
PAD_ID = 0


# ------------------------------------------------------------------------------------- model
def layer_types(layers: int) -> list[str]:
    """Three Gated DeltaNet layers, then one full-attention layer, repeated (Qwen3.5's pattern)."""
    return ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]


def write_model(shape: ModelShape, directory: str, seed: int, head_std: float) -> str:
    """Writes a randomly initialised ``Qwen3_5ForCausalLM`` as a HF directory; returns it. The output
    head is re-drawn with std ``head_std / sqrt(hidden)`` so greedy choices have clear margins."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        linear_num_key_heads=shape.linear_key_heads,
        linear_num_value_heads=shape.linear_value_heads,
        linear_key_head_dim=shape.linear_head_dim,
        linear_value_head_dim=shape.linear_head_dim,
        layer_types=layer_types(shape.layers),
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        pad_token_id=PAD_ID,
        eos_token_id=None,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, head_std / math.sqrt(shape.hidden))
    model.save_pretrained(directory)
    return directory


def vocab_of(model_dir: str) -> int:
    with open(os.path.join(model_dir, "config.json")) as f:
        return int(json.load(f)["vocab_size"])


# ------------------------------------------------------------------------------------- options
def add_setup_args(parser: argparse.ArgumentParser) -> None:
    """The workload, model and engine options of the vs_transformers setup (``--quick`` picks the
    small model and workload; a given option overrides either)."""
    d = ModelShape()
    parser.add_argument("--quick", action="store_true", help="small model and workload (~1-2 minutes)")
    add_workload_args(parser, WORKLOAD, QUICK_WORKLOAD)
    p = parser.add_argument_group("model and engine")
    p.add_argument("--hidden", type=int, default=None, help=f"model width (default {d.hidden})")
    p.add_argument("--layers", type=int, default=None, help=f"layers, 3 GDN : 1 attention (default {d.layers})")
    p.add_argument("--head-std", type=float, default=8.0, help="lm_head std * sqrt(hidden) (greedy margins)")
    p.add_argument("--model-dir", default=None, help="use this HF directory instead of writing a new model")
    p.add_argument("--max-num-seqs", type=int, default=None, help="our row budget (default: --requests, max 64)")
    p.add_argument("--max-batched-tokens", type=int, default=1024, help="our token budget per round")
    p.add_argument("--no-prefix-cache", action="store_true", help="run our engine without the prefix cache")
    p.add_argument("--buckets", choices=("fine", "pow2", "fixed"), default="fine", help="our bucket mode")
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs of each engine; the median is reported")
    p.add_argument(
        "--jax-cache",
        default=os.path.join(cache_root(), "xla-cache-bench"),
        help="persistent XLA cache directory ('' turns it off)",
    )


def setup_from_args(args: argparse.Namespace) -> tuple[PrefixWorkload, ModelShape]:
    """The workload and model shape the options name; sets ``args.max_num_seqs`` to
    ``min(requests, 64)`` when it was not given."""
    w = workload_from_args(args, QUICK_WORKLOAD if args.quick else WORKLOAD)
    given = {k: v for k, v in (("hidden", args.hidden), ("layers", args.layers)) if v is not None}
    shape = dataclasses.replace(QUICK_SHAPE if args.quick else ModelShape(), **given)
    if args.max_num_seqs is None:
        args.max_num_seqs = min(w.requests, 64)
    return w, shape


def configure_jax(cache_dir: str) -> None:
    """Points JAX's persistent compilation cache at ``cache_dir`` (every entry kept); '' leaves it off."""
    import jax

    if cache_dir:
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# ------------------------------------------------------------------------------------- engine
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
        sampled = {r.request_id: 1 for r in plan.rows if r.sample}
        return StepResult(sampled=sampled, token_slots=v.num_tokens, row_slots=v.num_rows, build_s=0.0, step_s=0.0)


def planned_variants(llm: LLM, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Variant]:
    """The variants the workload will select: the same scheduler config and pools, a recording
    executor. With EOS ignored the plan does not depend on the sampled ids."""
    from radixflow_jax.engine.build import assemble_engine

    ex = llm.engine.executor
    recorder = VariantRecorder(ex.shapes, llm.engine.overlap, ex.num_slots)
    spec = dataclasses.replace(llm.engine.spec, eos_token_ids=(), tokenizer=None, vocab_size=None)
    dry = assemble_engine(spec, lambda shapes: recorder)
    for ids in prompts:
        dry.add_request(ids, params)
    dry.run_until_done()
    return sorted(recorder.variants, key=lambda v: (v.num_tokens, v.num_rows, v.num_decode))


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


# ------------------------------------------------------------------------------------- one round
def _wanted(kind: str, full: int) -> Callable[[Any], bool]:
    """Which round a kind captures (the first that matches): ``decode`` a variant of ``full`` decode
    rows only; ``mixed`` one with ``full`` decode rows and at least 512 prefill token slots (under
    the packed mixed layout, ``runner/shapes.py``: more than ``full`` rows and 512 + ``full`` token
    slots, all in the prefill region); ``prefill`` the workload's first round (its prompts' first
    1024 tokens, no decode row)."""
    if kind == "decode":
        return lambda v: v.num_decode == v.num_rows == full
    if kind == "mixed":
        return lambda v: (v.num_decode == full and v.prefill_rows > 0 and v.prefill_tokens >= 512) or (
            v.num_decode == 0 and v.num_rows > full and v.prefill_tokens >= 512 + full
        )
    return lambda v: True


def capture_round(args: argparse.Namespace, kind: str = "decode") -> tuple[Any, Any, dict[str, np.ndarray]]:
    """``(llm, variant, inputs)`` of the workload's first round of ``kind`` (:func:`_wanted`): the
    setup's model (always written anew) and workload run once through ``LLM.generate`` (prefix cache
    on, planned warm-up), the step's inputs of that round kept as host arrays."""
    import jax

    from radixflow_jax import LLM, SamplingParams
    from radixflow_jax.runner import step as step_module

    w, shape = setup_from_args(args)
    configure_jax(args.jax_cache)
    model_dir = write_model(shape, tempfile.mkdtemp(), args.seed, args.head_std)
    prompts = w.prompts(vocab_of(model_dir))
    params = SamplingParams(max_tokens=w.output_len, ignore_eos=True)
    llm = LLM(
        model_dir,
        dtype="float32",
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_batched_tokens,
        max_model_len=w.max_len,
        warmup=False,
    )
    llm.engine.executor.warmup(planned_variants(llm, prompts, params))
    captured: dict[str, Any] = {}
    call = step_module.CompiledStep.__call__
    wanted = _wanted(kind, min(args.max_num_seqs, w.requests))

    def spy(self: Any, variant: Any, p: Any, cache: Any, arrays: dict[str, Any]) -> Any:
        if wanted(variant) and "variant" not in captured:
            captured["variant"], captured["inputs"] = variant, jax.tree_util.tree_map(np.asarray, arrays)
        return call(self, variant, p, cache, arrays)

    with unittest.mock.patch.object(step_module.CompiledStep, "__call__", spy):
        llm.generate(prompts, params)
    if "variant" not in captured:
        raise SystemExit(f"no {kind} round in this workload")
    return llm, captured["variant"], captured["inputs"]
