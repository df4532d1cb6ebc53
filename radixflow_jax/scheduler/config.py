"""The scheduler's settings: budgets, policy, queue order and checkpoint placement. Plain Python."""

from __future__ import annotations

import dataclasses

from radixflow_jax.cache import placement
from radixflow_jax.scheduler.admission import QUEUE_ORDERS, get_policy

MODEL_DERIVED = ("grid", "hybrid")  # fields the engine builder fills in from the model, never a user option


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """The one home of the scheduling options; an engine's config holds one
    (``EngineConfig.scheduler``), whose fields users set by name (``policy``, ``max_num_seqs``, ...).

    ``grid`` and ``hybrid`` (:data:`MODEL_DERIVED`) describe the model, not a choice: the checkpoint
    grid ``lcm(page_size, recurrent kernel chunks)`` and whether the model has recurrent layers.
    ``engine/build.py`` fills them in with :meth:`for_model`; until then ``grid`` is 0 (no model yet),
    the checks that need the grid wait for it, and a ``Scheduler`` refuses the config (its cache
    config needs a positive grid). Direct scheduler users give both."""

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    page_size: int = 16
    grid: int = 0  # 0: not derived from a model yet
    hybrid: bool = False
    policy: str = "radixflow"
    queue_order: str = "fcfs"
    enable_prefix_cache: bool = True
    max_consumer_wait: int = 16
    checkpoint_interval: int = 0  # 0: adaptive, see max_checkpoints
    max_checkpoints: int = 8  # adaptive spacing: about this many grid checkpoints over a prompt
    branch_checkpoints: bool = True  # branch points (existing paths and waiting siblings), final tokens
    riders: bool = True  # identical prompts ride the round that completes the first (scheduler/riders.py)

    def __post_init__(self) -> None:
        get_policy(self.policy)
        if self.queue_order not in QUEUE_ORDERS:
            raise ValueError(f"queue_order {self.queue_order!r}: expected one of {', '.join(QUEUE_ORDERS)}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if not self.grid:
            return  # the budget and interval checks need the model's grid (for_model runs them)
        if self.max_num_batched_tokens < max(self.grid, self.max_num_seqs):
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= the checkpoint grid {self.grid} "
                f"and >= max_num_seqs={self.max_num_seqs}"
            )
        placement.spacing(self.grid, self.grid, interval=self.checkpoint_interval)  # validates the interval

    def for_model(self, grid: int, hybrid: bool) -> SchedulerConfig:
        """These options for a model with checkpoint grid ``grid`` (recurrent layers: ``hybrid``)."""
        return dataclasses.replace(self, grid=grid, hybrid=hybrid)
