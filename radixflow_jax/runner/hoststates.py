"""The host tier's memory: recurrent-state checkpoints spilled from the device pools and restored
into them (``cache/tiers.py`` keeps the books; docs/design.md, "The host tier").

:class:`HostStates` holds, per recurrent layer, one host array of conv states and one of SSM
states with ``num_host_slots + 1`` rows (host slot ``h``, 1 .. ``num_host_slots``, is row ``h``; row
0 is never used, as in every pool). A round's ``state_moves`` reach it in order (``apply_moves``):

* a *spill* gathers device slots into a fresh device array with one jitted program and starts its
  copy to the host (``copy_to_host_async``) without waiting: the device keeps running rounds while
  the bytes travel. The gathered array is *landing* until it is written into the host rows, which
  happens once it is ready (checked at each later call, oldest first) or, at the latest, before a
  restore reads one of its rows;
* a *restore* lands the spills still in flight up to the last one that wrote a row it reads (the
  ones before it first: landings keep dispatch order), then scatters host rows into device slots
  with one jitted program over the donated pools (dispatched in order with the steps, so it runs
  after every round launched before it and before every round launched after it).

Invariants: after ``spill([(d, h)])`` and any later ``restore([(h, d2)])`` with no spill into ``h``
between, slot ``d2`` holds what slot ``d`` held when the spill was dispatched (a spill reads the
pools as the rounds dispatched before it left them); landings apply in dispatch order, so a host row
spilled twice holds the later state. Padding entries (slot 0) write slot 0's own value back.
Programs have a fixed width (``width`` pairs a call; more pairs run in several calls), so every
round reuses the same two compiled programs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from radixflow_jax.cache import StateMove
from radixflow_jax.models.batch import ModelCache
from radixflow_jax.runner.pagecopy import padded_chunks

__all__ = ["HostStates"]


def _gather(cache: ModelCache, idx: jax.Array) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    return tuple(c[idx] for c in cache.conv), tuple(s[idx] for s in cache.ssm)


def _scatter(
    cache: ModelCache, idx: jax.Array, keep: jax.Array, conv: tuple[jax.Array, ...], ssm: tuple[jax.Array, ...]
) -> ModelCache:
    """Writes ``conv``/``ssm`` rows into slots ``idx`` where ``keep`` (padding rows rewrite their slot)."""

    def put(pool: jax.Array, vals: jax.Array) -> jax.Array:
        mask = keep.reshape((-1,) + (1,) * (vals.ndim - 1))
        return pool.at[idx].set(jnp.where(mask, vals.astype(pool.dtype), pool[idx]))

    return cache._replace(conv=tuple(map(put, cache.conv, conv)), ssm=tuple(map(put, cache.ssm, ssm)))


class HostStates:
    """Host rows for ``num_host_slots`` checkpoints of the model whose pools look like ``cache``
    (see the module docstring)."""

    def __init__(self, cache: ModelCache, num_host_slots: int, *, width: int) -> None:
        if num_host_slots < 1 or width < 1:
            raise ValueError(f"num_host_slots and width must be >= 1, got {num_host_slots}, {width}")
        # host slots are 1 .. num_host_slots (HostPool(num_host_slots + 1)): row h is slot h, row 0
        # unused; np.zeros maps pages lazily, so host memory is taken as rows are written
        rows = num_host_slots + 1
        self.conv = [np.zeros((rows, *c.shape[1:]), c.dtype) for c in cache.conv]
        self.ssm = [np.zeros((rows, *s.shape[1:]), s.dtype) for s in cache.ssm]
        self.width = width
        self._gather = jax.jit(_gather)
        self._scatter = jax.jit(_scatter, donate_argnums=0)
        self._landing: list[tuple[np.ndarray, int, tuple[jax.Array, ...], tuple[jax.Array, ...]]] = []

    def prime(self, cache: ModelCache) -> ModelCache:
        """Compiles both programs (a warm-up: slot 0 onto itself)."""
        cache = self.restore(cache, [])
        self.spill(cache, [])
        self._land(block=True)
        return cache

    def apply_moves(self, cache: ModelCache, moves: Sequence[StateMove], copier) -> ModelCache:
        """Applies a plan's ``state_moves`` in order (runs of one kind batched); ``copier`` makes
        the device copies (``runner/pagecopy.StateCopier``)."""
        self._land(block=False)
        for kind, run in itertools.groupby(moves, key=lambda m: m.kind):
            pairs = [(m.src, m.dst) for m in run]
            if kind == "copy":
                cache = copier(cache, pairs)
            elif kind == "spill":
                self.spill(cache, pairs)
            else:
                cache = self.restore(cache, pairs)
        return cache

    def spill(self, cache: ModelCache, pairs: Sequence[tuple[int, int]]) -> None:
        """Starts copying device slots to host rows: ``(device slot, host slot)`` pairs."""
        for idx, rows, n in padded_chunks(pairs, self.width):
            conv, ssm = self._gather(cache, idx)
            for arr in (*conv, *ssm):
                arr.copy_to_host_async()
            self._landing.append((rows, n, conv, ssm))

    def restore(self, cache: ModelCache, pairs: Sequence[tuple[int, int]]) -> ModelCache:
        """Copies host rows into device slots: ``(host slot, device slot)`` pairs, once the spills
        that wrote those rows have landed (and every spill dispatched before them)."""
        wanted = {h for h, _ in pairs}
        writes = [i for i, (rows, n, _, _) in enumerate(self._landing) if wanted & set(rows[:n].tolist())]
        self._land(block=True, count=max(writes, default=-1) + 1)
        for rows, idx, n in padded_chunks(pairs, self.width):
            keep = np.arange(self.width) < n
            conv = tuple(a[rows] for a in self.conv)
            ssm = tuple(a[rows] for a in self.ssm)
            cache = self._scatter(cache, idx, keep, conv, ssm)
        return cache

    def _land(self, *, block: bool, count: int | None = None) -> None:
        """Writes arrived spills into the host rows, oldest first; with ``block``, the oldest
        ``count`` (all when None) whether or not they arrived, then the arrived ones after them."""
        forced = len(self._landing) if count is None else count
        while self._landing:
            rows, n, conv, ssm = self._landing[0]
            must = block and forced > 0
            if not must and not all(a.is_ready() for a in (*conv, *ssm)):
                return
            forced -= 1
            for host, arr in zip((*self.conv, *self.ssm), (*conv, *ssm)):
                host[rows[:n]] = np.asarray(arr)[:n]
            self._landing.pop(0)
