"""The scheduler's settings: budgets, policy, queue order and checkpoint placement. Plain Python."""

from __future__ import annotations

import dataclasses

from radixflow_jax.cache import placement
from radixflow_jax.cache.config import PAGE_SIZE, CacheConfig
from radixflow_jax.scheduler.admission import QUEUE_ORDERS, get_policy
from radixflow_jax.scheduler.drafts import SpeculativeConfig

MODEL_DERIVED = ("grid", "hybrid")  # fields the engine builder fills in from the model, never a user option
DEFAULT_POLICY = "pair"  # the one default policy (docs/design.md, "Scheduling")


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """The one home of the scheduling options; an engine's config holds one
    (``EngineConfig.scheduler``), whose fields users set by name (``policy``, ``max_num_seqs``, ...).

    ``grid`` and ``hybrid`` (:data:`MODEL_DERIVED`) describe the model, not a choice: they are copied
    from the model's :class:`~radixflow_jax.cache.config.CacheConfig` (derived once, by
    ``EngineSpec.cache_config``) by :meth:`for_model`; until then ``grid`` is 0 (no model yet), the checks
    that need the grid wait for it, and a ``Scheduler`` refuses the config (:attr:`cache_config` needs a
    positive grid). Direct scheduler users give both. The prefix cache is off under policy
    ``no-cache`` (the one switch for it)."""

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    page_size: int = PAGE_SIZE
    grid: int = 0  # 0: not derived from a model yet
    hybrid: bool = False
    policy: str = DEFAULT_POLICY
    queue_order: str = "fcfs"
    max_consumer_wait: int = 16
    checkpoint_interval: int = 0  # 0: adaptive, see max_checkpoints
    max_checkpoints: int = 8  # adaptive spacing: about this many grid checkpoints over a prompt
    branch_checkpoints: bool = True  # branch points (existing paths and waiting siblings)
    riders: bool = True  # identical prompts ride the round that completes the first (scheduler/riders.py)
    speculative: SpeculativeConfig | None = None  # drafted decode tokens, verified in one row (scheduler/drafts.py)

    def __post_init__(self) -> None:
        get_policy(self.policy)
        if isinstance(self.speculative, (str, dict)):  # "ngram" or the fields by name, as flat options give it
            given = {"method": self.speculative} if isinstance(self.speculative, str) else self.speculative
            object.__setattr__(self, "speculative", SpeculativeConfig(**given))
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

    @property
    def mtp_drafts(self) -> bool:
        """Drafts come from the model's MTP layers (speculative method ``mtp``): only then does an
        engine run them and keep their KV (``models/batch.pool_config``)."""
        return self.speculative is not None and self.speculative.method == "mtp"

    @property
    def cache_config(self) -> CacheConfig:
        """The cache geometry these options were completed with (``ValueError`` before :meth:`for_model`)."""
        return CacheConfig(page_size=self.page_size, grid=self.grid, hybrid=self.hybrid)

    def for_model(self, cache: CacheConfig) -> SchedulerConfig:
        """These options for a model of geometry ``cache`` (its grid and hybridness; its page size
        is this config's, ``EngineSpec.cache_config`` derives it from ``page_size``)."""
        if cache.page_size != self.page_size:
            raise ValueError(f"cache page_size {cache.page_size} differs from the scheduler's {self.page_size}")
        return dataclasses.replace(self, grid=cache.grid, hybrid=cache.hybrid)
