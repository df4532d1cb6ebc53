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

__all__ = ["CacheConfig"]


@dataclass(frozen=True)
class CacheConfig:
    """``page_size``: tokens per KV page. ``grid``: the checkpoint grid ``G`` (a multiple of
    ``page_size``, normally ``lcm(page_size, kernel chunk)``). ``hybrid``: the model has recurrent
    layers, so a usable hit is cut back to the deepest committed checkpoint; with ``hybrid=False``
    (attention-only control) the usable hit is the committed KV hit."""

    page_size: int = 16
    grid: int = 64
    hybrid: bool = True

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.grid < 1 or self.grid % self.page_size:
            raise ValueError(f"grid {self.grid} must be a positive multiple of page_size {self.page_size}")

    @classmethod
    def from_chunk(cls, page_size: int, chunk: int, *, hybrid: bool = True) -> CacheConfig:
        """The config with ``G = lcm(page_size, chunk)`` (the grid of docs/design.md)."""
        return cls(page_size=page_size, grid=math.lcm(page_size, chunk), hybrid=hybrid)

    def align_down(self, num_tokens: int) -> int:
        """``num_tokens`` rounded down to a whole number of pages."""
        return (num_tokens // self.page_size) * self.page_size

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold ``num_tokens`` tokens (the last one may be partial)."""
        return -(-num_tokens // self.page_size)
