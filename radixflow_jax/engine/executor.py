"""Executors run a planned round. The model executor runs the real jitted step; the simulated
executor (``engine/sim``) replaces it with a cost model. The engine loop and scheduler are the same
code for both.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Mapping, Sequence

import jax
import numpy as np

from radixflow_jax.models.api import LoadedModel
from radixflow_jax.models.batch import init_cache
from radixflow_jax.runner.inputs import SamplingRow, build_arrays
from radixflow_jax.runner.shapes import ShapeConfig, Variant
from radixflow_jax.runner.step import CompiledStep
from radixflow_jax.engine.protocol import StepResult
from radixflow_jax.scheduler.plan import RoundPlan


class ModelExecutor:
    """Owns the device pools and the compiled step variants of one model. ``penalty_window``: the
    longest context (prompt + output) a penalised request may have (the width of its arrays)."""

    supports_logprobs = True

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
    ):
        self.model = model
        self.shapes = shapes
        self.page_size = page_size
        self.pool_sizes = (num_pages, num_slots)
        self.cache = model.place_cache(init_cache(
            model.config, num_pages=num_pages, page_size=page_size, num_slots=num_slots, dtype=model.dtype
        ))  # fmt: skip
        self.penalty_window = penalty_window
        self._neutral_ctx: dict[object, tuple[jax.Array, jax.Array]] = {}  # per variant: unpenalised context arrays
        self.step = CompiledStep(model.graphdef, model.params, self.cache, shapes, kernels, penalty_window)
        self.progress = progress
        self.warmup_s = 0.0
        if warmup:
            self.warmup()

    def warmup(self, variants: Sequence[Variant] | None = None) -> None:
        """Compiles and executes once every variant (or the given ones) that has not run yet,
        reporting progress; afterwards the compile guard may be turned on."""
        todo = [v for v in (self.shapes.variants() if variants is None else variants) if not self.step.is_compiled(v)]
        start = time.perf_counter()
        for i, v in enumerate(todo, 1):
            t = time.perf_counter()
            self.cache = self.step.prime(v, self.model.params, self.cache)
            if self.progress is not None:
                self.progress(
                    f"warm-up {i}/{len(todo)}: {v.kind} T={v.num_tokens} R={v.num_rows} D={v.num_decode} "
                    f"in {time.perf_counter() - t:.1f}s"
                )
        self.warmup_s += time.perf_counter() - start

    def execute(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow]) -> StepResult:
        t0 = time.perf_counter()
        variant = self.shapes.select(plan.num_tokens, len(plan.rows), num_decode=plan.num_decode)
        arrays = build_arrays(
            plan, variant, page_size=self.page_size, max_pages=self.shapes.max_pages_per_row, sampling=sampling,
            penalty_window=self.penalty_window,
        )  # fmt: skip
        inputs = arrays.as_dict()
        if self.penalty_window and self.step.single_device and not arrays.presence.any() and not arrays.frequency.any() and (arrays.repetition == 1).all():
            # no row is penalised: the [R, W] context arrays are the same every round; keep them on the device
            if variant not in self._neutral_ctx:
                self._neutral_ctx[variant] = (jax.device_put(arrays.ctx_ids), jax.device_put(arrays.ctx_out))
            inputs["ctx_ids"], inputs["ctx_out"] = self._neutral_ctx[variant]
        t1 = time.perf_counter()
        self.cache, (tokens, *lp) = self.step(variant, self.model.params, self.cache, inputs)
        tokens = np.asarray(jax.device_get(tokens))
        want = [(i, row.request_id, sampling[row.request_id].logprobs) for i, row in zip(arrays.plan_rows, plan.rows)
                if row.sample and row.request_id in sampling and sampling[row.request_id].logprobs >= 0]  # fmt: skip
        logprobs = {}
        if want:  # fetched only when a row asked for them
            chosen, top_ids, top_lp = (np.asarray(x) for x in jax.device_get(lp))
            logprobs = {rid: (float(chosen[i]), top_ids[i, :k].tolist(), top_lp[i, :k].tolist()) for i, rid, k in want}
        compile_s = self.step.last_compile_s
        t2 = time.perf_counter() - compile_s  # compiling is not serving time
        if compile_s and self.progress is not None:
            self.progress(f"compiled {variant.kind} T={variant.num_tokens} R={variant.num_rows} "
                          f"D={variant.num_decode} on first use in {compile_s:.1f}s")  # fmt: skip
        sampled = {row.request_id: int(tokens[i]) for i, row in zip(arrays.plan_rows, plan.rows) if row.sample}
        return StepResult(
            sampled, variant.num_tokens, variant.num_rows, t1 - t0, t2 - t1, logprobs, variant.num_decode, compile_s
        )

    def reset(self) -> None:
        """Rebuilds the pools (zeros) after a failed step, which may have consumed the donated ones;
        the compiled variants stay valid (same shapes and dtypes). The old buffers are freed first."""
        for leaf in jax.tree_util.tree_leaves(self.cache):
            if not leaf.is_deleted():
                leaf.delete()
        num_pages, num_slots = self.pool_sizes
        cfg, dtype = self.model.config, self.model.dtype
        self.cache = self.model.place_cache(
            init_cache(cfg, num_pages=num_pages, page_size=self.page_size, num_slots=num_slots, dtype=dtype)
        )


def stderr_progress(message: str) -> None:
    print(f"[radixflow] {message}", file=sys.stderr, flush=True)
