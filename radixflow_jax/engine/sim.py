"""The simulated executor: the engine loop and scheduler unchanged, the device step replaced by a
cost model of round time, on a virtual clock.

Cost models:
  * :class:`RooflineCost`: ``overhead + max(FLOPs / (peak * mfu), bytes / (bandwidth * mbu))`` for a
    :class:`ModelSpec` on a :class:`DeviceSpec` (weights read once per round, KV read per row
    context, recurrent states read and written per row, checkpoints copied and emitted);
  * :class:`CalibratedCost`: measured step times of the model executor per step variant, with a
    least-squares line over token and row slots for variants never measured.
Sampled tokens are a fixed id, so simulated requests end by ``max_tokens`` (run with ``ignore_eos``).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol, Sequence

from radixflow_jax.engine.protocol import StepResult
from radixflow_jax.engine.specs import DeviceSpec, ModelSpec
from radixflow_jax.runner.inputs import SamplingRow
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.scheduler.plan import RoundPlan


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class CostModel(Protocol):
    def round_time(self, plan: RoundPlan, token_slots: int, row_slots: int) -> float: ...


@dataclasses.dataclass(frozen=True)
class RooflineCost:
    model: ModelSpec
    device: DeviceSpec
    mfu: float = 0.5
    mbu: float = 0.7
    overhead_s: float = 0.003

    def round_time(self, plan: RoundPlan, token_slots: int, row_slots: int) -> float:
        m = self.model
        tokens = plan.num_tokens
        flops = 2.0 * m.active_params * tokens + m.recurrent_flops_per_token * tokens
        kv_read = 0.0
        state_io = 0
        for row in plan.rows:
            n, ctx = len(row.tokens), row.start + len(row.tokens)
            flops += 4.0 * m.attn * m.q_heads * m.head_dim * n * (row.start + (n + 1) / 2)
            kv_read += ctx * m.kv_bytes_per_token
            state_io += 2 + (2 if row.copy_from is not None else 0) + len(row.emits)
        expert_params = m.moe_layers * 3 * m.hidden * m.expert_inter * m.total_experts
        touched = min(1.0, tokens * m.experts_active / m.total_experts) if m.total_experts else 0.0
        weights = (m.total_params - expert_params + touched * expert_params) * m.dtype_bytes
        bytes_moved = weights + kv_read + state_io * m.state_bytes
        compute = flops / (self.device.peak_flops * self.mfu)
        memory = bytes_moved / (self.device.hbm_bandwidth * self.mbu)
        return self.overhead_s + max(compute, memory)


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
        """From ``(token_slots, row_slots, seconds)`` measurements (e.g. ``EngineCore.records``)."""
        import numpy as np

        if not samples:
            raise ValueError("calibration needs at least one measured round")
        groups: dict[tuple[int, int], list[float]] = {}
        for t, r, s in samples:
            groups.setdefault((t, r), []).append(s)
        # the mean (not the median): totals over a run are what the simulator has to predict
        table = {k: float(np.mean(v)) for k, v in groups.items()}
        x = np.array([[1.0, t, r] for t, r in table]) if len(table) >= 3 else None
        if x is None:
            mean = float(np.mean(list(table.values())))
            return cls(table, mean, 0.0, 0.0)
        coef, *_ = np.linalg.lstsq(x, np.array(list(table.values())), rcond=None)
        return cls(table, float(coef[0]), float(coef[1]), float(coef[2]))


class SimExecutor:
    """Advances ``clock`` by the cost model's round time; pads like the model executor would."""

    def __init__(self, cost: CostModel, clock: VirtualClock, shapes: ShapeConfig | None = None, token: int = 1):
        self.cost = cost
        self.clock = clock
        self.shapes = shapes
        self.token = token

    def execute(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow]) -> StepResult:
        if self.shapes is not None:
            variant = self.shapes.select(plan.num_tokens, len(plan.rows), plan.num_decode == len(plan.rows))
            token_slots, row_slots = variant.num_tokens, variant.num_rows
        else:
            token_slots, row_slots = plan.num_tokens, len(plan.rows)
        seconds = self.cost.round_time(plan, token_slots, row_slots)
        self.clock.advance(seconds)
        sampled = {row.request_id: self.token for row in plan.rows if row.sample}
        return StepResult(sampled, token_slots, row_slots, 0.0, seconds)
