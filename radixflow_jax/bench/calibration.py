"""The round-cost estimator scored on an executor we can measure (``benchmarks/calibrate_cost.py``).

A line (``engine/roundcost.LinearRoundCost``) is fitted to the rounds of one run and predicts the
round times (build + step, no compile) of a *held-out* run, another workload (other arrivals,
lengths and policy) on a fresh engine: none of its rounds is in the fit. Each prediction's relative
error ``|predicted - measured| / measured`` is reported beside a baseline that charges every round
the fit run's mean (a constant per-round cost, what a simulator without a cost model assumes).
``noise`` is the spread of repeated measurements of one variant in the fit run (the median over
variants with 3+ rounds of the standard deviation of log round time): the size of the seeded noise
a simulator should add (``radixflow bench --sim-noise``) to behave like this executor. No JAX.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Sequence

from radixflow_jax.engine.config import RoundRecord
from radixflow_jax.engine.roundcost import LinearRoundCost, record_features, record_seconds


@dataclasses.dataclass(frozen=True)
class CalibrationReport:
    """Errors are per held-out round, in record order; ``by_kind``: median error of the line per
    round kind (decode, mixed, prefill)."""

    fit_rounds: int
    held_out_rounds: int
    coef: dict[str, float]
    baseline_s: float
    errors: list[float]
    baseline_errors: list[float]
    by_kind: dict[str, tuple[int, float, float]]
    noise: float | None

    def summary(self) -> dict[str, float]:
        return {
            "median_error": _quantile(self.errors, 0.5),
            "p90_error": _quantile(self.errors, 0.9),
            "baseline_median_error": _quantile(self.baseline_errors, 0.5),
            "baseline_p90_error": _quantile(self.baseline_errors, 0.9),
        }


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def variant_noise(records: Sequence[RoundRecord], min_rounds: int = 3) -> float | None:
    """The median over step variants with ``min_rounds`` or more measured rounds of the standard
    deviation of their log round time; None when no variant has that many."""
    groups: dict[tuple[int, int, int], list[float]] = {}
    for r in records:
        if record_seconds(r) > 0:
            groups.setdefault((r.token_slots, r.row_slots, r.decode_slots), []).append(math.log(record_seconds(r)))
    spreads = [statistics.stdev(v) for v in groups.values() if len(v) >= min_rounds]
    return statistics.median(spreads) if spreads else None


def calibration_report(fit: Sequence[RoundRecord], held_out: Sequence[RoundRecord]) -> CalibrationReport:
    """Fit on ``fit``, score on ``held_out`` (rounds with no measured time are skipped in both)."""
    fit = [r for r in fit if record_seconds(r) > 0]
    held = [r for r in held_out if record_seconds(r) > 0]
    line = LinearRoundCost.from_records(fit)
    baseline = statistics.fmean(record_seconds(r) for r in fit)
    errors, base_errors, kinds = [], [], {}
    for r in held:
        measured = record_seconds(r)
        err = abs(line.predict(record_features(r)) - measured) / measured
        errors.append(err)
        base_errors.append(abs(baseline - measured) / measured)
        kinds.setdefault(r.kind, ([], []))
        kinds[r.kind][0].append(err)
        kinds[r.kind][1].append(base_errors[-1])
    by_kind = {k: (len(e), statistics.median(e), statistics.median(b)) for k, (e, b) in kinds.items()}
    return CalibrationReport(
        fit_rounds=len(fit),
        held_out_rounds=len(held),
        coef=line.named(),
        baseline_s=baseline,
        errors=errors,
        baseline_errors=base_errors,
        by_kind=by_kind,
        noise=variant_noise(fit),
    )
