"""Where checkpoints are planted (DESIGN.md section 5).

Checkpoints go (a) on the grid ``G`` as a prefill advances, (b) at *branch points*: when a request's
path leaves an existing or pending path at token depth ``d``, at ``floor(d / G) * G``, and (c) at a
request's end (prompt end and final generated token), rounded down to a page (see ``config.py``).
A coarse grid alone gives no hits on short shared prefixes; (b) and (c) are what make them reusable.

All positions are depths from the sequence start (number of tokens the state has consumed).
"""

from __future__ import annotations

__all__ = ["grid_positions", "branch_point", "end_position", "checkpoint_positions"]


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
    """A request-end checkpoint depth: ``length`` rounded down to a page (0 means none)."""
    return (max(length, 0) // page_size) * page_size


def checkpoint_positions(
    start: int,
    end: int,
    *,
    grid: int,
    page_size: int,
    branch_len: int | None = None,
    final_len: int | None = None,
) -> list[int]:
    """The checkpoint depths a round that computes tokens ``[start, end)`` should emit, ascending.

    The union of ``grid_positions(start, end, grid)``, ``branch_point(branch_len, grid)`` and
    ``end_position(final_len, page_size)``, each kept only when it lies in ``(start, end]``. All
    returned depths are positive multiples of ``page_size`` (``grid`` must be a multiple of it).
    """
    if grid % page_size:
        raise ValueError(f"grid {grid} must be a multiple of page_size {page_size}")
    positions = set(grid_positions(start, end, grid))
    if branch_len is not None:
        positions.add(branch_point(branch_len, grid))
    if final_len is not None:
        positions.add(end_position(final_len, page_size))
    return sorted(p for p in positions if start < p <= end and p > 0)
