"""The host tier's memory: recurrent-state checkpoints and KV pages spilled from the device pools
and restored into them (``cache/tiers.py`` keeps the books; docs/design.md, "The host tier").

:class:`HostStates` holds host rows of two *units*, each a pool of its own ids:

* ``state``: per recurrent layer, one host array of conv states and one of SSM states with
  ``num_host_slots + 1`` rows (``conv``, ``ssm``);
* ``kv``: per attention layer and per MTP layer, one host array of K pages and one of V pages with
  ``num_host_pages + 1`` rows (``kv``, ``mtp``; a page's row is ``[page, Hkv, D]``, as on the device).

Host id ``h`` (1 .. the unit's count) is row ``h``; row 0 is never used, as in every pool. Either
count may be 0 (that unit has no rows and its moves are refused), not both. A round's
``state_moves`` reach it in order (``apply_moves``; ``copy`` goes to the device copier):

* a *spill* (``spill``: device slot -> host slot; ``kv_spill``: device page -> host page) gathers
  the device rows into a fresh device array with one jitted program and starts its copy to the host
  (``copy_to_host_async``) without waiting: the device keeps running rounds while the bytes travel.
  The gathered array is *landing* until it is written into the host rows, which happens once it is
  ready (checked at each later call, oldest first) or, at the latest, before a restore reads one of
  its rows. Both units share one landing queue, so landings keep dispatch order across them;
* a *restore* (``restore``: host slot -> device slot; ``kv_restore``: host page -> device page)
  lands the spills of its unit still in flight up to the last one that wrote a row it reads (every
  landing before it first), then scatters host rows into device rows with one jitted program over
  the donated pools (dispatched in order with the steps, so it runs after every round launched
  before it and before every round launched after it).

Invariants: after ``spill([(d, h)])`` and any later ``restore([(h, d2)])`` with no spill into ``h``
between, slot ``d2`` holds what slot ``d`` held when the spill was dispatched (a spill reads the
pools as the rounds and moves dispatched before it left them), in every recurrent layer; the same
for ``kv_spill`` / ``kv_restore`` and page ``d2``, in every attention and MTP layer's K and V. A
device row a spill freed may be written by a later restore of the same list: the gather was
dispatched first. Landings apply in dispatch order, so a host row spilled twice holds the later
content. Padding entries (id 0) write row 0's own value back. Programs have a fixed width
(``width`` pairs a call; more pairs run in several calls), so every round reuses the same compiled
programs: two per unit with a nonzero count (:meth:`HostStates.prime` compiles them).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from radixflow_jax.cache import StateMove
from radixflow_jax.models.batch import ModelCache
from radixflow_jax.runner.pagecopy import padded_chunks

__all__ = ["HostStates"]

Arrays = tuple[jax.Array, ...]
Pairs = Sequence[tuple[int, int]]


def _page_pools(cache: ModelCache) -> list[jax.Array]:
    """Every attention layer's K and V pool, then every MTP layer's (the ``kv`` unit's order)."""
    return [a for pair in (*cache.kv, *cache.mtp) for a in pair]


def _gather_states(cache: ModelCache, idx: jax.Array) -> Arrays:
    return tuple(c[idx] for c in cache.conv) + tuple(s[idx] for s in cache.ssm)


def _gather_pages(cache: ModelCache, idx: jax.Array) -> Arrays:
    return tuple(a[idx] for a in _page_pools(cache))


def _put(pool: jax.Array, idx: jax.Array, keep: jax.Array, vals: jax.Array) -> jax.Array:
    """``pool`` with rows ``idx`` set to ``vals`` where ``keep`` (padding rows rewrite their own row)."""
    mask = keep.reshape((-1,) + (1,) * (vals.ndim - 1))
    return pool.at[idx].set(jnp.where(mask, vals.astype(pool.dtype), pool[idx]))


def _scatter_states(cache: ModelCache, idx: jax.Array, keep: jax.Array, vals: Arrays) -> ModelCache:
    n = len(cache.conv)
    conv = tuple(_put(p, idx, keep, v) for p, v in zip(cache.conv, vals[:n]))
    ssm = tuple(_put(p, idx, keep, v) for p, v in zip(cache.ssm, vals[n:]))
    return cache._replace(conv=conv, ssm=ssm)


def _scatter_pages(cache: ModelCache, idx: jax.Array, keep: jax.Array, vals: Arrays) -> ModelCache:
    def layers(pools: tuple[tuple[jax.Array, jax.Array], ...], start: int) -> tuple[tuple[jax.Array, jax.Array], ...]:
        return tuple(
            (_put(k, idx, keep, vals[start + 2 * i]), _put(v, idx, keep, vals[start + 2 * i + 1]))
            for i, (k, v) in enumerate(pools)
        )

    return cache._replace(kv=layers(cache.kv, 0), mtp=layers(cache.mtp, 2 * len(cache.kv)))


class _Unit(NamedTuple):
    """One unit's host rows (flat, in its gather order), its id count and its two programs."""

    rows: list[np.ndarray]
    count: int
    gather: Callable[[ModelCache, jax.Array], Arrays]
    scatter: Callable[[ModelCache, jax.Array, jax.Array, Arrays], ModelCache]


class _Landing(NamedTuple):
    """A spill in flight: the unit whose ``rows[:n]`` it writes, from the gathered ``arrays``."""

    unit: str
    rows: np.ndarray
    n: int
    arrays: Arrays


def _host_rows(pools: Sequence[jax.Array], count: int) -> list[np.ndarray]:
    # np.zeros maps pages lazily, so host memory is taken as rows are written
    return [np.zeros((count + 1, *p.shape[1:]), p.dtype) for p in pools] if count else []


class HostStates:
    """Host rows for ``num_host_slots`` checkpoints and ``num_host_pages`` KV pages of the model
    whose pools look like ``cache`` (see the module docstring)."""

    def __init__(self, cache: ModelCache, num_host_slots: int, *, width: int, num_host_pages: int = 0) -> None:
        if num_host_slots < 0 or num_host_pages < 0 or num_host_slots + num_host_pages < 1 or width < 1:
            raise ValueError(
                "num_host_slots and num_host_pages must be >= 0, not both 0, and width >= 1, got "
                f"{num_host_slots}, {num_host_pages}, {width}"
            )
        states = _host_rows((*cache.conv, *cache.ssm), num_host_slots)
        pages = _host_rows(_page_pools(cache), num_host_pages)
        self.conv, self.ssm = states[: len(cache.conv)], states[len(cache.conv) :]
        pairs = list(zip(pages[::2], pages[1::2]))
        self.kv, self.mtp = pairs[: len(cache.kv)], pairs[len(cache.kv) :]
        self.width = width
        self._units = {
            "state": _Unit(states, num_host_slots, jax.jit(_gather_states), jax.jit(_scatter_states, donate_argnums=0)),
            "kv": _Unit(pages, num_host_pages, jax.jit(_gather_pages), jax.jit(_scatter_pages, donate_argnums=0)),
        }
        self._landing: list[_Landing] = []

    def prime(self, cache: ModelCache) -> ModelCache:
        """Compiles the programs of every unit with host rows (a warm-up: id 0 onto itself)."""
        for name, unit in self._units.items():
            if unit.count:
                cache = self._restore(name, cache, [])
                self._spill(name, cache, [])
        self._land(block=True)
        return cache

    def apply_moves(
        self, cache: ModelCache, moves: Sequence[StateMove], copier: Callable[[ModelCache, Pairs], ModelCache]
    ) -> ModelCache:
        """Applies a plan's ``state_moves`` in order (runs of one kind batched); ``copier`` makes
        the device copies (``runner/pagecopy.StateCopier``). ``ValueError`` for a move of a unit
        without host rows."""
        self._land(block=False)
        for kind, group in itertools.groupby(moves, key=lambda m: m.kind):
            run = list(group)
            pairs = [(m.src, m.dst) for m in run]
            unit = "kv" if run[0].of_pages else "state"
            if kind == "copy":
                cache = copier(cache, pairs)
            elif run[0].to_host:
                self._spill(unit, cache, pairs)
            else:
                cache = self._restore(unit, cache, pairs)
        return cache

    def spill(self, cache: ModelCache, pairs: Pairs) -> None:
        """Starts copying device slots to host rows: ``(device slot, host slot)`` pairs."""
        self._spill("state", cache, pairs)

    def restore(self, cache: ModelCache, pairs: Pairs) -> ModelCache:
        """Copies host rows into device slots: ``(host slot, device slot)`` pairs, once the spills
        that wrote those rows have landed (and every spill dispatched before them)."""
        return self._restore("state", cache, pairs)

    def _check(self, name: str, host_ids: Sequence[int]) -> _Unit:
        unit = self._units[name]
        bad = [h for h in host_ids if not 1 <= h <= unit.count]
        if bad:
            what = "host slots" if name == "state" else "host pages"
            raise ValueError(f"{what} {bad} outside 1 .. {unit.count} (this host tier's {what})")
        return unit

    def _spill(self, name: str, cache: ModelCache, pairs: Pairs) -> None:
        unit = self._check(name, [h for _, h in pairs])
        for idx, rows, n in padded_chunks(pairs, self.width):
            arrays = unit.gather(cache, idx)
            for arr in arrays:
                arr.copy_to_host_async()
            self._landing.append(_Landing(name, rows, n, arrays))

    def _restore(self, name: str, cache: ModelCache, pairs: Pairs) -> ModelCache:
        unit = self._check(name, [h for h, _ in pairs])
        wanted = {h for h, _ in pairs}
        writes = [i for i, s in enumerate(self._landing) if s.unit == name and wanted & set(s.rows[: s.n].tolist())]
        self._land(block=True, count=max(writes, default=-1) + 1)
        for rows, idx, n in padded_chunks(pairs, self.width):
            keep = np.arange(self.width) < n
            cache = unit.scatter(cache, idx, keep, tuple(a[rows] for a in unit.rows))
        return cache

    def _land(self, *, block: bool, count: int | None = None) -> None:
        """Writes arrived spills into the host rows, oldest first; with ``block``, the oldest
        ``count`` (all when None) whether or not they arrived, then the arrived ones after them."""
        forced = len(self._landing) if count is None else count
        while self._landing:
            spill = self._landing[0]
            if not (block and forced > 0) and not all(a.is_ready() for a in spill.arrays):
                return
            forced -= 1
            for host, arr in zip(self._units[spill.unit].rows, spill.arrays):
                host[spill.rows[: spill.n]] = np.asarray(arr)[: spill.n]
            self._landing.pop(0)
