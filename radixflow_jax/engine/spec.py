"""What an engine is built from besides its executor: :class:`EngineSpec`.

``engine/build.py`` makes one (``assemble_engine``), ``EngineCore`` reads every setting from it, and
``engine.spec`` keeps it, so a mirror or a second engine over the same executor is one
``dataclasses.replace`` away. The model-derived facts are derived here and nowhere else: the cache
geometry (page size, checkpoint grid, hybridness: :attr:`EngineSpec.cache_config`), the step
shapes (:meth:`EngineSpec.shapes`) and the scheduler config completed with the model
(:meth:`EngineSpec.scheduler`). No JAX here.
"""

from __future__ import annotations

import dataclasses
import math

from radixflow_jax.cache.config import CacheConfig
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.scheduler.config import SchedulerConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """An engine's settings (``config``), its model's facts (``hybrid``: recurrent layers;
    ``chunk_sizes``: the recurrent kernels' chunks, empty for attention-only models; ``eos_token_ids``,
    ``tokenizer``, ``vocab_size``: None when unknown; ``packed_rows_free``: the executor's
    prefill region costs a one-token row one token, as the native CPU kernels do, so
    ``mixed_layout="auto"`` packs) and its pools (``num_pages`` / ``num_slots``
    include the reserved id 0 of each pool; ``num_host_slots``: the host tier's checkpoints,
    ``cache/tiers.py``, 0 for none; ``num_host_pages``: its KV pages, ``cache/hostkv.py``;
    ``state_bytes`` / ``page_bytes``: one checkpoint's / one KV page's bytes, what a spill or a
    restore moves, 0 when unknown; ``max_model_len``: the longest request).

    Invariant: everything below is derived from these fields alone, so two engines of equal specs
    make the same scheduling decisions."""

    config: EngineConfig
    hybrid: bool
    chunk_sizes: tuple[int, ...]
    num_pages: int
    num_slots: int
    max_model_len: int
    num_host_slots: int = 0
    num_host_pages: int = 0
    state_bytes: int = 0
    page_bytes: int = 0
    eos_token_ids: tuple[int, ...] = ()
    tokenizer: object | None = None
    vocab_size: int | None = None
    packed_rows_free: bool = False

    @property
    def cache_config(self) -> CacheConfig:
        """The model's cache geometry: ``grid = lcm(page size, chunks)`` (derived once, here)."""
        return CacheConfig.for_model(self.config.scheduler.page_size, self.chunk_sizes, hybrid=self.hybrid)

    @property
    def grid(self) -> int:
        return self.cache_config.grid

    def shapes(self) -> ShapeConfig:
        """The step shapes: the scheduler's budgets, the page table of ``max_model_len``, the grid."""
        sc, cache = self.config.scheduler, self.cache_config
        return ShapeConfig(
            max_num_batched_tokens=sc.max_num_batched_tokens,
            max_num_seqs=sc.max_num_seqs,
            max_pages_per_row=math.ceil(self.max_model_len / cache.page_size),
            grid=cache.grid,
            mode=self.config.bucket_mode,
            mixed_layout=self.mixed_layout,
            max_draft=sc.speculative.num_draft if sc.speculative is not None else 0,
            mtp=sc.mtp_drafts,
        )

    @property
    def mixed_layout(self) -> str:
        """``config.mixed_layout`` with ``auto`` resolved: ``packed`` where ``packed_rows_free``."""
        if self.config.mixed_layout != "auto":
            return self.config.mixed_layout
        return "packed" if self.packed_rows_free else "window"

    def scheduler(self) -> SchedulerConfig:
        """The engine's scheduling options completed with this model's grid and kind."""
        return self.config.scheduler.for_model(self.cache_config)
