"""The ``transformers`` side of ``benchmarks/vs_transformers.py``: batched ``generate`` on the benchmark's
Qwen3.5-text hybrid, with or without prefix reuse, in one of three configurations; the probe that
picks the fastest configuration that works; and the paired ratios the benchmark headlines.

Configurations (``HF_CONFIGS``):
  * ``eager``: ``DynamicCache`` (the default cache; for Qwen3.5 it holds ``LinearAttentionLayer`` conv
    and recurrent states for the Gated DeltaNet layers and ``DynamicLayer`` K/V for the attention layers).
  * ``static``: ``cache_implementation="static"`` (``StaticCache``: ``StaticLayer`` K/V of fixed length;
    the linear-attention layers are the same ``LinearAttentionLayer``).
  * ``compile``: the static cache plus ``generate``'s automatic ``torch.compile`` of the decode
    forward (``CompileConfig(mode="default")`` with ``_compile_all_devices`` set, since ``generate``
    compiles only on accelerators otherwise). The prefill forward stays eager in ``generate``.

Prefix reuse (:func:`reuse_generate`): the distinct shared prefixes are prefilled once, in one
forward, into a cache of the configuration's class; every batch then gets a copy of that cache
(``copy.deepcopy``) expanded to one row per request (``Cache.reorder_cache`` with the request's prefix
index, an ``index_select`` along the batch on every layer, linear-attention states included) and
``generate`` continues from it with the full prompts, so only the suffixes are computed.

Why reuse batches hold one suffix length: a batch that continues a cached prefix cannot be left
padded. The padding would sit between the prefix and the suffix; transformers zeroes the hidden
states there (``apply_mask_to_padding_states``), but a Gated DeltaNet step on a zero input still
decays the recurrent state by ``exp(g)`` (``g`` from ``A_log`` and ``dt_bias``, nonzero at a zero
input) and the causal conv window holds the zeros instead of the prefix's last tokens. Measured on
the ``--quick`` model (transformers 5.24): 8 padding ids between a cached 128-id prefix and a 12-id
suffix moved the last logits by up to 0.98 (largest logit 28), against 2e-5 for the same padding
before the prefix (plain batched ``generate``'s case). Each reuse batch therefore holds requests of
one prefix length and one suffix length; the benchmark's workload has one of each, so every request
shares one batch (up to ``--hf-batch``) and the grouping costs nothing there.

Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

HF_CONFIGS = ("eager", "static", "compile")
PAD_ID = 0


def generate_kwargs(config: str) -> dict[str, Any]:
    """The ``generate`` keyword arguments of one configuration (``HF_CONFIGS``)."""
    if config == "eager":
        return {}
    if config == "static":
        return {"cache_implementation": "static"}
    if config == "compile":
        from transformers import CompileConfig

        cc = CompileConfig(mode="default", fullgraph=False)
        cc._compile_all_devices = True  # generate compiles only on accelerators unless this is set
        return {"cache_implementation": "static", "compile_config": cc}
    raise ValueError(f"unknown transformers configuration {config!r} (choose from {HF_CONFIGS})")


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


def hf_generate(
    model: PreTrainedModel,
    batch: Sequence[Sequence[int]],
    max_new_tokens: int,
    config: str = "eager",
    cache: Any = None,
) -> list[list[int]]:
    """Greedy batched ``generate`` (left padding, EOS ignored) of ``batch``; the new ids per row. With
    ``cache`` (a filled prefix cache) ``generate`` continues from it and ``cache_implementation`` is
    dropped from the configuration's arguments (the cache object is given)."""
    import torch

    ids, mask = left_pad(batch)
    kwargs = generate_kwargs(config)
    if cache is not None:
        kwargs.pop("cache_implementation", None)
        kwargs["cache"] = cache
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=PAD_ID,
            eos_token_id=None,
            **kwargs,
        )
    return out[:, ids.shape[1] :].tolist()


# ------------------------------------------------------------------------------------- prefix reuse
@dataclasses.dataclass(frozen=True)
class ReusePlan:
    """Which prefix each request continues and how requests are batched. ``prefixes[k]`` is a distinct
    shared prefix; ``prefix_of[i]`` request ``i``'s index into it; ``batches`` lists request indices,
    each batch of one suffix length and at most ``batch_size`` requests, in request order."""

    prefixes: list[list[int]]
    prefix_of: list[int]
    batches: list[list[int]]


def plan_reuse(prompts: Sequence[Sequence[int]], prefix_len: int, batch_size: int) -> ReusePlan:
    """The :class:`ReusePlan` of prompts whose first ``prefix_len`` ids are the shared prefix."""
    if any(len(p) <= prefix_len for p in prompts):
        raise ValueError("every prompt needs at least one id after its shared prefix")
    index: dict[tuple[int, ...], int] = {}
    prefix_of = [index.setdefault(tuple(p[:prefix_len]), len(index)) for p in prompts]
    by_suffix: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_suffix.setdefault(len(p) - prefix_len, []).append(i)
    batches = [g[j : j + batch_size] for g in by_suffix.values() for j in range(0, len(g), batch_size)]
    return ReusePlan([list(k) for k in index], prefix_of, batches)


def prefill_prefixes(model: PreTrainedModel, prefixes: Sequence[Sequence[int]], config: str, max_len: int) -> Any:
    """One forward over the distinct prefixes (equal lengths, no padding) into a new cache of the
    configuration's class (``DynamicCache``, or ``StaticCache`` of ``max_len`` for static/compile)."""
    import torch
    from transformers import DynamicCache, StaticCache

    ids = torch.tensor([list(p) for p in prefixes], dtype=torch.long)
    if config == "eager":
        cache = DynamicCache(config=model.config)
    else:
        cache = StaticCache(config=model.config, max_cache_len=max_len)
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, use_cache=True, logits_to_keep=1)
    return cache


def reuse_generate(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    plan: ReusePlan,
    max_new_tokens: int,
    config: str,
) -> list[list[int]]:
    """Every prompt's new ids, computing each shared prefix once (:func:`prefill_prefixes`) and each
    batch from a copy of that cache expanded to the batch's rows."""
    import torch

    max_len = max(map(len, prompts)) + max_new_tokens
    prefix_cache = prefill_prefixes(model, plan.prefixes, config, max_len)
    outputs: list[list[int]] = [[] for _ in prompts]
    for batch in plan.batches:
        cache = copy.deepcopy(prefix_cache)
        with torch.inference_mode():
            cache.reorder_cache(torch.tensor([plan.prefix_of[i] for i in batch], dtype=torch.long))
        for i, out in zip(batch, hf_generate(model, [prompts[i] for i in batch], max_new_tokens, config, cache)):
            outputs[i] = out
    return outputs


def plain_generate(
    model: PreTrainedModel, prompts: Sequence[Sequence[int]], batch_size: int, max_new_tokens: int, config: str
) -> list[list[int]]:
    """Every prompt's new ids, in batches of ``batch_size`` in request order, nothing reused."""
    outputs: list[list[int]] = []
    for i in range(0, len(prompts), batch_size):
        outputs.extend(hf_generate(model, prompts[i : i + batch_size], max_new_tokens, config))
    return outputs


# ------------------------------------------------------------------------------------- the probe
@dataclasses.dataclass
class ProbeResult:
    """One configuration's probe: ``error`` when it failed (its type and message), else the warm-up
    (compile included) and timed seconds and whether its outputs equal the eager ones."""

    config: str
    error: str | None = None
    warmup_s: float = 0.0
    seconds: list[float] = dataclasses.field(default_factory=list)
    same_as_eager: bool | None = None

    @property
    def best_s(self) -> float:
        return min(self.seconds) if self.seconds else float("inf")


def _probe_once(fn: Any, config: str, result: ProbeResult) -> list[list[int]] | None:
    """Runs ``fn(config)`` and records its time, or its error on ``result``; returns the outputs or None."""
    t0 = time.perf_counter()
    try:
        out = fn(config)
    except Exception as e:  # noqa: BLE001 - a configuration that fails is reported, not fatal
        result.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        return None
    result.seconds.append(time.perf_counter() - t0)
    return out


def probe_configs(
    runs: dict[str, Any], configs: Sequence[str] = HF_CONFIGS, repeats: int = 1, log: Callable[[str], None] | None = None
) -> dict[str, ProbeResult]:
    """Tries each configuration on every workload path in ``runs`` (name -> ``fn(config)`` returning
    outputs): one untimed warm-up per path (compiles happen there), then ``repeats`` interleaved timed
    rounds of all paths. A configuration that raises is recorded with its error and dropped. The
    first configuration's outputs are the reference ``same_as_eager`` compares with (``eager`` first).
    ``log`` gets a line as each configuration's warm-up ends (a compile takes minutes on 2 cores)."""
    results = {c: ProbeResult(c) for c in configs}
    reference: dict[str, list[list[int]]] = {}
    for c, r in results.items():
        t0 = time.perf_counter()
        for name, fn in runs.items():
            out = _probe_once(fn, c, r)
            if out is None:
                break
            reference.setdefault(name, out)  # eager comes first: its outputs are the reference
            r.same_as_eager = (r.same_as_eager is not False) and out == reference[name]
        r.warmup_s, r.seconds = time.perf_counter() - t0, []
        if log is not None:
            log(f"transformers {c}: warmed up in {r.warmup_s:.1f}s" + (f", failed: {r.error}" if r.error else ""))
    for _ in range(repeats):
        for r in results.values():
            if r.error is None:
                total = ProbeResult(r.config)
                for fn in runs.values():
                    _probe_once(fn, r.config, total)
                r.error = total.error
                r.seconds.append(sum(total.seconds))
    return results


def fastest(results: dict[str, ProbeResult]) -> str:
    """The working configuration with the least probe time (``eager`` when every other failed)."""
    working = [r for r in results.values() if r.error is None and r.seconds]
    return min(working, key=lambda r: r.best_s).config if working else "eager"


# ------------------------------------------------------------------------------------- ratios
def ratio_spread(ratios: Sequence[float]) -> dict[str, Any]:
    """The median of per-run ratios with its spread (min, max, quartiles) and the runs themselves."""
    import numpy as np

    r = np.asarray(list(ratios), dtype=float)
    if r.size == 0:
        raise ValueError("no runs")
    q1, med, q3 = (float(x) for x in np.percentile(r, [25, 50, 75]))
    return {
        "median": med,
        "min": float(r.min()),
        "max": float(r.max()),
        "q1": q1,
        "q3": q3,
        "runs": [float(x) for x in r],
    }
