"""The jitted step and its compiled variants.

``step(params, cache, inputs) -> (cache, tokens)`` with the pools donated (``inputs``: a
:class:`~radixflow_jax.runner.inputs.StepInputs`, a pytree of arrays):
  1. copy source checkpoints into the rows' state slots (``copy_src -> state_slots``): each
     recurrent layer reads a row's initial state from ``copy_src`` and writes to ``state_slots``;
  2. run the model over the packed ragged batch (KV and states written in place, checkpoints
     emitted at the requested offsets inside the spans);
  3. project the last token of every row to logits, apply penalties, bias and the grammar mask
     (``token_mask``, structured outputs; each skipped at run time in a round no row uses it), and
     sample on device (the last layer computes only those tokens past its mixers,
     ``HybridLM.__call__``'s ``row_last``);
  4. speculative decoding (a variant with ``num_verify``): the token after each verify point
     (``verify_index``), drawn as a round without drafts draws it (``_verify``), returned beside
     the sampled tokens; a hybrid verify row's slot then gets the state after its last accepted
     token (``runner/rollback.py``, from the recurrent layers' verify lanes).

Overlap (``engine/executor.py``): a row may take its input token from the previous round's sampled
array *on the device*: ``splice_src[t] >= 0`` replaces input token ``t`` with
``prev_tokens[splice_src[t]]``. So that any round can feed any other, every variant returns its
sampled tokens padded to ``out_rows(shapes)`` entries (row ``i`` of the round at index ``i``).

Every variant is compiled ahead of time (``jit(...).lower(...).compile()``), at warm-up or lazily
the first time a round needs it (through the persistent XLA cache when one is configured), and
called directly, so a round can never trigger a hidden recompile: :class:`CompiledStep` counts
compilations and, when ``strict``, refuses to compile (the compile guard of the tests). A variant
is *primed* (executed once on an all-padding batch, which touches only page 0 and slot 0) right
after it compiles, so first-execution costs never land in a timed round.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import OrderedDict
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding

from radixflow_jax.kernels import ops
from radixflow_jax.models.batch import Batch, ModelCache
from radixflow_jax.models.mixers.recurrent import Emits
from radixflow_jax.runner.inputs import StepInputs, empty_inputs, padding_inputs
from radixflow_jax.runner.mapbudget import MapBudget, MapBudgetError
from radixflow_jax.runner.mtpstep import mtp_drafts
from radixflow_jax.runner.rollback import accepted_steps, keep_accepted
from radixflow_jax.runner.sampling import (
    apply_bias,
    apply_mask,
    apply_penalties,
    penalised_rows,
    sample,
    token_logprobs,
)
from radixflow_jax.runner.shapes import ShapeConfig, Variant

MAX_LOGPROBS = 20  # top alternatives computed per sampled token (the OpenAI API's maximum)


class CompileAfterWarmupError(RuntimeError):
    """A step variant was compiled after warm-up while the compile guard was on."""

    recoverable = False  # a guard, not a device error: the engine must not retry around it


def out_rows(shapes: ShapeConfig) -> int:
    """Length of every variant's sampled-token output (the most rows a variant has: decode region
    plus prefill rows)."""
    return 2 * shapes.max_num_seqs


def make_step(graphdef: nnx.GraphDef, num_decode: int, num_out: int, *, mtp: bool = False) -> Callable:
    """The step function of one variant; ``mtp``: it also drafts with the model's MTP layer."""

    def step(params: nnx.State, cache: ModelCache, inputs: StepInputs) -> tuple[ModelCache, jax.Array]:
        model = nnx.merge(graphdef, params)
        src = inputs.splice_src  # overlap: input tokens sampled by the previous round, on the device
        input_ids = jnp.where(src >= 0, inputs.prev_tokens[jnp.maximum(src, 0)], inputs.tokens)
        span = inputs.cu_seqlens[1:] - inputs.cu_seqlens[:-1]
        # copy-on-write of source checkpoints: each recurrent layer reads a row's initial state from
        # copy_src (zero for rows that start a sequence) and writes its result to state_slots
        batch = Batch(
            cu_seqlens=inputs.cu_seqlens, kv_lens=inputs.kv_lens, page_table=inputs.page_table,
            slot_mapping=inputs.slot_mapping, state_slots=inputs.state_slots, source_slots=inputs.copy_src,
            fresh=inputs.kv_lens == span, pair_emit=inputs.pair_emit, decode_base=inputs.decode_base,
        )
        emits = Emits(inputs.emit_rows, inputs.emit_offsets, inputs.emit_slots)
        # hidden states of each row's last token only: the last layer's queries, output projections
        # and MLP run on those alone (a decode-only variant has one token per row already)
        rows = inputs.logits_index.shape[0]
        prefill = inputs.tokens.shape[0] > rows or inputs.verify_index.shape[0] > 0
        row_last = jnp.concatenate([inputs.logits_index, inputs.verify_index]) if prefill else None
        points = inputs.verify_index.shape[0]
        lane_steps = points // (rows - num_decode) if points else 0  # a verify variant: the drafts' states
        assert not mtp or model.mtp is not None, "MTP drafts need a model loaded with its MTP layers"
        hidden, cache, lanes = model.forward(
            input_ids, batch, cache, num_decode=num_decode, emits=emits, row_last=None if mtp else row_last,
            lane_steps=lane_steps,
        )  # fmt: skip
        every_slot = hidden
        if mtp and row_last is not None:
            hidden = hidden[row_last]
        verified, point_logits = jnp.zeros((0,), jnp.int32), None
        if points:  # speculative decoding: the token after each verify point
            verified, point_logits = _verify(model.logits(hidden[rows:]).astype(jnp.float32), inputs)
            hidden = hidden[:rows]
            if lanes:  # a verify row's slot keeps the state after its last accepted token
                cache = keep_accepted(cache, lanes, inputs, accepted_steps(inputs, input_ids, verified, num_decode),
                                      num_decode)  # fmt: skip
        logits = model.logits(hidden if prefill else hidden[inputs.logits_index]).astype(jnp.float32)
        logits = apply_penalties(
            logits, inputs.ctx_ids, inputs.ctx_out, inputs.presence, inputs.frequency, inputs.repetition
        )
        logits = apply_bias(logits, inputs.bias_ids, inputs.bias_vals, inputs.bias_until, inputs.position)
        if inputs.token_mask.shape[-1]:  # structured outputs: each row's grammar mask (all ones: none)
            logits = apply_mask(logits, inputs.token_mask)
        tokens = sample(
            logits, inputs.temperature, inputs.top_k, inputs.top_p, inputs.min_p, inputs.seed, inputs.position
        )

        k = min(MAX_LOGPROBS, logits.shape[-1])

        def logprobs() -> tuple[jax.Array, ...]:
            out = token_logprobs(logits, tokens, k)
            return out + (() if point_logits is None else token_logprobs(point_logits, verified, k))

        skipped = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(logprobs))
        # a round where no row asked for logprobs does not pay for the log-softmax and top-k
        lp = jax.lax.cond(jnp.any(inputs.want_logprobs), logprobs, lambda: skipped)
        padded = jnp.zeros((num_out,), jnp.int32).at[:rows].set(tokens.astype(jnp.int32))
        drafts = jnp.zeros((0,), jnp.int32)
        if mtp:
            sampled = (tokens, verified)
            cache, guesses = mtp_drafts(model, every_slot, input_ids, batch, cache, inputs, sampled, num_decode)
            drafts = jnp.zeros((num_out,), jnp.int32).at[:rows].set(guesses)
        return cache, (padded, verified, drafts, *lp)

    return step


def _verify(logits: jax.Array, inputs: StepInputs) -> tuple[jax.Array, jax.Array]:
    """The token after each verify point and the logits it was drawn from, drawn as a round without
    drafts draws the token at that position (``runner/verify.py``): with the point's row's sampling
    parameters, penalties over its context and the drafted tokens before it (``verify_ctx_end``),
    the row's bias entries at the point's position (``logit_bias``, ``min_tokens``), the point's
    grammar mask, and ``key(seed)`` folded with the position it samples (its token's position + 1).
    So a drafted token is kept with probability ``p(draft)`` (speculative sampling for a draft
    proposed with certainty, as an n-gram lookup proposes it) and every committed token is the one
    a run without drafts draws with the same seed."""
    idx, cu = inputs.verify_index, inputs.cu_seqlens
    row = jnp.clip(jnp.searchsorted(cu[1:], idx, side="right"), 0, inputs.kv_lens.shape[0] - 1)
    position = inputs.kv_lens[row] - (cu[row + 1] - idx) + 1
    if inputs.ctx_ids.shape[-1]:
        penalties = (inputs.presence[row], inputs.frequency[row], inputs.repetition[row])

        def penalised() -> jax.Array:  # the contexts are gathered only in rounds with a penalised point
            within = jnp.arange(inputs.ctx_ids.shape[-1])[None, :] < inputs.verify_ctx_end[:, None]
            ctx_ids = jnp.where(within, inputs.ctx_ids[row], -1)
            return apply_penalties(logits, ctx_ids, inputs.ctx_out[row] & within, *penalties)

        logits = jax.lax.cond(jnp.any(penalised_rows(*penalties)), penalised, lambda: logits)
    logits = apply_bias(logits, inputs.bias_ids[row], inputs.bias_vals[row], inputs.bias_until[row], position)
    if inputs.verify_mask.shape[-1]:
        logits = apply_mask(logits, inputs.verify_mask)
    params = (inputs.temperature, inputs.top_k, inputs.top_p, inputs.min_p, inputs.seed)
    return sample(logits, *(x[row] for x in params), position), logits


def input_specs(
    variant: Variant, max_pages: int, penalty_window: int = 0, num_out: int = 0, mask_words: int = 0
) -> StepInputs:
    """Shapes and dtypes of the step's inputs (those of ``runner/inputs.empty_inputs``); ``num_out``:
    length of the previous round's sampled array (overlap); ``mask_words``: width of the grammar
    mask, ``ceil(vocab / 32)`` (0: no structured outputs)."""
    empty = empty_inputs(variant, max_pages, penalty_window=penalty_window, num_out=num_out, mask_words=mask_words)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), empty)


def _spec_of(x: jax.Array) -> jax.ShapeDtypeStruct:
    sharding = x.sharding if isinstance(getattr(x, "sharding", None), NamedSharding) else None
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def _pin_cache(step: Callable, shardings: ModelCache) -> Callable:
    """The step with its output pools constrained to the input pools' shardings (donation reuses them)."""

    def pinned(params: nnx.State, cache: ModelCache, inputs: StepInputs) -> tuple[ModelCache, jax.Array]:
        cache, out = step(params, cache, inputs)
        return jax.lax.with_sharding_constraint(cache, shardings), out

    return pinned


class CompiledStep:
    """Compiled executables per variant, built with the kernel backend ``kernels``.

    ``shared`` (optional): a store of executables that several steps over one model fill and read
    (``LoadedModel.compiled_variants``). A variant's executable is taken from it when another step
    compiled the same program: same variant, output length, page-table width, penalty window,
    kernel backend (and ``ops.trace_flags``: Pallas interpret mode, native kernels, target platform), and the same
    parameter and pool shapes, dtypes and shardings, which are all the program depends on. Taking one is not a compile
    (``num_compiles`` stays), so a second engine on one model neither traces nor compiles again;
    it is still primed once."""

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        params: nnx.State,
        cache: ModelCache,
        shapes: ShapeConfig,
        kernels: str,
        penalty_window: int = 0,
        shared: dict[tuple, Callable] | None = None,
        mask_words: int = 0,
    ):
        self.graphdef = graphdef
        self.penalty_window = penalty_window
        self.mask_words = mask_words
        self.shapes = shapes
        self.kernels = kernels
        # shardings of params and pools are part of the compiled signature (tensor parallelism:
        # models/sharding.py); the pools keep their sharding across rounds
        self._params_spec = jax.tree.map(_spec_of, params)
        self._cache_spec = jax.tree.map(_spec_of, cache)
        sharded = any(isinstance(x.sharding, NamedSharding) for x in jax.tree.leaves(cache))
        self._cache_shardings = jax.tree.map(lambda x: x.sharding, cache) if sharded else None
        self.single_device = not sharded  # inputs may be kept on the (one) device between rounds
        self._compiled: OrderedDict[Variant, Callable] = OrderedDict()  # least recently run first
        self._keys: dict[Variant, tuple] = {}  # each compiled variant's key in ``shared``
        self._shared = shared
        self.budget = MapBudget()  # vm.max_map_count against the compiled variants (runner/mapbudget.py)
        self.evicted = 0  # executables dropped to stay under it
        self._signature = (
            out_rows(shapes),
            shapes.mtp,
            shapes.max_pages_per_row,
            penalty_window,
            kernels,
            mask_words,
            jax.tree.structure(self._params_spec),
            tuple(jax.tree.leaves(self._params_spec)),
            jax.tree.structure(self._cache_spec),
            tuple(jax.tree.leaves(self._cache_spec)),
        )
        self.num_compiles = 0
        self.compile_seconds = 0.0
        self.last_compile_s = 0.0  # compile time spent inside the latest call (lazy warm-up)
        self.strict = False

    def _compile(self, variant: Variant) -> Callable:
        if self.strict:
            raise CompileAfterWarmupError(f"step variant {variant} was not compiled at warm-up")
        start = time.perf_counter()
        if variant.num_rows > out_rows(self.shapes):
            raise ValueError(f"variant {variant} has more rows than the sampled output holds ({out_rows(self.shapes)})")
        key = (variant, *self._signature, ops.trace_flags())
        self._keys[variant] = key
        if self._shared is not None and key in self._shared:
            self._compiled[variant] = self._shared[key]
            return self._shared[key]
        self._make_room(variant)
        self.budget.compiling()
        step = make_step(self.graphdef, variant.num_decode, out_rows(self.shapes), mtp=self.shapes.mtp)
        if self._cache_shardings is not None:
            step = _pin_cache(step, self._cache_shardings)
        fn = jax.jit(step, donate_argnums=(1,))
        with ops.use_backend(self.kernels), _per_shard(self._cache_shardings):
            specs = input_specs(
                variant, self.shapes.max_pages_per_row, self.penalty_window, out_rows(self.shapes), self.mask_words
            )
            lowered = fn.lower(self._params_spec, self._cache_spec, specs)
        compiled = lowered.compile()
        self.budget.compiled()
        self.num_compiles += 1
        self.compile_seconds += time.perf_counter() - start
        self._compiled[variant] = compiled
        if self._shared is not None:
            self._shared[key] = compiled
        return compiled

    def _make_room(self, variant: Variant) -> None:
        """Drops the least recently run executables (never ``variant``'s) while another compile
        would pass ``vm.max_map_count`` (``runner/mapbudget.py``: past it LLVM aborts the process);
        a dropped variant compiles again on its next use (from the persistent compilation cache
        where one is set). Raises :class:`MapBudgetError` when nothing is left to drop, or when a
        drop gave no mapping back (another step still holds the executable: dropping more would
        only empty this step)."""
        while not self.budget.room():
            victim = next((v for v in self._compiled if v != variant), None)
            before = self.budget.count()
            if victim is not None:
                fn = self._compiled.pop(victim)
                key = self._keys.pop(victim, None)
                if self._shared is not None and key is not None and self._shared.get(key) is fn:
                    del self._shared[key]
                del fn
                gc.collect()  # the executable's mappings go with its last reference
                self.evicted += 1
            after = self.budget.count()
            if victim is None or (before is not None and after is not None and after >= before):
                raise MapBudgetError(
                    f"compiling step variant {variant} would pass vm.max_map_count ({self.budget.describe()}): raise "
                    "it (sysctl -w vm.max_map_count=262144) or serve fewer variants (a smaller --max-num-seqs, no "
                    "--speculative)"
                )

    def is_compiled(self, variant: Variant) -> bool:
        return variant in self._compiled

    def prime(self, variant: Variant, params: nnx.State, cache: ModelCache) -> ModelCache:
        """Compiles ``variant`` if needed and executes it once on an all-padding batch (writes only
        the reserved page 0 and state slot 0); returns the pools."""
        fn = self._compiled.get(variant) or self._compile(variant)
        inputs = padding_inputs(
            variant, self.shapes.max_pages_per_row, penalty_window=self.penalty_window, num_out=out_rows(self.shapes),
            mask_words=self.mask_words,
        )
        cache, tokens = fn(params, cache, inputs)
        jax.block_until_ready(tokens)
        return cache

    def __call__(
        self, variant: Variant, params: nnx.State, cache: ModelCache, inputs: StepInputs
    ) -> tuple[ModelCache, jax.Array]:
        """Runs one round. A variant not compiled yet is compiled and primed first; that time is
        ``last_compile_s`` (not serving time)."""
        self.last_compile_s = 0.0
        if variant not in self._compiled:
            start = time.perf_counter()
            cache = self.prime(variant, params, cache)
            self.last_compile_s = time.perf_counter() - start
        self._compiled.move_to_end(variant)
        return self._compiled[variant](params, cache, inputs)


def _per_shard(shardings: Any) -> Any:
    """Pallas kernels per shard of a tensor-parallel step's ``tensor`` mesh axis (kernels/ops.per_shard)."""
    meshes = [s.mesh for s in jax.tree.leaves(shardings) if isinstance(s, NamedSharding) and "tensor" in s.mesh.shape]
    return ops.per_shard(meshes[0], "tensor") if meshes else contextlib.nullcontext()
