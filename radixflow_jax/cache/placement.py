"""Where checkpoints are planted (docs/design.md, "Radix cache with recurrent checkpoints" and
"Exact depth"): the one home of the placement rules.

Checkpoints go (a) on the grid ``G`` as a prefill advances, spaced by :func:`spacing`; (b) at
*branch points*: when a request's path leaves an existing or pending path at token depth ``d``,
at the deepest emit depth ``<= d``, and, looking ahead, where a producer's prompt diverges from
requests already waiting with the same prefix (so the first sibling already finds the checkpoint);
(c) at the prompt end, exactly when the span ends the prompt. A request's exact end (every token
its state consumed) is not planted: the finished request's own slot becomes that checkpoint
(``RadixCache.keep_end``, ``scheduler/allocator.py``).

All positions are depths from the sequence start (number of tokens the state has consumed). A span
can write a state without being split at its *emit depths*: its end, and the ends of its kernel
chunks on its grid. A span that starts on the grid (every span whose request did not start from an
exact-depth checkpoint, and every one-token span) has the multiples of ``G`` inside it; a span that
starts off the grid, at an exact-depth checkpoint, has ``start + k * G`` (its own chunks end there)
and, when it is cut by the token budget, ends on the grid (``scheduler/builder.grid_span``), so the
request's later spans start on the grid again. :func:`place` is what the scheduler calls; the
helpers :func:`grid_positions`, :func:`branch_point` and :func:`end_position` are the grid rules
the cache tests drive the tree with.

Priority (what survives when the state pool is short, see ``scheduler/allocator.py``): look-ahead
branch points first (waiting siblings need them), then every other position deepest first (a
deeper checkpoint saves more recomputation for every request that reaches it).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

__all__ = [
    "Placement",
    "branch_point",
    "checkpoint_positions",
    "common_prefix",
    "end_position",
    "grid_positions",
    "lookahead_lengths",
    "place",
    "spacing",
]

KINDS = ("lookahead", "branch", "prompt-end", "grid")


def grid_positions(start: int, end: int, grid: int) -> list[int]:
    """Multiples of ``grid`` strictly inside ``(start, end]``, ascending (empty when ``end <= start``)."""
    if grid < 1:
        raise ValueError(f"grid must be >= 1, got {grid}")
    first = (max(start, 0) // grid + 1) * grid
    return list(range(first, end + 1, grid))


def branch_point(shared_len: int, grid: int) -> int:
    """``floor(shared_len / G) * G``: the checkpoint depth for a path leaving another at ``shared_len``."""
    if grid < 1:
        raise ValueError(f"grid must be >= 1, got {grid}")
    return (max(shared_len, 0) // grid) * grid


def end_position(length: int, page_size: int) -> int:
    """A request-end checkpoint depth: ``length`` rounded down to ``page_size`` (0 means none). The
    scheduler passes the grid here (see the module docstring); the cache accepts any page multiple."""
    return (max(length, 0) // page_size) * page_size


def spacing(prompt_len: int, grid: int, *, interval: int = 0, max_checkpoints: int = 8) -> int:
    """Grid-checkpoint spacing: ``interval`` when set (a multiple of ``grid``), else the grid multiple
    that spreads about ``max_checkpoints`` over the prompt (dense grids exhaust the state pool on
    long prompts)."""
    if interval:
        if interval % grid:
            raise ValueError(f"checkpoint interval {interval} must be a multiple of the grid {grid}")
        return interval
    per = -(-prompt_len // max(max_checkpoints, 1))
    return max(grid, -(-per // grid) * grid)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token tuples (slice comparisons, O(n log n) in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def lookahead_lengths(tokens: Sequence[int], siblings: Iterable[Sequence[int]], limit: int) -> set[int]:
    """Divergence depths of ``tokens`` from each waiting sibling, each capped at ``limit`` and at the
    sibling's own ``len - 1`` (a request never matches its last token: it must compute one)."""
    out = set()
    for sib in siblings:
        d = min(common_prefix(tokens, sib), limit, len(sib) - 1)
        if d > 0:
            out.add(d)
    return out


@dataclasses.dataclass(frozen=True)
class Placement:
    depth: int
    kind: str  # one of KINDS


def place(
    start: int,
    end: int,
    *,
    grid: int,
    every: int,
    prompt_len: int,
    branch_lens: Iterable[int] = (),
    lookahead_lens: Iterable[int] = (),
) -> list[Placement]:
    """The checkpoints a span computing tokens ``[start, end)`` should emit, in priority order.

    ``every``: the grid spacing (:func:`spacing`); ``prompt_len``: the prompt end; ``branch_lens``:
    divergence depths from existing or pending paths; ``lookahead_lens``: divergence depths from
    waiting siblings. Every depth is an *emit depth* of the span in ``(start, end]``
    (:func:`emit_depths`); one placement per depth (the most important kind wins). A divergence at
    ``x`` places at the deepest emit depth ``<= x``; the prompt end at the deepest one ``<=
    prompt_len`` (exactly ``prompt_len`` when the span ends the prompt).
    """
    if every % grid:
        raise ValueError(f"spacing {every} must be a multiple of the grid {grid}")
    anchor = start % grid if end - start > 1 else 0
    chosen: dict[int, str] = {}

    def snap(x: int) -> int:
        on_grid = anchor + (x - anchor) // grid * grid if x >= anchor else 0
        return max(on_grid, end if end <= x else 0)

    def add(depth: int, kind: str) -> None:
        if start < depth <= end and depth not in chosen:
            chosen[depth] = kind

    for d in sorted({snap(x) for x in lookahead_lens}, reverse=True):
        add(d, "lookahead")
    for d in sorted({snap(x) for x in branch_lens}, reverse=True):
        add(d, "branch")
    add(snap(prompt_len), "prompt-end")
    first = start + every if anchor else (start // every + 1) * every
    for d in range(first, end + 1, every):
        add(d, "grid")
    rank = {"lookahead": 0}
    return [Placement(d, k) for d, k in sorted(chosen.items(), key=lambda dk: (rank.get(dk[1], 1), -dk[0]))]


def checkpoint_positions(
    start: int,
    end: int,
    *,
    grid: int,
    page_size: int,
    branch_len: int | None = None,
    final_len: int | None = None,
) -> list[int]:
    """Cache-level helper (tests drive the tree with it): the union of ``grid_positions(start, end,
    grid)``, ``branch_point(branch_len, grid)`` and ``end_position(final_len, page_size)``, each kept
    only when it lies in ``(start, end]``, ascending. All are positive multiples of ``page_size``."""
    if grid % page_size:
        raise ValueError(f"grid {grid} must be a multiple of page_size {page_size}")
    positions = set(grid_positions(start, end, grid))
    if branch_len is not None:
        positions.add(branch_point(branch_len, grid))
    if final_len is not None:
        positions.add(end_position(final_len, page_size))
    return sorted(p for p in positions if start < p <= end and p > 0)
