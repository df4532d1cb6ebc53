"""The simulated executor: the engine loop and scheduler unchanged, the device step replaced by a
cost model of round time, on a virtual clock.

Cost models:
  * :class:`RooflineCost`: ``overhead + max(FLOPs / (peak * mfu), bytes / (bandwidth * mbu))`` for a
    :class:`ModelSpec` on a :class:`DeviceSpec`, costed the way the fixed-shape step runs a round
    (docs/design.md, "Executors and shapes"): the dense work (projections, MLPs, chunked scans, the LM head) over every
    *token slot* of the variant, so padding costs as much as a real token and a filled bubble is
    free; attention, KV reads and state traffic (read, write, copy-in, checkpoint emits) over the
    real rows only; weights read once per round; the fixed per-round cost from the device spec; a
    round with paired consumers (policy ``pair``) pays the recurrent work of each producer's span up to
    its deepest pairing depth once more (the GPU kernel's pre-pass; the weights are still read once);
  * :class:`CalibratedCost`: measured step times of the model executor per step variant, with a
    least-squares line over token and row slots for variants never measured.
Sampled tokens are a fixed id, so simulated requests end by ``max_tokens`` (run with ``ignore_eos``).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol, Sequence

from radixflow_jax.engine.protocol import DeferredRound, ExecutorCapabilities, StepResult
from radixflow_jax.sim.specs import DeviceSpec, ModelSpec
from radixflow_jax.runner.inputs import SamplingRow
from radixflow_jax.runner.shapes import ShapeConfig, powers_of_two
from radixflow_jax.runner.window import variant_for
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class CostModel(Protocol):
    def round_time(self, plan: RoundPlan, token_slots: int, row_slots: int) -> float: ...


def _pairing_tokens(plan: RoundPlan) -> int:
    """Token slots of recurrent work a round with paired rows (policy ``pair``) adds on the GPU
    Pallas kernel (``kernels/pallas/chunk_scan.py``): a pre-pass over each producer's span up to its
    deepest pairing depth, once per producer however many rows pair with it."""
    depth_of = {slot: (row.request_id, offset) for row in plan.rows for offset, slot in row.emits}
    deepest: dict[int, int] = {}
    for row in plan.rows:
        if row.pair_slot is not None and row.pair_slot in depth_of:
            producer, offset = depth_of[row.pair_slot]
            deepest[producer] = max(deepest.get(producer, 0), offset)
    return sum(deepest.values())


@dataclasses.dataclass(frozen=True)
class RooflineCost:
    """See the module docstring. ``overhead_s`` / ``mfu`` / ``mbu`` default to the device spec's."""

    model: ModelSpec
    device: DeviceSpec
    overhead_s: float | None = None
    mfu: float | None = None
    mbu: float | None = None

    def round_time(self, plan: RoundPlan, token_slots: int, row_slots: int) -> float:
        m, dev = self.model, self.device
        slots = max(token_slots, plan.num_tokens)
        flops = 2.0 * m.active_params * slots + m.recurrent_flops_per_token * slots
        flops += m.recurrent_flops_per_token * _pairing_tokens(plan)
        kv_read = 0.0
        state_io = 0
        for row in plan.rows:
            n, ctx = len(row.tokens), row.start + len(row.tokens)
            flops += 4.0 * m.attn * m.q_heads * m.head_dim * n * (row.start + (n + 1) / 2)
            kv_read += ctx * m.kv_bytes_per_token
            state_io += 2 + (2 if row.copy_from is not None else 0) + len(row.emits)
        expert_params = m.moe_layers * 3 * m.hidden * m.expert_inter * m.total_experts
        touched = min(1.0, slots * m.experts_active / m.total_experts) if m.total_experts else 0.0
        weights = (m.total_params - expert_params + touched * expert_params) * m.dtype_bytes
        bytes_moved = weights + kv_read + state_io * m.state_bytes
        compute = flops / (dev.peak_flops * (self.mfu if self.mfu is not None else dev.mfu))
        memory = bytes_moved / (dev.hbm_bandwidth * (self.mbu if self.mbu is not None else dev.mbu))
        overhead = self.overhead_s if self.overhead_s is not None else dev.round_overhead_s
        return overhead + max(compute, memory)


BUCKET_SETS = ("pow2", "finer", "fixed")


@dataclasses.dataclass(frozen=True)
class BucketSet:
    """The step shapes a simulated round is padded to, from configuration (not from the runner's
    current set): ``pow2`` (token and row buckets are powers of two, as ``runner/shapes.py``),
    ``finer`` (powers of two and the midpoints 1.5 * 2^k for tokens), ``fixed`` (one shape,
    ``max_tokens`` x ``max_rows``, for every round). Decode-only rounds use ``(n, n)`` for a row
    bucket ``n`` except in ``fixed`` mode."""

    kind: str
    max_tokens: int
    max_rows: int
    min_tokens: int = 16

    def __post_init__(self) -> None:
        if self.kind not in BUCKET_SETS:
            raise ValueError(f"unknown bucket set {self.kind!r}; choose one of {', '.join(BUCKET_SETS)}")

    @property
    def token_buckets(self) -> tuple[int, ...]:
        pow2 = powers_of_two(min(self.min_tokens, self.max_tokens), self.max_tokens)
        if self.kind == "fixed":
            return (self.max_tokens,)
        if self.kind == "finer":
            mids = tuple(3 * b // 2 for b in pow2 if b >= 16 and 3 * b // 2 < self.max_tokens)
            return tuple(sorted(set(pow2 + mids)))
        return pow2

    @property
    def row_buckets(self) -> tuple[int, ...]:
        return (self.max_rows,) if self.kind == "fixed" else powers_of_two(1, self.max_rows)

    def select(self, num_tokens: int, num_rows: int, all_decode: bool) -> tuple[int, int]:
        """``(token_slots, row_slots)`` of the smallest shape holding the round."""
        if num_rows > self.max_rows or num_tokens > self.max_tokens:
            raise ValueError(f"round of {num_tokens} tokens / {num_rows} rows exceeds the budgets")
        rows = next(r for r in self.row_buckets if r >= num_rows)
        if all_decode and self.kind != "fixed":
            return rows, rows
        return next(t for t in self.token_buckets if t >= max(num_tokens, rows)), rows


class SimExecutor:
    """Advances ``clock`` by the cost model's round time; pads like the model executor would: to
    ``buckets`` (a :class:`BucketSet`), or to the runner's ``ShapeConfig`` variants, or not at all.
    Capabilities: its cost model as the round cost (:meth:`plan_cost`) and, when built with
    ``overlap``, overlap; no logprobs, no penalties."""

    def __init__(
        self, cost: CostModel, clock: VirtualClock, shapes: ShapeConfig | BucketSet | None = None, token: int = 1,
        *, overlap: bool = False,
    ):  # fmt: skip
        self.cost = cost
        self.clock = clock
        self.shapes = shapes
        self.token = token
        # overlap=True: the engine plans round r+1 before round r commits, as with the model executor
        # (the mirror of an overlapped model engine); the clock still charges the rounds one after
        # the other and no host time. Default False: the synchronous engine.
        self.capabilities = ExecutorCapabilities(overlap=overlap, round_cost=self.plan_cost)

    def launch(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow], prev: object = None) -> DeferredRound:
        return DeferredRound(plan, sampling)

    def collect(self, handle: DeferredRound) -> StepResult:
        return self.execute(handle.plan, handle.sampling)

    def plan_cost(self, rows: Sequence[RowPlan]) -> float:
        """Seconds a round of ``rows`` would take (padded as :meth:`execute` pads): the round cost
        the scheduler's ``pair`` fill rule asks for."""
        num_decode = sum(1 for r in rows if r.is_decode)
        return self._time(RoundPlan(rows=tuple(rows), num_decode=num_decode, stats=RoundStats()))[0]

    def _time(self, plan: RoundPlan) -> tuple[float, int, int]:
        all_decode = plan.num_decode == len(plan.rows)
        if isinstance(self.shapes, BucketSet):
            token_slots, row_slots = self.shapes.select(plan.num_tokens, len(plan.rows), all_decode)
        elif self.shapes is not None:
            # the runner's variants: the same decode region the model executor selects
            variant, _ = variant_for(plan, self.shapes)
            token_slots, row_slots = variant.num_tokens, variant.num_rows
        else:
            token_slots, row_slots = plan.num_tokens, len(plan.rows)
        return self.cost.round_time(plan, token_slots, row_slots), token_slots, row_slots

    def execute(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow]) -> StepResult:
        seconds, token_slots, row_slots = self._time(plan)
        self.clock.advance(seconds)
        sampled = {row.request_id: self.token for row in plan.rows if row.sample}
        return StepResult(sampled, token_slots, row_slots, 0.0, seconds)

    def reset(self) -> None:
        """Nothing to rebuild: the simulated executor holds no device buffers."""

    def lose_device_state(self) -> None:
        """Nothing to lose (fault injection): the simulated executor holds no device state."""
