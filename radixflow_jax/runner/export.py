"""The whole jitted round exported for another platform (``jax.export``), from abstract shapes.

A GPU or TPU step can be lowered on a CPU host: the model is built abstractly
(``models/weights.abstract_model``: shapes and dtypes only, no weights in memory), the pools by
``jax.eval_shape`` of ``init_cache``, the round's inputs by ``runner/step.input_specs``, and the
step (``runner/step.make_step``, the very function the engine compiles) is traced under
``ops.target_platform(platform)`` so that ops pick that platform's kernels (the Pallas Triton
variants for ``cuda``, the Mosaic variants for ``tpu``; no native CPU kernel). The exported program
runs only on its platform; device compilers (Triton's PTX backend, libtpu's Mosaic passes) run
there, so an export catches lowering errors, not device compile errors.

Pairing (policy ``pair``) is part of every variant: ``pair_emit`` is one of the step's inputs, and
the recurrent mixers trace the paired-consumer path whatever its runtime value, so an exported
variant serves paired and unpaired rounds alike.

An op that cannot lower for the platform raises :class:`ExportError` naming the variant, the
platform and the lowering's own message (which names the op).
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
from jax import export as jax_export

from radixflow_jax.cache.config import CacheConfig
from radixflow_jax.kernels import ops
from radixflow_jax.models.batch import init_cache
from radixflow_jax.models.config import ModelConfig
from radixflow_jax.models.weights import abstract_model
from radixflow_jax.runner.shapes import ShapeConfig, Variant
from radixflow_jax.runner.step import input_specs, make_step, out_rows

# custom calls that jax.export does not list as stable but that a Pallas kernel lowers to: the
# Triton kernels' call target on GPUs (the exported module pins the Triton IR it carries)
_UNSTABLE_CALLS = {"cuda": ("__gpu$xla.gpu.triton",), "rocm": ("__gpu$xla.gpu.triton",), "tpu": (), "cpu": ()}
_CALL = re.compile(r"custom_call @([\w$.]+)|call_target_name = \"([\w$.]+)\"")


class ExportError(RuntimeError):
    """A step variant cannot be lowered for a platform; the message names the variant, the
    platform and the failing op as the lowering reported it."""


@dataclasses.dataclass(frozen=True)
class StepExport:
    """One exported variant. ``custom_calls``: ``(target, count)`` of every custom call in the
    lowered module, by target name (the Pallas kernels show up here: ``tpu_custom_call`` for Mosaic,
    ``__gpu$xla.gpu.triton`` for Triton; a native CPU kernel would show its FFI target)."""

    platform: str
    variant: Variant
    exported: jax_export.Exported
    custom_calls: tuple[tuple[str, int], ...]

    def calls(self, target: str) -> int:
        return dict(self.custom_calls).get(target, 0)

    @property
    def module_chars(self) -> int:
        """Size of the lowered StableHLO text (serialising needs the optional ``flatbuffers``)."""
        return len(self.exported.mlir_module())


@dataclasses.dataclass(frozen=True)
class ExportShapes:
    """The engine-side sizes a step is exported at: the round budgets (``max_num_batched_tokens`` /
    ``max_num_seqs``, as ``EngineConfig`` names them), the model context (``max_model_len``), the
    pools and the penalty window."""

    max_num_batched_tokens: int = 2048 + 64
    max_num_seqs: int = 64
    max_model_len: int = 4096
    page_size: int = 16
    num_pages: int = 1024
    num_slots: int = 128
    penalty_window: int = 0
    bucket_mode: str = "fine"

    def step_shapes(self, cfg: ModelConfig) -> ShapeConfig:
        chunks = [c.chunk_size for c in (cfg.gdn, cfg.mamba) if c is not None]
        geometry = CacheConfig.for_model(self.page_size, chunks, hybrid=cfg.is_hybrid)
        return ShapeConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            max_pages_per_row=math.ceil(self.max_model_len / self.page_size),
            grid=geometry.grid,
            mode=self.bucket_mode,
        )


def standard_variants(shapes: ShapeConfig, prefill_tokens: int) -> dict[str, Variant]:
    """The three round kinds at full rows: ``decode`` (every row one token), ``prefill`` (about
    ``prefill_tokens`` tokens over every row) and ``mixed`` (half the rows decoding, the rest
    sharing the prefill tokens), as the runner selects them."""
    rows = shapes.max_num_seqs
    half = rows // 2
    return {
        "decode": shapes.select(rows, rows, all_decode=True),
        "prefill": shapes.select(prefill_tokens, rows),
        "mixed": shapes.select(prefill_tokens + half, rows, num_decode=half, decode_span=half),
    }


def export_step(
    cfg: ModelConfig,
    dtype: str | jnp.dtype,
    sizes: ExportShapes,
    variant: Variant,
    platform: str,
    *,
    kernels: str = "pallas",
) -> StepExport:
    """Lowers the step of ``variant`` for ``platform`` with backend ``kernels`` (``pallas``: the
    platform's Pallas kernels, an op without one on its XLA form; ``xla``: no Pallas)."""
    dtype = jnp.dtype(dtype)
    shapes = sizes.step_shapes(cfg)
    graphdef, params = abstract_model(cfg, dtype)
    cache = jax.eval_shape(
        lambda: init_cache(
            cfg, num_pages=sizes.num_pages, page_size=sizes.page_size, num_slots=sizes.num_slots, dtype=dtype
        )
    )
    inputs = input_specs(variant, shapes.max_pages_per_row, sizes.penalty_window, out_rows(shapes))
    step = jax.jit(make_step(graphdef, variant.num_decode, out_rows(shapes), mtp=shapes.mtp), donate_argnums=(1,))
    checks = [jax_export.DisabledSafetyCheck.custom_call(name) for name in _UNSTABLE_CALLS.get(platform, ())]
    try:
        with ops.use_backend(kernels), ops.target_platform(platform):
            exported = jax_export.export(step, platforms=[platform], disabled_checks=checks)(params, cache, inputs)
    except Exception as exc:  # the lowering's own error type varies by op and platform
        raise ExportError(
            f"step variant {variant} does not lower for {platform} with {kernels} kernels: {type(exc).__name__}: {exc}"
        ) from exc
    counts: dict[str, int] = {}
    for a, b in _CALL.findall(exported.mlir_module()):
        counts[a or b] = counts.get(a or b, 0) + 1
    return StepExport(platform, variant, exported, tuple(sorted(counts.items())))
