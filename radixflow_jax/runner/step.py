"""The jitted step and its compiled variants.

``step(params, cache, arrays) -> (cache, tokens)`` with the pools donated:
  1. copy source checkpoints into the rows' state slots (``copy_src -> state_slots``);
  2. run the model over the packed ragged batch (KV and states written in place, checkpoints
     emitted at the requested offsets inside the spans);
  3. project the last token of every row to logits and sample on device.

Every variant is compiled ahead of time (``jit(...).lower(...).compile()``) and called directly,
so a round can never trigger a hidden recompile: :class:`CompiledStep` counts compilations and,
when ``strict``, refuses to compile after warm-up (the compile guard of the tests).
"""

from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from radixflow_jax.kernels import ops
from radixflow_jax.models.batch import Batch, ModelCache
from radixflow_jax.models.mixers.recurrent import Emits
from radixflow_jax.runner.sampling import apply_penalties, sample, token_logprobs

MAX_LOGPROBS = 20  # top alternatives computed per sampled token (the OpenAI API's maximum)
from radixflow_jax.runner.shapes import ShapeConfig, Variant


class CompileAfterWarmupError(RuntimeError):
    """A step variant was compiled after warm-up while the compile guard was on."""

    recoverable = False  # a guard, not a device error: the engine must not retry around it


def copy_checkpoints(cache: ModelCache, src: jax.Array, dst: jax.Array, fresh: jax.Array) -> ModelCache:
    """``pool[dst[r]] = pool[src[r]]`` for every recurrent pool (all reads happen before writes);
    rows that start a sequence (``fresh``: no context before their span) get a zero state instead,
    whatever an earlier owner left in their slot."""

    def move(pool: jax.Array) -> jax.Array:
        mask = fresh.reshape((-1,) + (1,) * (pool.ndim - 1))
        return pool.at[dst].set(jnp.where(mask, jnp.zeros((), pool.dtype), pool[src]))

    return ModelCache(kv=cache.kv, conv=tuple(map(move, cache.conv)), ssm=tuple(map(move, cache.ssm)))


def make_step(graphdef: nnx.GraphDef, num_decode: int) -> Callable:
    def step(params: nnx.State, cache: ModelCache, a: dict[str, jax.Array]) -> tuple[ModelCache, jax.Array]:
        model = nnx.merge(graphdef, params)
        span = a["cu_seqlens"][1:] - a["cu_seqlens"][:-1]
        cache = copy_checkpoints(cache, a["copy_src"], a["state_slots"], a["kv_lens"] == span)
        batch = Batch(a["cu_seqlens"], a["kv_lens"], a["page_table"], a["slot_mapping"], a["state_slots"])
        emits = Emits(a["emit_rows"], a["emit_offsets"], a["emit_slots"])
        hidden, cache = model(a["tokens"], batch, cache, num_decode=num_decode, emits=emits)
        logits = model.logits(hidden[a["logits_index"]]).astype(jnp.float32)
        logits = apply_penalties(logits, a["ctx_ids"], a["ctx_out"], a["presence"], a["frequency"], a["repetition"])
        tokens = sample(logits, a["temperature"], a["top_k"], a["top_p"], a["min_p"], a["seed"], a["position"])
        return cache, (tokens, *token_logprobs(logits, tokens, min(MAX_LOGPROBS, logits.shape[-1])))

    return step


def array_specs(variant: Variant, max_pages: int, penalty_window: int = 0) -> dict[str, jax.ShapeDtypeStruct]:
    t, r, m, w = variant.num_tokens, variant.num_rows, variant.max_emits, penalty_window
    i32, f32 = jnp.int32, jnp.float32
    shapes = {
        "tokens": ((t,), i32), "cu_seqlens": ((r + 1,), i32), "kv_lens": ((r,), i32),
        "page_table": ((r, max_pages), i32), "slot_mapping": ((t,), i32), "state_slots": ((r,), i32),
        "copy_src": ((r,), i32), "emit_rows": ((m,), i32), "emit_offsets": ((m,), i32), "emit_slots": ((m,), i32),
        "logits_index": ((r,), i32), "temperature": ((r,), f32), "top_k": ((r,), i32), "top_p": ((r,), f32),
        "min_p": ((r,), f32), "seed": ((r,), jnp.uint32), "position": ((r,), i32),
        "presence": ((r,), f32), "frequency": ((r,), f32), "repetition": ((r,), f32),
        "ctx_ids": ((r, w), i32), "ctx_out": ((r, w), jnp.bool_),
    }  # fmt: skip
    return {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in shapes.items()}


class CompiledStep:
    """Compiled executables per variant, built with the kernel backend ``kernels``."""

    def __init__(
        self, graphdef: nnx.GraphDef, params: nnx.State, cache: ModelCache, shapes: ShapeConfig, kernels: str,
        penalty_window: int = 0,
    ):  # fmt: skip
        self.graphdef = graphdef
        self.penalty_window = penalty_window
        self.shapes = shapes
        self.kernels = kernels
        self._params_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
        self._cache_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), cache)
        self._compiled: dict[Variant, Callable] = {}
        self.num_compiles = 0
        self.compile_seconds = 0.0
        self.last_compile_s = 0.0  # compile time spent inside the latest call (lazy warm-up)
        self.strict = False

    def _compile(self, variant: Variant) -> Callable:
        if self.strict:
            raise CompileAfterWarmupError(f"step variant {variant} was not compiled at warm-up")
        start = time.perf_counter()
        fn = jax.jit(make_step(self.graphdef, variant.num_decode), donate_argnums=(1,))
        with ops.use_backend(self.kernels):
            lowered = fn.lower(
                self._params_spec, self._cache_spec,
                array_specs(variant, self.shapes.max_pages_per_row, self.penalty_window),
            )  # fmt: skip
        compiled = lowered.compile()
        self.num_compiles += 1
        self.compile_seconds += time.perf_counter() - start
        self._compiled[variant] = compiled
        return compiled

    def warmup(self, variants: list[Variant] | None = None) -> None:
        """Compiles every variant (or the given ones); afterwards the guard may be turned on."""
        for v in variants if variants is not None else self.shapes.variants():
            if v not in self._compiled:
                self._compile(v)

    def __call__(
        self, variant: Variant, params: nnx.State, cache: ModelCache, arrays: dict[str, np.ndarray]
    ) -> tuple[ModelCache, jax.Array]:
        fn = self._compiled.get(variant)
        if fn is None:
            before = self.compile_seconds
            fn = self._compile(variant)
            self.last_compile_s = self.compile_seconds - before
        else:
            self.last_compile_s = 0.0
        return fn(params, cache, arrays)
