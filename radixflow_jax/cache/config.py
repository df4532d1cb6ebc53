"""Static configuration of the prefix cache.

Page alignment (the rule every other module of ``cache/`` relies on): the radix tree stores *full
KV pages only*. Every node's token span is a non-empty multiple of ``page_size`` tokens and starts
and ends on a page boundary, so a node's page ``i`` covers exactly the tokens
``[start + i * page_size, start + (i + 1) * page_size)``. A request's trailing partial page is never
inserted, and a checkpoint depth is always a multiple of ``page_size`` (a checkpoint lives at a
node's end depth). Because ``grid`` is a multiple of ``page_size``, grid positions and branch points
are page-aligned; a request-end checkpoint is placed at its length rounded down to a page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

__all__ = ["PAGE_SIZE", "CacheConfig"]

PAGE_SIZE = 16  # tokens per KV page unless a config says otherwise (the one default, SchedulerConfig's too)


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    """The cache's geometry: the one home of page size, grid and hybridness once a model is known.
    ``page_size``: tokens per KV page. ``grid``: the checkpoint grid ``G`` (a multiple of
    ``page_size``, ``lcm(page_size, kernel chunks)``: :meth:`for_model` derives it). ``hybrid``: the
    model has recurrent layers, so a usable hit is cut back to the deepest committed checkpoint;
    with ``hybrid=False`` (attention-only) the usable hit is the committed KV hit. ``grid`` and
    ``hybrid`` describe the model, so they have no default."""

    page_size: int = PAGE_SIZE
    grid: int
    hybrid: bool

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.grid < 1 or self.grid % self.page_size:
            raise ValueError(f"grid {self.grid} must be a positive multiple of page_size {self.page_size}")

    @classmethod
    def for_model(cls, page_size: int, chunk_sizes: Sequence[int], *, hybrid: bool) -> CacheConfig:
        """The geometry of a model whose recurrent kernels run in ``chunk_sizes`` (empty for an
        attention-only model): ``G = lcm(page_size, every chunk)`` (the grid of docs/design.md)."""
        grid = math.lcm(page_size, *chunk_sizes) if chunk_sizes else page_size
        return cls(page_size=page_size, grid=grid, hybrid=hybrid)

    def align_down(self, num_tokens: int) -> int:
        """``num_tokens`` rounded down to a whole number of pages."""
        return (num_tokens // self.page_size) * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold ``num_tokens`` tokens (the last one may be partial)."""
        return -(-num_tokens // self.page_size)
