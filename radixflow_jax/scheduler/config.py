"""The scheduler's settings: budgets, policy, queue order and checkpoint placement. Plain Python."""

from __future__ import annotations

import dataclasses

from radixflow_jax.cache import placement
from radixflow_jax.scheduler.admission import QUEUE_ORDERS, get_policy


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    page_size: int
    grid: int
    hybrid: bool
    policy: str = "radixflow"
    queue_order: str = "fcfs"
    enable_prefix_cache: bool = True
    max_consumer_wait: int = 16
    checkpoint_interval: int = 0  # 0: adaptive, see max_checkpoints
    max_checkpoints: int = 8  # adaptive spacing: about this many grid checkpoints over a prompt
    branch_checkpoints: bool = True  # branch points (existing paths and waiting siblings), final tokens

    def __post_init__(self) -> None:
        get_policy(self.policy)
        if self.queue_order not in QUEUE_ORDERS:
            raise ValueError(f"queue_order {self.queue_order!r}: expected one of {', '.join(QUEUE_ORDERS)}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < max(self.grid, self.max_num_seqs):
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= the checkpoint grid {self.grid} "
                f"and >= max_num_seqs={self.max_num_seqs}"
            )
        placement.spacing(self.grid, self.grid, interval=self.checkpoint_interval)  # validates the interval
