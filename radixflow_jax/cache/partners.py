"""Partners: requests that depend on a producer's uncommitted round and go back to the queue with it.

One registry, two users: the radix cache's paired references (policy ``pair``, ``RadixCache.pair``)
and the scheduler's riders (``scheduler/riders.py``). Each entry lives from planning until the
round it depends on commits, or until the producer leaves (:meth:`Partners.take`, to roll them
back) or the partner does (:meth:`Partners.drop_partner`).

Invariant: no producer maps to an empty set (an emptied entry is removed). Plain Python.
"""

from __future__ import annotations

from typing import Hashable, TypeVar

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V", bound=Hashable)


def discard_member(index: dict[_K, set[_V]], key: _K, member: _V) -> None:
    """Removes ``member`` from ``index[key]`` (if there) and the key once its set is empty: keeps the
    invariant that no key of a set-valued index maps to an empty set."""
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]


class Partners:
    """``producer id -> {partner ids}``."""

    def __init__(self) -> None:
        self._of: dict[int, set[int]] = {}

    def add(self, producer: int, partner: int) -> None:
        self._of.setdefault(producer, set()).add(partner)

    def take(self, producer: int) -> tuple[int, ...]:
        """Removes and returns (ascending) the partners of ``producer``."""
        return tuple(sorted(self._of.pop(producer, ())))

    def discard(self, producer: int, partner: int) -> None:
        """``partner`` no longer depends on ``producer`` (their round committed)."""
        discard_member(self._of, producer, partner)

    def drop_partner(self, partner: int) -> None:
        """``partner`` is gone (finished, aborted, preempted, rolled back): from every producer."""
        for producer in [p for p, ps in self._of.items() if partner in ps]:
            self.discard(producer, partner)

    def drop_producer(self, producer: int) -> None:
        self._of.pop(producer, None)

    def has(self, producer: int) -> bool:
        return producer in self._of

    def as_dict(self) -> dict[int, tuple[int, ...]]:
        """Producer -> its partners (ascending), in producer order: for invariants and tests."""
        return {p: tuple(sorted(ps)) for p, ps in sorted(self._of.items())}
