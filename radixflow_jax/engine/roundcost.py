"""The round-cost estimator: the one model of a round's time that the policies consult (policy
``pair``'s paired admission and fill rule, ``scheduler/pairing.py``), the same on every executor.

A round's time is a line over the round's :data:`FEATURES`, with non-negative coefficients:

  * ``round``: 1 (the fixed per-round cost: launch, sync, host work not overlapped);
  * ``token_slots`` and ``row_slots``: the step variant the round runs in, as the model executor
    selects it (``runner/window.variant_for``): padding costs like real work;
  * ``attention_pairs``: query-key pairs of the real rows (``scheduler/plan.attention_pairs``; a
    decode row's context length);
  * ``pairing_tokens``: producer tokens a round with paired consumers scans first
    (``scheduler/plan.pairing_spans``; the GPU kernels' pre-pass, the TPU kernels' second scan).

:class:`LinearRoundCost` is one fitted line (non-negative least squares over the features, each
scaled to its largest value so no column dominates the solve). :class:`FittedRoundCost` is the
estimator an engine wires in: it reads the engine's round records as they appear (``build_s +
step_s``: compiling is never part of ``step_s``; on the simulator, the simulated round time),
keeps the last ``window`` and refits when new ones arrived. So the policies never see a cost the
executor did not report: on the simulator they no longer consult the clock that scores them.

Prior: until ``min_rounds`` rounds are read, every round is predicted at the same cost (the mean
seen so far, 0.0 before the first), so growing a round costs nothing and every fill and pairing
passes the cost rule: the first rounds carry no data to decide from.

No JAX here; it reads only records, plans and shapes (numpy and scipy for the fit). The solver is
imported when an estimator is built (:func:`load_solver`), before its engine serves a request.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

from radixflow_jax.engine.config import RoundRecord
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.runner.window import variant_for
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan, attention_pairs, pairing_spans

FEATURES = ("round", "token_slots", "row_slots", "attention_pairs", "pairing_tokens")
Features = tuple[float, float, float, float, float]


def plan_features(rows: Sequence[RowPlan], token_slots: int, row_slots: int) -> Features:
    """The :data:`FEATURES` of a round of ``rows`` run in a ``token_slots x row_slots`` variant."""
    pairing = sum(pairing_spans(rows).values())
    return 1.0, float(token_slots), float(row_slots), float(attention_pairs(rows)), float(pairing)


def record_features(rec: RoundRecord) -> Features:
    """The :data:`FEATURES` of a committed round, from its record."""
    return 1.0, float(rec.token_slots), float(rec.row_slots), float(rec.attention_pairs), float(rec.pairing_tokens)


def record_seconds(rec: RoundRecord) -> float:
    """What the estimator predicts of a round: its build and step time (no planning, no compile)."""
    return rec.build_s + rec.step_s


@dataclasses.dataclass(frozen=True)
class LinearRoundCost:
    """``seconds = sum(coef[i] * feature[i])`` over :data:`FEATURES`; ``rounds``: how many measured
    rounds the line was fitted to (0: a prior)."""

    coef: Features
    rounds: int = 0

    def predict(self, features: Features) -> float:
        return max(sum(c * x for c, x in zip(self.coef, features)), 0.0)

    def round_time(self, plan: RoundPlan, token_slots: int, row_slots: int) -> float:
        """The simulator's cost-model interface (a calibrated simulated executor)."""
        return self.predict(plan_features(plan.rows, token_slots, row_slots))

    def named(self) -> dict[str, float]:
        """The coefficients by feature name (seconds per unit)."""
        return dict(zip(FEATURES, self.coef))

    @classmethod
    def constant(cls, seconds: float = 0.0, rounds: int = 0) -> LinearRoundCost:
        return cls((seconds, 0.0, 0.0, 0.0, 0.0), rounds)

    @classmethod
    def fit(cls, samples: Sequence[tuple[Features, float]]) -> LinearRoundCost:
        """Non-negative least squares of seconds over the features of ``samples``; a feature that
        never varies from 0 gets coefficient 0. ``ValueError`` without samples."""
        import numpy as np
        from scipy.optimize import nnls

        if not samples:
            raise ValueError("a round-cost fit needs at least one measured round")
        x = np.array([f for f, _ in samples], dtype=np.float64)
        y = np.array([s for _, s in samples], dtype=np.float64)
        scale = np.abs(x).max(axis=0)
        scale[scale == 0] = 1.0
        sol, _ = nnls(x / scale, y)
        coef = sol / scale
        return cls(tuple(float(c) for c in coef), len(samples))  # type: ignore[arg-type]

    @classmethod
    def from_records(cls, records: Sequence[RoundRecord], *, with_plan: bool = False) -> LinearRoundCost:
        """A line fitted to committed rounds (``with_plan``: plus their planning time, what a whole
        simulated round should cost when the simulator mirrors a model engine)."""
        return cls.fit([(record_features(r), record_seconds(r) + (r.plan_s if with_plan else 0.0)) for r in records])


def load_solver() -> None:
    """Imports the fit's solver (``scipy.optimize``: about 0.5 s the first time in a process on the
    2-core dev machine). Called when an estimator is built: imported lazily at the first fit, it fell
    on the serving clock of the round that first fitted (policy pair's 11th round of the first run in
    a ``radixflow bench`` process planned for 0.42-0.63 s instead of about 2 ms)."""
    from scipy.optimize import nnls  # noqa: F401


class FittedRoundCost:
    """``cost(rows)``: seconds a round of ``rows`` would take, from the line fitted to the last
    ``window`` rounds of ``records`` (the engine's list, read incrementally by round index, so an
    owner trimming it loses nothing that was read); the prior until ``min_rounds`` were read."""

    def __init__(
        self,
        shapes: ShapeConfig,
        records: Sequence[RoundRecord],
        *,
        window: int = 256,
        min_rounds: int = 2 * len(FEATURES),
    ):
        if window < min_rounds or min_rounds < 1:
            raise ValueError(f"need window >= min_rounds >= 1, got window={window}, min_rounds={min_rounds}")
        self.shapes = shapes
        self.records = records
        self.min_rounds = min_rounds
        self._samples: collections.deque[tuple[Features, float]] = collections.deque(maxlen=window)
        self._seen = -1  # index of the last record read
        self._line: LinearRoundCost | None = LinearRoundCost.constant()
        load_solver()

    def _read(self) -> None:
        fresh = []
        for rec in reversed(self.records):
            if rec.index <= self._seen:
                break
            fresh.append(rec)
        for rec in reversed(fresh):
            self._samples.append((record_features(rec), record_seconds(rec)))
            self._seen = rec.index
        if fresh:
            self._line = None

    def line(self) -> LinearRoundCost:
        """The line in use now: the prior, or the fit to the rounds read so far."""
        self._read()
        if self._line is None:
            n = len(self._samples)
            if n < self.min_rounds:
                self._line = LinearRoundCost.constant(sum(s for _, s in self._samples) / n, n)
            else:
                self._line = LinearRoundCost.fit(list(self._samples))
        return self._line

    def __call__(self, rows: Sequence[RowPlan]) -> float:
        if not rows:
            return 0.0
        line = self.line()
        plan = RoundPlan(rows=tuple(rows), num_decode=sum(1 for r in rows if r.is_decode), stats=RoundStats())
        variant, _ = variant_for(plan, self.shapes)
        return line.predict(plan_features(rows, variant.num_tokens, variant.num_rows))
