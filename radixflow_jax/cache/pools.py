"""Reference-counted pools of KV pages and recurrent-state slots (host-side bookkeeping only).

A pool hands out integer ids ``1 .. size - 1``; id ``0`` is reserved (the padding sink page / the
dummy state slot that padding rows of a round point at) and is never handed out, counted or freed.

Invariants (``check_invariants`` verifies them):
  * every id ``1 .. size - 1`` is either free (on the free list, refcount 0) or owned (refcount > 0),
    never both and never neither;
  * the free list holds no duplicates and never holds the reserved id;
  * ``num_free + num_used == capacity == size - 1``.

Ownership is counted, not named: whoever holds a reference (a running request, the radix tree, a
round in flight) took it with ``alloc`` or ``incref`` and gives it back with ``decref``. An id returns
to the free list exactly when its count reaches 0. ``alloc`` is all-or-nothing: when the pool is
short it returns ``None`` and changes nothing, so a short pool defers admission instead of asserting.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

__all__ = ["HostPool", "InvariantError", "PagePool", "SlotPool", "RESERVED_ID"]

RESERVED_ID = 0


class InvariantError(AssertionError):
    """A cache or pool invariant does not hold (a bug, never a normal runtime condition)."""


class _RefCountPool:
    """A free list plus a refcount per id; see the module docstring for the invariants."""

    _what = "id"

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"pool size must be >= 1 (id 0 is reserved), got {size}")
        self._size = size
        self._refcount = [0] * size
        # A stack: the lowest ids are handed out first, freed ids are reused first (deterministic).
        self._free: list[int] = list(range(size - 1, 0, -1))

    @property
    def size(self) -> int:
        """Total ids including the reserved id 0."""
        return self._size

    @property
    def capacity(self) -> int:
        """Ids that can ever be handed out (``size - 1``)."""
        return self._size - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.capacity - len(self._free)

    def _check_id(self, i: int) -> None:
        if not isinstance(i, int) or isinstance(i, bool):
            raise TypeError(f"{self._what} must be an int, got {type(i).__name__}")
        if i == RESERVED_ID:
            raise ValueError(f"{self._what} 0 is reserved and never owned")
        if not 0 < i < self._size:
            raise ValueError(f"{self._what} {i} out of range 1..{self._size - 1}")

    def refcount(self, i: int) -> int:
        self._check_id(i)
        return self._refcount[i]

    def is_free(self, i: int) -> bool:
        return self.refcount(i) == 0

    def alloc(self, n: int) -> list[int] | None:
        """``n`` fresh ids with refcount 1 each, or ``None`` (and no change at all) when short."""
        return self._alloc(n, high=False)

    def _alloc(self, n: int, *, high: bool) -> list[int] | None:
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of {self._what}s: {n}")
        if n > len(self._free):
            return None
        ids = self._take(n, high)
        for i in ids:
            self._refcount[i] = 1
        return ids

    def _take(self, n: int, high: bool) -> list[int]:
        """Removes ``n <= num_free`` ids from the free list (a stack: the last freed first)."""
        return [self._free.pop() for _ in range(n)]

    def _put(self, i: int) -> None:
        self._free.append(i)

    def incref(self, i: int) -> None:
        """Take one more reference to an owned id. Raises on a free id (no resurrection)."""
        self._check_id(i)
        if self._refcount[i] == 0:
            raise ValueError(f"incref of free {self._what} {i}")
        self._refcount[i] += 1

    def decref(self, i: int) -> bool:
        """Drop one reference; returns True when the id went back to the free list.

        Raises ``ValueError`` on a free id (the count would go below zero) and changes nothing then.
        """
        self._check_id(i)
        if self._refcount[i] == 0:
            raise ValueError(f"decref of free {self._what} {i} (refcount would go below zero)")
        self._refcount[i] -= 1
        if self._refcount[i] == 0:
            self._put(i)
            return True
        return False

    def release(self, ids: Iterable[int]) -> int:
        """``decref`` every id in ``ids``; returns how many went back to the free list."""
        return sum(1 for i in list(ids) if self.decref(i))

    def check_invariants(self) -> None:
        """Raise ``InvariantError`` unless every id is free xor owned and the counts add up."""
        free = self._free
        if len(set(free)) != len(free):
            raise InvariantError(f"{self._what} free list holds duplicates")
        if RESERVED_ID in free:
            raise InvariantError(f"reserved {self._what} 0 is on the free list")
        if self._refcount[RESERVED_ID] != 0:
            raise InvariantError(f"reserved {self._what} 0 has a refcount")
        free_set = set(free)
        for i in range(1, self._size):
            rc = self._refcount[i]
            if rc < 0:
                raise InvariantError(f"{self._what} {i} has negative refcount {rc}")
            if (i in free_set) == (rc > 0):
                raise InvariantError(f"{self._what} {i}: free={i in free_set} but refcount={rc}")
        owned = sum(1 for i in range(1, self._size) if self._refcount[i] > 0)
        if owned != self.num_used or owned + len(free) != self.capacity:
            raise InvariantError(f"{self._what} counts inconsistent: owned={owned} free={len(free)}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self._size}, free={self.num_free}, used={self.num_used})"


class PagePool(_RefCountPool):
    """KV pages ``1 .. num_pages - 1``; page 0 is the padding sink that padded tokens write into."""

    _what = "page"

    def __init__(self, num_pages: int) -> None:
        super().__init__(num_pages)


class SlotPool(_RefCountPool):
    """Recurrent-state slots ``1 .. num_slots - 1``; slot 0 is the dummy slot of padding rows.

    Two ends: :meth:`alloc` hands out the *lowest* free slots (a running request's slot) and
    :meth:`alloc_high` the *highest* (a checkpoint's). So the slots of the running requests stay
    packed at the low end, and a round's decode rows span a window of about as many slots as there
    are rows (the model reads and writes that window in place, ``runner/window.py``), while
    checkpoints fill the pool from the top. The free list is kept sorted.

    The *request band* is slots ``1 .. request_slots`` (the scheduler passes ``max_num_seqs``, the
    most request slots held at once). ``alloc_high(n, band=False)`` takes no slot of the band and
    ``alloc_low(n, band=True)`` only slots of it; ``Allocator.alloc_slot`` decides when either end
    may cross. Without the band, a finished request's kept end stayed in its slot, a pool full of
    checkpoints handed the next requests whatever slot eviction freed, and after a few workloads on
    one engine the running requests were spread over far more slots than ``max_num_seqs``: their
    decode rows fell out of the window into the prefill region (``runner/window.py``).
    ``tools/perf/slot_spread.py`` measures it."""

    _what = "slot"

    def __init__(self, num_slots: int, request_slots: int = 0) -> None:
        super().__init__(num_slots)
        self._free.reverse()  # ascending
        self.request_slots = max(0, min(request_slots, self.capacity))

    def alloc_high(self, n: int, *, band: bool = True) -> list[int] | None:
        """Like :meth:`alloc`, from the highest free slots; ``band=False``: none of the request
        band's (None when fewer than ``n`` are free above it)."""
        if not band and n > len(self._free) - bisect.bisect_right(self._free, self.request_slots):
            return None
        return self._alloc(n, high=True)

    @property
    def lowest_free(self) -> int | None:
        """The lowest free slot (None: none is free)."""
        return self._free[0] if self._free else None

    def alloc_low(self, n: int, *, band: bool = False) -> list[int] | None:
        """:meth:`alloc`; ``band=True``: only slots of the request band (None when fewer than ``n``
        of them are free)."""
        if band and n > bisect.bisect_right(self._free, self.request_slots):
            return None
        return self._alloc(n, high=False)

    def _take(self, n: int, high: bool) -> list[int]:
        if high:
            ids = self._free[len(self._free) - n :][::-1]
            del self._free[len(self._free) - n :]
        else:
            ids = self._free[:n]
            del self._free[:n]
        return ids

    def _put(self, i: int) -> None:
        bisect.insort(self._free, i)


class HostPool(_RefCountPool):
    """Host-memory checkpoint slots ``1 .. size - 1`` (0 reserved, as in every pool): the host
    tier's capacity in checkpoints (``cache/tiers.py``; ``engine/build.py`` sizes it)."""

    _what = "host slot"
