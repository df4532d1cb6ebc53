"""The round cost of an executor without a cost model (the model executor), from measurement: what
policy ``pair``'s fill rule (``scheduler/pairing.Pairing.fill_pays``) asks for on the model executor.

:class:`MeasuredRoundCost` reads the engine's round records as they appear and keeps, per step
variant ``(token slots, row slots, decode slots)`` and per kind of round (with or without a paired
consumer: a paired round may cost more, e.g. the Pallas kernels' second call), the running median of the last ``window``
measured round times (``build_s + step_s``: compiling is not part of ``step_s``). A round of rows is
costed by the variant the runner selects for it (``ShapeConfig.select``, as the model executor does):
its median once measured, else a line through the measured medians (non-negative least squares over
token and row slots, :meth:`CalibratedCost.fit`). Until the first round is measured every cost is
0.0, so the fill rule admits every fill (the first round has no data to decide from).

No JAX here; it reads only records and shapes.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from typing import Mapping, Sequence

from radixflow_jax.engine.config import RoundRecord
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.runner.window import variant_for
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan

@dataclasses.dataclass(frozen=True)
class CalibratedCost:
    """Per-variant mean measured round times ``{(token_slots, row_slots): seconds}`` plus a line
    fitted over them for variants never measured."""

    table: Mapping[tuple[int, int], float]
    intercept: float
    per_token: float
    per_row: float

    def round_time(self, plan: RoundPlan, token_slots: int, row_slots: int) -> float:
        key = (token_slots, row_slots)
        if key in self.table:
            return self.table[key]
        return max(self.intercept + self.per_token * token_slots + self.per_row * row_slots, 0.0)

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, int, float]]) -> CalibratedCost:
        """From ``(token_slots, row_slots, seconds)`` measurements (e.g. ``EngineCore.records``). The
        line has non-negative terms (a term that fits negative is dropped and the rest refitted),
        so a variant never measured is never predicted cheaper than free."""
        import numpy as np

        if not samples:
            raise ValueError("calibration needs at least one measured round")
        groups: dict[tuple[int, int], list[float]] = {}
        for t, r, s in samples:
            groups.setdefault((t, r), []).append(s)
        # the mean (not the median): totals over a run are what the simulator has to predict
        table = {k: float(np.mean(v)) for k, v in groups.items()}
        y = np.array(list(table.values()))
        if len(table) < 3:
            return cls(table, float(np.mean(y)), 0.0, 0.0)
        x = np.array([[1.0, t, r] for t, r in table])
        keep = [0, 1, 2]
        coef = np.zeros(3)
        while keep:
            sol, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
            if (sol >= 0).all():
                coef[keep] = sol
                break
            keep = [k for k, c in zip(keep, sol) if c >= 0] if (sol >= 0).any() else []
        if not keep:
            return cls(table, float(np.mean(y)), 0.0, 0.0)
        return cls(table, float(coef[0]), float(coef[1]), float(coef[2]))


Key = tuple[int, int, int, bool]  # token slots, row slots, decode slots, paired


class MeasuredRoundCost:
    """``cost(rows)``: seconds a round of ``rows`` takes, from the medians of ``records`` (the
    engine's list, read incrementally by round index, so an owner trimming it loses nothing that
    was read)."""

    def __init__(self, shapes: ShapeConfig, records: Sequence[RoundRecord], window: int = 9):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.shapes = shapes
        self.records = records
        self.window = window
        self._times: dict[Key, collections.deque[float]] = {}
        self._seen = -1  # index of the last record read
        self._line: CalibratedCost | None = None

    def _read(self) -> None:
        fresh = []
        for rec in reversed(self.records):
            if rec.index <= self._seen:
                break
            fresh.append(rec)
        for rec in reversed(fresh):
            key = (rec.token_slots, rec.row_slots, rec.decode_slots, rec.consumers_paired > 0)
            self._times.setdefault(key, collections.deque(maxlen=self.window)).append(rec.build_s + rec.step_s)
            self._seen = rec.index
        if fresh:
            self._line = None

    def measured(self) -> dict[Key, float]:
        """The running median per measured key."""
        self._read()
        return {key: statistics.median(times) for key, times in self._times.items()}

    def key(self, rows: Sequence[RowPlan]) -> Key:
        plan = RoundPlan(rows=tuple(rows), num_decode=sum(1 for r in rows if r.is_decode), stats=RoundStats())
        v, _ = variant_for(plan, self.shapes)
        return v.num_tokens, v.num_rows, v.num_decode, any(r.pair_slot is not None for r in rows)

    def __call__(self, rows: Sequence[RowPlan]) -> float:
        if not rows:
            return 0.0
        medians = self.measured()
        if not medians:
            return 0.0
        key = self.key(rows)
        if key in medians:
            return medians[key]
        if self._line is None:
            self._line = CalibratedCost.fit([(t, r, s) for (t, r, _, _), s in medians.items()])
        t, r = key[0], key[1]
        return max(self._line.intercept + self._line.per_token * t + self._line.per_row * r, 0.0)
