"""Copying KV pages and recurrent states between rounds.

* Pages: a rider's own copy of its producer's partial last page (``scheduler/riders.py``,
  ``RoundPlan.page_copies``, after the step) and a row's own copy of a tail's partial page
  (``RoundPlan.copies_before``, before the step).
* States: a finished request's kept end moved out of the request band of the slot pool
  (``cache/pools.SlotPool``, ``RoundPlan.state_moves``, before the step).

:class:`PageCopier` and :class:`StateCopier` each run one jitted program of a fixed width ``width``
(pairs padded with ``(0, 0)``, the sink copied onto itself; more pairs than that run in several
calls), so every round with copies reuses one compiled program. Each takes the pools it is given
(donated) and is dispatched in order with the steps, so on the device a copy runs after every
round launched before it and before every round launched after it.

Invariants: after a page copy, destination page ``d`` holds, in every attention layer's K and V,
what source page ``s`` held; after a state copy, destination slot ``d`` holds, in every recurrent
layer's conv and SSM pool, what slot ``s`` held. Nothing else changes (``(0, 0)`` pads leave the
sink as it was). Destinations are distinct and no destination is a source of the same call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import jax
import numpy as np

from radixflow_jax.models.batch import ModelCache


def copy_pages(cache: ModelCache, src: jax.Array, dst: jax.Array) -> ModelCache:
    """``cache`` with pages ``dst[i]`` set to pages ``src[i]`` in every attention layer's K and V.
    Sources are gathered before any destination is written; destinations must be distinct, or all
    copies into one destination copy the same source (the padding ``(0, 0)``)."""
    kv = tuple((k.at[dst].set(k[src]), v.at[dst].set(v[src])) for k, v in cache.kv)
    mtp = tuple((k.at[dst].set(k[src]), v.at[dst].set(v[src])) for k, v in cache.mtp)  # the MTP layers' KV
    return cache._replace(kv=kv, mtp=mtp)


def copy_states(cache: ModelCache, src: jax.Array, dst: jax.Array) -> ModelCache:
    """``cache`` with slots ``dst[i]`` set to slots ``src[i]`` in every recurrent layer's conv and
    SSM pools (the same rules as :func:`copy_pages`)."""
    conv = tuple(c.at[dst].set(c[src]) for c in cache.conv)
    ssm = tuple(s.at[dst].set(s[src]) for s in cache.ssm)
    return cache._replace(conv=conv, ssm=ssm)


def padded_chunks(pairs: Sequence[tuple[int, int]], width: int) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """``pairs`` as ``(first, second, n)`` int32 columns of ``width`` entries each, ``n`` of them
    real and the rest 0 (the reserved id); an empty list still gives one all-padding chunk (the
    warm-up call of a fixed-width program)."""
    for i in range(0, max(len(pairs), 1), width):
        chunk = pairs[i : i + width]
        first, second = np.zeros(width, np.int32), np.zeros(width, np.int32)
        if chunk:
            first[: len(chunk)], second[: len(chunk)] = zip(*chunk)
        yield first, second, len(chunk)


class _Copier:
    """One compiled copy of ``width`` pairs over an executor's pools (donated)."""

    def __init__(self, width: int, fn: Callable[[ModelCache, jax.Array, jax.Array], ModelCache]):
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.width = width
        self._fn = jax.jit(fn, donate_argnums=0)

    def _empty(self, cache: ModelCache) -> bool:
        raise NotImplementedError

    def __call__(self, cache: ModelCache, pairs: Sequence[tuple[int, int]]) -> ModelCache:
        """``cache`` after the copies ``pairs`` (an empty list still runs once: the warm-up)."""
        if self._empty(cache):
            return cache  # no layer of this kind: nothing to copy
        for src, dst, _ in padded_chunks(pairs, self.width):
            cache = self._fn(cache, src, dst)
        return cache


class PageCopier(_Copier):
    """One compiled :func:`copy_pages` of ``width`` pairs."""

    def __init__(self, width: int):
        super().__init__(width, copy_pages)

    def _empty(self, cache: ModelCache) -> bool:
        return not cache.kv


class StateCopier(_Copier):
    """One compiled :func:`copy_states` of ``width`` pairs."""

    def __init__(self, width: int):
        super().__init__(width, copy_states)

    def _empty(self, cache: ModelCache) -> bool:
        return not cache.ssm
