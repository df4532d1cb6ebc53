"""Copying KV pages between rounds: a rider's own copy of its producer's partial last page
(``scheduler/riders.py``, ``RoundPlan.page_copies``).

:class:`PageCopier` runs one jitted program of a fixed width ``width`` (pairs padded with ``(0, 0)``,
the padding sink copied onto itself), so every round with copies reuses one compiled program. It is
dispatched right after the round's step and takes that step's pools (donated), so on the device it
runs after the step wrote the source page and before any later round reads the destination.

Invariant: after a copy, destination page ``d`` holds, in every attention layer's K and V, what
source page ``s`` held when the step finished; no other page changes (``(0, 0)`` pads leave the
sink page as it was).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from radixflow_jax.models.batch import ModelCache


def copy_pages(cache: ModelCache, src: jax.Array, dst: jax.Array) -> ModelCache:
    """``cache`` with pages ``dst[i]`` set to pages ``src[i]`` in every attention layer's K and V.
    Sources are gathered before any destination is written; destinations must be distinct, or all
    copies into one destination copy the same source (the padding ``(0, 0)``)."""
    kv = tuple((k.at[dst].set(k[src]), v.at[dst].set(v[src])) for k, v in cache.kv)
    return cache._replace(kv=kv)


class PageCopier:
    """One compiled :func:`copy_pages` of ``width`` pairs for an executor's pools (donated)."""

    def __init__(self, width: int):
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.width = width
        self._fn = jax.jit(copy_pages, donate_argnums=0)

    def __call__(self, cache: ModelCache, pairs: Sequence[tuple[int, int]]) -> ModelCache:
        if len(pairs) > self.width:
            raise ValueError(f"{len(pairs)} page copies in one round, at most {self.width}")
        if not cache.kv:
            return cache  # no attention layer: nothing to copy
        src = np.zeros(self.width, np.int32)
        dst = np.zeros(self.width, np.int32)
        if pairs:
            src[: len(pairs)], dst[: len(pairs)] = zip(*pairs)
        return self._fn(cache, src, dst)
