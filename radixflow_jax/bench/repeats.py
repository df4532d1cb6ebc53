"""Repeated, interleaved runs: medians and spreads of each policy's metrics, and each policy's
change against the first one as the median of per-repeat changes with their range.

On a shared machine a wall-clock comparison of two policies means something only when the policies
run interleaved (native, radixflow, pair, native, radixflow, pair, ...) so that drift hits them
alike, and are summarised by medians with their spread. A change is computed within each repeat
(policy against the base policy of the same repeat, run seconds apart) before the median is taken,
so drift between repeats cancels. Untimed warm-up runs of every policy may come first: they compile
the step variants and load what the first rounds would otherwise load on the serving clock.
Simulated runs are deterministic: one repeat is enough there.
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
    warmup: int = 0,
) -> tuple[list[Repeated], dict[str, list[RoundRecord]]]:
    """Runs every policy ``warmup`` times untimed (results dropped), then ``repeats`` times,
    interleaved; returns one :class:`Repeated` per policy (in ``policies`` order) and the first
    timed repeat's round records per policy."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    for _ in range(warmup):
        for policy in policies:
            run_one(policy)
    per: dict[str, list[RunResult]] = {p: [] for p in policies}
    records: dict[str, list[RoundRecord]] = {}
    for _ in range(repeats):
        for policy in policies:
            result, recs = run_one(policy)
            per[policy].append(result)
            records.setdefault(policy, recs)
    return [summarize_repeats(per[p]) for p in policies], records


CHANGE_KEYS = ("rounds", "mean_latency_s", "p99_latency_s", "mean_ttft_s", "throughput_tok_s")


def relative_change(base: RunResult, new: RunResult) -> dict[str, float]:
    """``(new - base) / base`` for the headline metrics (negative = fewer / faster); ``reuse_points``:
    the reuse difference in percentage points."""
    out = {}
    for key in CHANGE_KEYS:
        b, n = getattr(base, key), getattr(new, key)
        out[key] = (n - b) / b if b else 0.0
    out["reuse_points"] = 100.0 * (new.reuse - base.reuse)
    return out


@dataclasses.dataclass(frozen=True)
class Change:
    """One metric's change of a policy against the base policy: the median of the per-repeat changes
    and their min, max and quartiles (``lo <= q1 <= median <= q3 <= hi``); with one repeat all equal."""

    median: float
    lo: float
    hi: float
    q1: float
    q3: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Change:
        if not values:
            raise ValueError("no changes to summarise")
        xs = sorted(values)
        if len(xs) == 1:
            return cls(xs[0], xs[0], xs[0], xs[0], xs[0])
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        return cls(statistics.median(xs), xs[0], xs[-1], q1, q3)

    @property
    def sign_stable(self) -> bool:
        """Every repeat changed the metric the same way (all above zero, or all below)."""
        return self.lo > 0 or self.hi < 0


def paired_changes(base: Repeated, new: Repeated) -> dict[str, Change]:
    """Per metric of :func:`relative_change`: the change of ``new`` against ``base`` within each
    repeat (repeat ``i`` of both, run seconds apart), summarised over the repeats."""
    if len(base.runs) != len(new.runs):
        raise ValueError(f"{new.median.policy} has {len(new.runs)} repeats, {base.median.policy} {len(base.runs)}")
    per = [relative_change(b, n) for b, n in zip(base.runs, new.runs)]
    return {key: Change.of([p[key] for p in per]) for key in per[0]}
