"""Prompt scoring (``prompt_logprobs``; ``echo`` with ``logprobs`` over HTTP) in one fixed-shape program.

A prompt runs through the model's own extend path in chunks of :data:`CHUNK` tokens over a scratch
sequence of ``capacity`` tokens (its own pages and state slot 1: neither the engine's pools nor the
prefix cache, whose tokens have no logits), the KV and recurrent state carried from chunk to chunk.
A chunk's logits stay on the device: the log-softmax, the top ``MAX_LOGPROBS`` of the logits and the
logprob of the next prompt token are computed there, so only ``[CHUNK, top]`` ids and logprobs and
``[CHUNK]`` logprobs come back to the host, never ``[T, vocab]``.

Invariants:
  * One program per scorer (chunk length, capacity, ``top`` and the model fixed), whatever the
    prompt's length: it is compiled once (at the executor's warm-up, ``prime``), and with
    ``strict`` (the compile guard: ``CompiledStep.strict``) a call that would compile raises
    :class:`~radixflow_jax.runner.step.CompileAfterWarmupError` instead. Scorers over one
    ``LoadedModel`` share the compiled program (``LoadedModel.compiled_variants``).
  * A prompt longer than ``capacity`` raises ``ValueError`` (intake refuses it before:
    ``RequestLimits.score_max_len``).
  * The results are those of a cold full forward scored in float64 on the host (the previous
    implementation) within float32 rounding: top ids by logit, highest first, ties by the lower id
    (``lax.top_k``, as a stable argsort), their logprobs ``log_softmax`` of the float32 logits.
  * The scratch sequence is allocated at the first use and kept; a call that fails drops it (its
    buffers were donated) and the next call allocates a fresh one.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from radixflow_jax.kernels import ops
from radixflow_jax.models.api import LoadedModel
from radixflow_jax.models.batch import Batch, ModelCache, init_cache
from radixflow_jax.runner.step import MAX_LOGPROBS, CompileAfterWarmupError

CHUNK = 128  # prompt tokens per call of the scoring program (a multiple of the models' scan chunk)
PAGE = 16  # the scratch sequence's page size

PromptScore = tuple[float, list[int], list[float]]  # (logprob of the token, top ids, their logprobs)


def make_score_program(graphdef: nnx.GraphDef, *, chunk: int, num_pages: int, top: int) -> Callable:
    """``(params, cache, tokens [chunk], targets [chunk], start, n) -> (cache, (chosen [chunk],
    top_ids [chunk, top], top_lp [chunk, top]))``: tokens ``[start, start + n)`` of the scratch
    sequence (the first ``n`` entries of ``tokens``; ``start == 0`` starts it from a zero state);
    ``chosen[i]`` is the logprob of ``targets[i]`` after token ``start + i``."""

    def score(
        params: nnx.State, cache: ModelCache, tokens: jax.Array, targets: jax.Array, start: jax.Array, n: jax.Array
    ) -> tuple[ModelCache, tuple[jax.Array, jax.Array, jax.Array]]:
        model = nnx.merge(graphdef, params)
        offsets = jnp.arange(chunk, dtype=jnp.int32)
        pos = start + offsets
        slots = jnp.where(offsets < n, (pos // PAGE + 1) * PAGE + pos % PAGE, 0)  # padding: page 0, the sink
        batch = Batch(
            cu_seqlens=jnp.stack([jnp.int32(0), n]),
            kv_lens=jnp.reshape(start + n, (1,)),
            page_table=jnp.arange(1, num_pages + 1, dtype=jnp.int32)[None, :],
            slot_mapping=slots.astype(jnp.int32),
            state_slots=jnp.ones((1,), jnp.int32),
            fresh=jnp.reshape(start == 0, (1,)),
            decode_base=jnp.int32(1),
        )
        hidden, cache = model(tokens, batch, cache, num_decode=0)
        logits = model.logits(hidden).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        _, top_ids = jax.lax.top_k(logits, top)  # by logit: no ties made by rounding the shift
        top_lp = jnp.take_along_axis(logp, top_ids, axis=-1)
        chosen = jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]
        return cache, (chosen, top_ids.astype(jnp.int32), top_lp)

    return score


class PromptScorer:
    """Scores prompts of up to ``capacity`` tokens with one compiled program (module docstring)."""

    def __init__(self, model: LoadedModel, *, capacity: int, kernels: str = "auto", chunk: int = CHUNK):
        self.model = model
        self.chunk = chunk
        self.num_pages = -(-capacity // PAGE)
        self.capacity = self.num_pages * PAGE
        self.top = min(MAX_LOGPROBS, model.config.vocab_size)
        self.kernels = kernels
        self.num_compiles = 0
        self.compile_seconds = 0.0
        self._program: Callable | None = None
        self._cache: ModelCache | None = None

    @property
    def is_compiled(self) -> bool:
        return self._program is not None

    def _key(self) -> tuple:
        return ("prompt_scorer", self.chunk, self.num_pages, self.top, self.kernels, ops.trace_flags())

    def _scratch(self) -> ModelCache:
        if self._cache is None:
            cfg, dtype = self.model.config, self.model.dtype
            pools = init_cache(cfg, num_pages=self.num_pages + 1, page_size=PAGE, num_slots=2, dtype=dtype)
            self._cache = self.model.place_cache(pools)
        return self._cache

    def _compiled(self, *, strict: bool) -> Callable:
        if self._program is not None:
            return self._program
        shared = self.model.compiled_variants
        if self._key() in shared:
            self._program = shared[self._key()]
            return self._program
        if strict:
            raise CompileAfterWarmupError("the prompt scoring program was not compiled at warm-up")
        start = time.perf_counter()
        fn = jax.jit(
            make_score_program(self.model.graphdef, chunk=self.chunk, num_pages=self.num_pages, top=self.top),
            donate_argnums=(1,),
        )
        ids = np.zeros(self.chunk, np.int32)
        with ops.use_backend(self.kernels):
            lowered = fn.lower(self.model.params, self._scratch(), ids, ids, np.int32(0), np.int32(0))
        self._program = lowered.compile()
        shared[self._key()] = self._program
        self.num_compiles += 1
        self.compile_seconds += time.perf_counter() - start
        return self._program

    def prime(self) -> None:
        """Compiles the program (unless this model's scorers have) and runs it once on one token."""
        self.score([0, 0], 0)

    def score(self, prompt: Sequence[int], k: int, *, strict: bool = False) -> list[PromptScore | None]:
        """Per prompt token: None for the first, else ``(logprob, top k ids, their logprobs)`` given
        the tokens before it; ``k`` is capped at ``top`` (``MAX_LOGPROBS``, or the whole vocabulary
        when smaller). ``strict``: refuse to compile (``CompileAfterWarmupError``)."""
        if k < 0:
            raise ValueError(f"prompt_logprobs={k}: expected >= 0")
        k = min(k, self.top)
        if not 0 < len(prompt) <= self.capacity:
            raise ValueError(f"a scored prompt has 1 to {self.capacity} tokens, got {len(prompt)}")
        program = self._compiled(strict=strict)
        ids = np.asarray(prompt, np.int32)
        targets = np.zeros(len(ids) + self.chunk, np.int32)
        targets[: len(ids) - 1] = ids[1:]
        parts = []
        try:
            for start in range(0, len(ids), self.chunk):
                n = min(self.chunk, len(ids) - start)
                tokens = np.zeros(self.chunk, np.int32)
                tokens[:n] = ids[start : start + n]
                args = (tokens, targets[start : start + self.chunk], np.int32(start), np.int32(n))
                self._cache, out = program(self.model.params, self._scratch(), *args)
                parts.append((n, out))
            fetched = [(n, jax.device_get(out)) for n, out in parts]
        except BaseException:
            self._cache = None  # the donated scratch may be gone: the next call allocates one
            raise
        chosen = np.concatenate([c[:n] for n, (c, _, _) in fetched])
        top_ids = np.concatenate([t[:n, :k] for n, (_, t, _) in fetched])
        top_lp = np.concatenate([t[:n, :k] for n, (_, _, t) in fetched])
        out: list[PromptScore | None] = [None]
        for i in range(1, len(ids)):
            out.append((float(chosen[i - 1]), top_ids[i - 1].tolist(), top_lp[i - 1].tolist()))
        return out
