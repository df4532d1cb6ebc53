"""Repeated, interleaved runs: medians and spreads of each policy's metrics.

On a shared machine a wall-clock comparison of two policies means something only when the policies
run interleaved (native, radixflow, native, radixflow, ...) and are summarised by medians with
their spread. Simulated runs are deterministic: one repeat is enough there.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Callable, Sequence

from radixflow_jax.bench.driver import RunResult
from radixflow_jax.engine.config import RoundRecord

_INT_FIELDS = {f.name for f in dataclasses.fields(RunResult) if f.type in ("int", int)}
_SKIP = {"policy", "latencies"}


@dataclasses.dataclass(frozen=True)
class Repeated:
    """``median``: one result whose every metric is the median over the repeats (its latencies are
    the first repeat's); ``spread``: ``metric -> (min, max)``; ``runs``: each repeat in run order."""

    median: RunResult
    spread: dict[str, tuple[float, float]]
    runs: tuple[RunResult, ...]


def summarize_repeats(runs: Sequence[RunResult]) -> Repeated:
    if not runs:
        raise ValueError("no runs to summarise")
    values: dict[str, float | int | str | tuple[float, ...]] = {
        "policy": runs[0].policy, "latencies": runs[0].latencies
    }
    spread = {}
    for f in dataclasses.fields(RunResult):
        if f.name in _SKIP:
            continue
        xs = [getattr(r, f.name) for r in runs]
        med = statistics.median(xs)
        values[f.name] = int(round(med)) if f.name in _INT_FIELDS else float(med)
        spread[f.name] = (float(min(xs)), float(max(xs)))
    return Repeated(RunResult(**values), spread, tuple(runs))  # type: ignore[arg-type]


def run_repeated(
    policies: Sequence[str],
    repeats: int,
    run_one: Callable[[str], tuple[RunResult, list[RoundRecord]]],
) -> tuple[list[Repeated], dict[str, list[RoundRecord]]]:
    """Runs every policy ``repeats`` times, interleaved; returns one :class:`Repeated` per policy
    (in ``policies`` order) and the first repeat's round records per policy."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    per: dict[str, list[RunResult]] = {p: [] for p in policies}
    records: dict[str, list[RoundRecord]] = {}
    for _ in range(repeats):
        for policy in policies:
            result, recs = run_one(policy)
            per[policy].append(result)
            records.setdefault(policy, recs)
    return [summarize_repeats(per[p]) for p in policies], records
