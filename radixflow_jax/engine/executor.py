"""Executors run a planned round. The model executor runs the real jitted step; the simulated
executor (``engine/sim``) replaces it with a cost model. The engine loop and scheduler are the same
code for both.

Overlap: :meth:`ModelExecutor.launch` builds the arrays and dispatches the step without waiting for
it (JAX dispatch is asynchronous) and returns an :class:`LaunchedStep`; :meth:`ModelExecutor.collect`
fetches its result. A row whose input is ``UNKNOWN_TOKEN`` takes it from the sampled array of the
round launched just before (``prev``) on the device, so round r+1 is launched before round r is
collected. ``execute`` is launch + collect.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Callable, Mapping, Sequence

import jax
import numpy as np

from radixflow_jax.models.api import LoadedModel
from radixflow_jax.models.batch import init_cache, pool_config
from radixflow_jax.runner.inputs import BIAS_WIDTH, SamplingRow, StepArrays, StepInputs, build_arrays
from radixflow_jax.runner.hoststates import HostStates
from radixflow_jax.runner.pagecopy import PageCopier, StateCopier
from radixflow_jax.runner.scoring import PromptScorer
from radixflow_jax.runner.shapes import ShapeConfig, Variant
from radixflow_jax.runner.step import CompiledStep, out_rows
from radixflow_jax.runner.window import select_round
from radixflow_jax.engine.intake import MAX_SCORED_PROMPT
from radixflow_jax.engine.protocol import ExecutorCapabilities, PromptLogprob, StepResult
from radixflow_jax.scheduler.plan import UNKNOWN_TOKEN, RoundPlan


@dataclasses.dataclass
class LaunchedStep:
    """The handle of a dispatched step (what ``launch`` returns, ``collect`` reads): its plan, the
    variant, where each plan row sits in the arrays, the device outputs (sampled tokens padded to
    ``out_rows``, logprob arrays, not fetched yet), and host timings."""

    plan: RoundPlan
    variant: Variant | None  # None: a plan of state moves only (no step)
    plan_rows: np.ndarray
    tokens: jax.Array
    logprobs: tuple[jax.Array, ...]
    want: list[tuple[int, int, int]]  # (array row, request id, top-k) of rows that asked for logprobs
    verified: jax.Array  # the token sampled after each verify point (speculative decoding; empty: none)
    verify_points: tuple[tuple[int, int, int], ...]  # (request id, first point, drafted tokens) per verify row
    build_s: float
    start: float  # perf_counter when the step was dispatched
    compile_s: float  # first-use compiling inside launch (the engine takes it off its clock at once)
    ready: float | None = None  # perf_counter its result was seen ready, when a later launch waited for it
    drafts: jax.Array | None = None  # each row's MTP draft, padded as ``tokens`` (empty: no MTP layers)


def splice_sources(
    plan: RoundPlan, plan_rows: np.ndarray, cu_seqlens: np.ndarray, num_tokens: int, prev: LaunchedStep | None
) -> np.ndarray | None:
    """``splice_src`` of a round (see ``runner/step.py``): for each row whose last input token is
    ``UNKNOWN_TOKEN``, the index of that token in ``prev``'s sampled array. ``None`` when no row has
    one. ``ValueError`` when ``prev`` did not sample it (the plan needs a round that is not the last
    launched one) or a token other than a row's last is unknown."""
    unknown = [i for i, row in enumerate(plan.rows) if row.tokens and row.tokens[-1] == UNKNOWN_TOKEN]
    if not unknown:
        return None
    sampled_at: dict[int, int] = {}
    if prev is not None:
        sampled_at = {row.request_id: int(prev.plan_rows[i]) for i, row in enumerate(prev.plan.rows) if row.sample}
    src = np.full(num_tokens, -1, np.int32)
    for i in unknown:
        row = plan.rows[i]
        if UNKNOWN_TOKEN in row.tokens[:-1] or row.request_id not in sampled_at:
            raise ValueError(f"request {row.request_id}: its input token is not sampled by the round launched last")
        src[int(cu_seqlens[plan_rows[i]]) + len(row.tokens) - 1] = sampled_at[row.request_id]
    return src


class ModelExecutor:
    """Owns the device pools and the compiled step variants of one model. ``penalty_window``: the
    longest context (prompt + output) a penalised request may have (the width of its arrays).
    Capabilities: logprobs, penalties within ``penalty_window``, and overlap on one device (the
    sampled array feeds the next step as it is; sharded pools keep the synchronous path)."""

    def __init__(
        self,
        model: LoadedModel,
        shapes: ShapeConfig,
        *,
        page_size: int,
        num_pages: int,
        num_slots: int,
        kernels: str = "auto",
        warmup: bool = True,
        penalty_window: int = 0,
        progress: Callable[[str], None] | None = None,
        num_host_slots: int = 0,
        num_host_pages: int = 0,
    ):
        self.model = model
        self.shapes = shapes
        self.page_size = page_size
        # the device state pools hold at least one decode window of max_num_seqs slots past slot 0 (the
        # host pool may be smaller: window positions past its ids are padding, runner/window.py)
        self.num_slots = max(num_slots, shapes.max_num_seqs + 1)
        self.pool_sizes = (num_pages, self.num_slots)
        # the MTP layers' KV only where the engine drafts with them (ShapeConfig.mtp)
        self.pool_config = pool_config(model.config, mtp=shapes.mtp)
        pools = init_cache(
            self.pool_config, num_pages=num_pages, page_size=page_size, num_slots=self.num_slots, dtype=model.dtype
        )
        self.cache = model.place_cache(pools)
        self.penalty_window = penalty_window
        self._neutral_ctx: dict[object, tuple[jax.Array, jax.Array]] = {}  # per variant: unpenalised context arrays
        self._neutral_bias: dict[object, tuple[jax.Array, ...]] = {}  # per variant: bias arrays of no entry
        self._neutral_mask: dict[object, tuple[jax.Array, jax.Array]] = {}  # per variant: the masks of no constrained row
        self.mask_words = (model.config.vocab_size + 31) // 32  # grammar mask width (structured outputs)
        self.step = CompiledStep(
            graphdef=model.graphdef,
            params=model.params,
            cache=self.cache,
            shapes=shapes,
            kernels=kernels,
            penalty_window=penalty_window,
            shared=model.compiled_variants,
            mask_words=self.mask_words,
        )
        # prompt scoring: one fixed-shape program, warmed with the variants (runner/scoring.py)
        self.scorer = PromptScorer(model, capacity=MAX_SCORED_PROMPT, kernels=kernels)
        self.capabilities = ExecutorCapabilities(
            overlap=self.step.single_device,
            logprobs=True,
            penalty_window=penalty_window,
            logit_bias=BIAS_WIDTH,
            prompt_logprobs=self.prompt_logprobs,
            grammar_mask=True,
            verify=shapes.max_draft > 0,
        )
        self.progress = progress
        self.page_copier = PageCopier(shapes.max_num_seqs)  # partial pages: riders' and tails' (RoundPlan)
        self.state_copier = StateCopier(shapes.max_num_seqs)  # kept ends leaving the request band (RoundPlan)
        # the host tier's rows (runner/hoststates.py): spills and restores of RoundPlan.state_moves,
        # of checkpoints (num_host_slots) and of KV pages (num_host_pages)
        self.host = (
            HostStates(self.cache, num_host_slots, width=shapes.max_num_seqs, num_host_pages=num_host_pages)
            if num_host_slots or num_host_pages
            else None
        )
        self._copier_ready = False
        self.warmup_s = 0.0
        self._no_prev = jax.device_put(np.zeros(out_rows(shapes), np.int32))  # prev_tokens of a round that splices nothing
        self._last_done = 0.0  # perf_counter when the latest collected round's result was fetched
        if warmup:
            self.warmup()

    def warmup(
        self, variants: Sequence[Variant] | None = None, *, first: int = 1, total: int | None = None,
        scorer: bool = True,
    ) -> None:
        """Compiles and executes once every variant (or the given ones) that has not run yet,
        reporting progress (numbered from ``first`` of ``total``: a background warm-up passes one
        variant at a time); the first call also compiles the page and state copies and, unless
        ``scorer=False`` (a caller that never scores prompts: ``radixflow bench``), the prompt
        scoring program. Afterwards the compile guard may be turned on."""
        todo = [v for v in (self.shapes.variants() if variants is None else variants) if not self.step.is_compiled(v)]
        start = time.perf_counter()
        if not self._copier_ready:  # the page and state copies, compiled with the first warm-up call
            self.cache = self.page_copier(self.cache, [])
            self.cache = self.state_copier(self.cache, [])
            if self.host is not None:
                self.cache = self.host.prime(self.cache)
            self._copier_ready = True
        if scorer and not self.scorer.is_compiled:
            t = time.perf_counter()
            self.scorer.prime()
            if self.progress is not None:
                self.progress(f"warm-up: prompt scoring program in {time.perf_counter() - t:.1f}s")
        for i, v in enumerate(todo, first):
            if not self.step.budget.room():  # another compile would pass vm.max_map_count (runner/mapbudget.py)
                if self.progress is not None:
                    self.progress(
                        f"warm-up stopped at {i}/{total or len(todo)}: {self.step.budget.describe()}; the rest "
                        "compile on first use, dropping the least recently run (raise vm.max_map_count to keep all)"
                    )
                break
            t = time.perf_counter()
            self.cache = self.step.prime(v, self.model.params, self.cache)
            if self.progress is not None:
                self.progress(
                    f"warm-up {i}/{total or len(todo)}: {v.kind} T={v.num_tokens} R={v.num_rows} D={v.num_decode} "
                    f"in {time.perf_counter() - t:.1f}s"
                )
        self.warmup_s += time.perf_counter() - start

    def execute(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow]) -> StepResult:
        return self.collect(self.launch(plan, sampling))

    def launch(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow], prev: LaunchedStep | None = None) -> LaunchedStep:
        """Builds the round's arrays and dispatches the step; does not wait for the device."""
        t0 = time.perf_counter()
        if not plan.rows:  # restores only (RoundPlan.is_empty): the moves, no step
            self._move_states(plan)
            return self._moves_only(plan, time.perf_counter() - t0)
        variant, decode = select_round(plan, self.shapes, self.num_slots)
        arrays = build_arrays(
            plan, variant, page_size=self.page_size, max_pages=self.shapes.max_pages_per_row, sampling=sampling,
            penalty_window=self.penalty_window, decode=decode, mask_words=self.mask_words,
            num_out=out_rows(self.shapes), mtp=self.shapes.mtp,
        )
        inputs = self._keep_neutral(variant, arrays)
        src = splice_sources(plan, arrays.plan_rows, inputs.cu_seqlens, variant.num_tokens, prev)
        if src is None:
            inputs = inputs._replace(prev_tokens=self._no_prev)
        else:
            tokens = np.where(src >= 0, 0, inputs.tokens).astype(np.int32)  # UNKNOWN_TOKEN is no id
            inputs = inputs._replace(tokens=tokens, splice_src=src, prev_tokens=prev.tokens)
        want = [
            (int(i), row.request_id, sampling[row.request_id].logprobs)
            for i, row in zip(arrays.plan_rows, plan.rows)
            if row.sample and row.request_id in sampling and sampling[row.request_id].logprobs >= 0
        ]
        if prev is not None and not self.step.is_compiled(variant):
            # compiling takes the host for seconds: note when the round in flight finished first, so
            # its step time does not absorb the compile (it would otherwise end at its collect)
            jax.block_until_ready(prev.tokens)
            prev.ready = time.perf_counter()
        t1, compiles = time.perf_counter(), self.step.num_compiles
        self._move_states(plan)
        before = plan.copies_before(self.page_size)
        if before:  # rows starting at a tail: their own copy of its partial page, before they read it
            self.cache = self.page_copier(self.cache, before)
        self.cache, (tokens, verified, drafts, *lp) = self.step(variant, self.model.params, self.cache, inputs)
        if plan.page_copies:  # after the step wrote the producers' pages, before any later round
            self.cache = self.page_copier(self.cache, plan.page_copies)
            self._copier_ready = True
        compile_s = self.step.last_compile_s
        if compile_s and self.progress is not None:
            how = "compiled" if self.step.num_compiles > compiles else "took the model's compiled"
            shape = f"{variant.kind} T={variant.num_tokens} R={variant.num_rows} D={variant.num_decode}"
            self.progress(f"{how} {shape} on first use in {compile_s:.1f}s")
        return LaunchedStep(
            plan=plan,
            variant=variant,
            plan_rows=arrays.plan_rows,
            tokens=tokens,
            logprobs=tuple(lp),
            want=want,
            verified=verified,
            verify_points=arrays.verify_points,
            drafts=drafts,
            build_s=t1 - t0,
            start=t1 + compile_s,
            compile_s=compile_s,
        )

    def _move_states(self, plan: RoundPlan) -> None:
        """The plan's state moves, before its step (kept ends leaving the request band, spills to
        and restores from the host tier of checkpoints and of KV pages, in the cache's order;
        ``RoundPlan.state_moves``). ``ValueError`` for a host move this executor has no rows for."""
        if not plan.state_moves:
            return
        if self.host is not None:
            self.cache = self.host.apply_moves(self.cache, plan.state_moves, self.state_copier)
            return
        kinds = sorted({m.kind for m in plan.state_moves} - {"copy"})
        if kinds:
            raise ValueError(
                f"a plan moves {'KV pages' if any(k.startswith('kv_') for k in kinds) else 'states'} to or from "
                f"the host tier ({', '.join(kinds)}), but this executor has no host tier "
                "(num_host_slots = num_host_pages = 0)"
            )
        self.cache = self.state_copier(self.cache, [(m.src, m.dst) for m in plan.state_moves])

    def _moves_only(self, plan: RoundPlan, build_s: float) -> LaunchedStep:
        """The handle of a plan with no rows (its moves were dispatched; nothing to sample)."""
        now = time.perf_counter()
        empty = np.zeros(0, np.int32)
        return LaunchedStep(
            plan=plan, variant=None, plan_rows=empty, tokens=self._no_prev, logprobs=(), want=[], verified=self._no_prev,
            verify_points=(), build_s=build_s, start=now, compile_s=0.0,
        )

    def _keep_neutral(self, variant: Variant, arrays: StepArrays) -> StepInputs:
        """The round's inputs, where those that are the same every round while no row uses them
        (penalty context, bias entries, grammar masks) are the copies kept on the device instead of
        copied each round (one device)."""
        inputs = arrays.inputs
        if not self.step.single_device:
            return inputs
        kept: dict[str, jax.Array] = {}
        penalised = inputs.presence.any() or inputs.frequency.any() or (inputs.repetition != 1).any()
        if self.penalty_window and not penalised:
            if variant not in self._neutral_ctx:
                self._neutral_ctx[variant] = (jax.device_put(inputs.ctx_ids), jax.device_put(inputs.ctx_out))
            kept["ctx_ids"], kept["ctx_out"] = self._neutral_ctx[variant]
        if not (inputs.bias_ids >= 0).any():
            if variant not in self._neutral_bias:
                bias = (inputs.bias_ids, inputs.bias_vals, inputs.bias_until)
                self._neutral_bias[variant] = tuple(jax.device_put(x) for x in bias)
            kept["bias_ids"], kept["bias_vals"], kept["bias_until"] = self._neutral_bias[variant]
        if not arrays.masked_rows:  # nor a verify point's (a constrained verify row is a masked row)
            if variant not in self._neutral_mask:
                self._neutral_mask[variant] = (jax.device_put(inputs.token_mask), jax.device_put(inputs.verify_mask))
            kept["token_mask"], kept["verify_mask"] = self._neutral_mask[variant]
        return inputs._replace(**kept)

    def collect(self, handle: LaunchedStep) -> StepResult:
        """Waits for a launched round and returns its result. ``step_s``: from when the device could
        start it (its dispatch, or the previous round's result, whichever is later) to its result."""
        if handle.variant is None:  # state moves only: nothing sampled, no step time
            return StepResult(sampled={}, token_slots=0, row_slots=0, build_s=handle.build_s, step_s=0.0)
        tokens = np.asarray(jax.device_get(handle.tokens))
        logprobs, point_logprobs = {}, {}
        if handle.want:  # fetched only when a row asked for them
            arrays = [np.asarray(x) for x in jax.device_get(handle.logprobs)]
            logprobs = {rid: _logprob(arrays[:3], i, k) for i, rid, k in handle.want}
            wanted = {rid: k for _, rid, k in handle.want}
            point_logprobs = {  # verify rows: the token after each verify point (speculative decoding)
                rid: [_logprob(arrays[3:], j, wanted[rid]) for j in range(first, first + n)]
                for rid, first, n in handle.verify_points if rid in wanted
            }
        done = time.perf_counter() if handle.ready is None else handle.ready
        step_s = done - max(handle.start, self._last_done)
        self._last_done = done
        plan, variant = handle.plan, handle.variant
        sampled = {row.request_id: int(tokens[i]) for i, row in zip(handle.plan_rows, plan.rows) if row.sample}
        drafts = {}
        if handle.drafts is not None and handle.drafts.shape[0]:  # MTP: the token after each sampled one
            guesses = np.asarray(jax.device_get(handle.drafts))
            drafts = {row.request_id: int(guesses[i]) for i, row in zip(handle.plan_rows, plan.rows) if row.sample}
        verified = {}
        if handle.verify_points:
            greedy = np.asarray(jax.device_get(handle.verified))
            verified = {rid: tuple(int(t) for t in greedy[first : first + k]) for rid, first, k in handle.verify_points}
        return StepResult(
            sampled=sampled,
            verified=verified,
            drafts=drafts,
            token_slots=variant.num_tokens,
            row_slots=variant.num_rows,
            build_s=handle.build_s,
            step_s=step_s,
            logprobs=logprobs,
            verify_logprobs=point_logprobs,
            decode_slots=variant.num_decode,
            compile_s=handle.compile_s,
        )

    def prompt_logprobs(self, prompt: Sequence[int], k: int) -> list[PromptLogprob | None]:
        """Per prompt token: None for the first, else ``(logprob, top k ids, their logprobs)`` given
        the tokens before it, from the scoring program (``runner/scoring.py``: fixed-size chunks on
        a scratch sequence, top-k on the device; neither the pools nor the prefix cache, whose
        tokens have no logits). Under the compile guard (``step.strict``) it never compiles: a
        scorer not warmed raises ``CompileAfterWarmupError``."""
        return self.scorer.score(prompt, k, strict=self.step.strict)

    def lose_device_state(self) -> None:
        """Deletes the pool buffers, as a failed step that consumed its donated pools leaves them
        (fault injection, ``reliability/faults.py``); :meth:`reset` rebuilds them."""
        for leaf in jax.tree_util.tree_leaves(self.cache):
            if not leaf.is_deleted():
                leaf.delete()

    def reset(self) -> None:
        """Rebuilds the pools (zeros) after a failed step, which may have consumed the donated ones;
        the compiled variants stay valid (same shapes and dtypes). The old buffers are freed first."""
        self.lose_device_state()
        num_pages, num_slots = self.pool_sizes
        cfg, dtype = self.pool_config, self.model.dtype
        self.cache = self.model.place_cache(
            init_cache(cfg, num_pages=num_pages, page_size=self.page_size, num_slots=num_slots, dtype=dtype)
        )


def stderr_progress(message: str) -> None:
    print(f"[radixflow] {message}", file=sys.stderr, flush=True)


def _logprob(arrays: list[np.ndarray], i: int, k: int) -> tuple[float, list[int], list[float]]:
    """Entry ``i`` of the step's ``(chosen logprob, top ids, top logprobs)`` arrays, ``k`` alternatives."""
    chosen, top_ids, top_lp = arrays
    return float(chosen[i]), top_ids[i, :k].tolist(), top_lp[i, :k].tolist()
