"""The one place an engine is wired: engine config -> checkpoint grid, step shapes, scheduler config
and pools -> :class:`EngineCore` around an executor. The model engine (``engine/llm.py``), the
simulated engine and the simulated mirror of a model engine (``bench/run.py``) all go through
:func:`wire_engine`, so they make the same scheduling decisions from the same configuration.

No JAX here: the executor is built by the caller's factory from the step shapes.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Sequence

from radixflow_jax.engine.core import EngineConfig, EngineCore, model_grid
from radixflow_jax.engine.protocol import Executor
from radixflow_jax.engine.roundcost import MeasuredRoundCost
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.scheduler.scheduler import SchedulerConfig

@dataclasses.dataclass(frozen=True)
class Wiring:
    """Everything an engine is built from besides its executor. ``chunk_sizes``: the recurrent
    kernels' chunks (the grid is ``lcm(page size, chunks)``; empty for attention-only models);
    ``num_pages`` / ``num_slots`` include the reserved id 0 of each pool."""

    config: EngineConfig
    hybrid: bool
    chunk_sizes: tuple[int, ...]
    num_pages: int
    num_slots: int
    max_model_len: int

    @property
    def grid(self) -> int:
        return model_grid(self.chunk_sizes, self.config.page_size)

    def shapes(self) -> ShapeConfig:
        ec = self.config
        return ShapeConfig(
            max_tokens=ec.max_num_batched_tokens, max_rows=ec.max_num_seqs,
            max_pages_per_row=math.ceil(self.max_model_len / ec.page_size), grid=self.grid, mode=ec.bucket_mode,
        )  # fmt: skip

    def scheduler(self) -> SchedulerConfig:
        ec = self.config
        return SchedulerConfig(
            max_num_seqs=ec.max_num_seqs, max_num_batched_tokens=ec.max_num_batched_tokens,
            page_size=ec.page_size, grid=self.grid, hybrid=self.hybrid, policy=ec.policy,
            queue_order=ec.queue_order, enable_prefix_cache=ec.enable_prefix_cache,
            max_consumer_wait=ec.max_consumer_wait, checkpoint_interval=ec.checkpoint_interval,
            max_checkpoints=ec.max_checkpoints, branch_checkpoints=ec.branch_checkpoints,
        )  # fmt: skip


def wire_engine(
    wiring: Wiring,
    make_executor: Callable[[ShapeConfig], Executor],
    *,
    clock: Callable[[], float] = time.perf_counter,
    eos_token_ids: Sequence[int] = (),
    tokenizer: object | None = None,
    vocab_size: int | None = None,
) -> EngineCore:
    """An engine over ``make_executor(wiring.shapes())``; ``engine.wiring`` keeps ``wiring``."""
    executor = make_executor(wiring.shapes())
    engine = EngineCore(
        executor, wiring.scheduler(), num_pages=wiring.num_pages, num_slots=wiring.num_slots,
        max_model_len=wiring.max_model_len, eos_token_ids=eos_token_ids, tokenizer=tokenizer,
        seed=wiring.config.seed, clock=clock, vocab_size=vocab_size, wiring=wiring,
        step_retries=wiring.config.step_retries, max_failed_rounds=wiring.config.max_failed_rounds,
        overlap=wiring.config.overlap,
    )  # fmt: skip
    # policy `pair` admits fill work by the executor's round cost: the simulator's model
    # (`plan_cost`), else the running medians of the rounds this engine measures
    plan_cost = getattr(executor, "plan_cost", None)
    if plan_cost is not None:
        engine.scheduler.round_cost = plan_cost
    elif wiring.config.policy == "pair":
        engine.scheduler.round_cost = MeasuredRoundCost(wiring.shapes(), engine.records)
    return engine
