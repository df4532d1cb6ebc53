"""Partners: requests that depend on a producer's uncommitted round and go back to the queue with it.

One registry, two users: the radix cache's paired references (policy ``pair``, ``RadixCache.pair``)
and the scheduler's riders (``scheduler/riders.py``). Each entry lives from planning until the
round it depends on commits, or until the producer leaves (:meth:`Partners.take`, to roll them
back) or the partner does (:meth:`Partners.drop_partner`).

Invariant: no producer maps to an empty set (an emptied entry is removed). Plain Python.
"""

from __future__ import annotations


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
        partners = self._of.get(producer)
        if partners is not None:
            partners.discard(partner)
            if not partners:
                del self._of[producer]

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
