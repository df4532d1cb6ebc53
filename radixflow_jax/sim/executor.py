"""The simulated executor: the engine loop and scheduler unchanged, the device step replaced by a
cost model of round time, on a virtual clock.

Cost models:
  * :class:`RooflineCost`: ``overhead + max(FLOPs / (peak * mfu), bytes / (bandwidth * mbu))`` for a
    :class:`ModelSpec` on a :class:`DeviceSpec`, costed the way the fixed-shape step runs a round
    (docs/design.md, "Executors and shapes"): the dense work (projections, MLPs, chunked scans, the LM head) over every
    *token slot* of the variant, so padding costs as much as a real token and a filled bubble is
    free; attention, KV reads and state traffic (read, write, copy-in, checkpoint emits) over the
    real rows only; weights read once per round; the fixed per-round cost from the device spec; a
    round with paired consumers (policy ``pair``) adds its extra scan as each backend runs it
    (``sim/pairing_cost.py``: the GPU kernels' pre-pass, the TPU kernels' second call);
  * :class:`~radixflow_jax.engine.roundcost.LinearRoundCost`: a line fitted to the measured rounds
    of a model executor (``sim/engines.calibrate``).
Rounds are padded to the runner's step variants (``ShapeConfig``, the engine's ``bucket_mode``:
``fine`` by default, as the model executor), so the simulator and the engine share one source of
step shapes. The policies never see the cost model: they judge by the round-cost estimator fitted
to the rounds this executor reports (``engine/roundcost.py``), as on the model executor. ``noise``
(a relative standard deviation, seeded) makes the reported and charged round times vary like a
measured executor's. Sampled tokens are a fixed id, so simulated requests end by ``max_tokens``
(run with ``ignore_eos``).

The host tier's copies (``RoundPlan.state_moves``: spills and restores of checkpoints and of KV
pages) cost what the device's host link charges (``sim/hostlink.py``): spills overlap later rounds,
a restore holds its round's step back; a plan of restores only is their transfer time. An executor
built without a link refuses them, as the model executor without a host tier does.

Speculative decoding (``acceptance``, per drafted position): a verify row costs its tokens like
any row (every slot pays the dense work, the LM head included), and each drafted token is accepted
with the probability of its position given every earlier one was (seeded draws); a rejected
position's greedy token is another id. The n-gram drafter finds its suffix almost always in a
stream of one repeated id, so nearly every decode row drafts ``num_draft`` tokens, as an MTP head
or a draft model would.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Mapping, Protocol

from radixflow_jax.engine.protocol import DeferredRound, ExecutorCapabilities, StepResult
from radixflow_jax.sim.hostlink import HostLinkTimeline
from radixflow_jax.sim.pairing_cost import pairing_pass_s
from radixflow_jax.sim.specs import DeviceSpec, ModelSpec
from radixflow_jax.runner.inputs import SamplingRow
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.runner.window import variant_for
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
        kv_read = 0.0
        state_io = 0
        for row in plan.rows:
            if row.twin_id is not None:
                continue  # a rider computes nothing: it samples from its producer's logits
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
        return overhead + max(compute, memory) + pairing_pass_s(plan, token_slots, m, dev, self.mfu, self.mbu)


class SimExecutor:
    """Advances ``clock`` by the cost model's round time (times ``exp(N(0, noise))`` when ``noise``
    is set, from a generator seeded with ``seed``); pads like the model executor would: to the
    runner's ``ShapeConfig`` variants (``shapes``), or not at all (None); charges the host tier's
    copies on ``host`` (None: a plan that spills or restores is refused). Capabilities: overlap
    when built with ``overlap``; no logprobs, no penalties, no round cost (see the module doc)."""

    def __init__(
        self,
        cost: CostModel,
        clock: VirtualClock,
        shapes: ShapeConfig | None = None,
        token: int = 1,
        *,
        overlap: bool = False,
        noise: float = 0.0,
        seed: int = 0,
        acceptance: tuple[float, ...] = (),
        host: HostLinkTimeline | None = None,
    ):
        if noise < 0:
            raise ValueError(f"noise must be >= 0, got {noise}")
        if not all(0 <= a <= 1 for a in acceptance):
            raise ValueError(f"acceptance probabilities must lie in [0, 1], got {acceptance}")
        self.acceptance = tuple(acceptance)
        self.host = host
        self.cost = cost
        self.clock = clock
        self.shapes = shapes
        self.token = token
        self.noise = noise
        self._rng = random.Random(seed)
        # overlap=True: the engine plans round r+1 before round r commits, as with the model executor
        # (the mirror of an overlapped model engine); the clock still charges the rounds one after
        # the other and no host time. Default False: the synchronous engine.
        self.capabilities = ExecutorCapabilities(overlap=overlap, verify=bool(acceptance))

    def launch(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow], prev: object = None) -> DeferredRound:
        return DeferredRound(plan, sampling)

    def collect(self, handle: DeferredRound) -> StepResult:
        return self.execute(handle.plan, handle.sampling)

    def _time(self, plan: RoundPlan) -> tuple[float, int, int]:
        if self.shapes is not None:
            # the runner's variants: the same decode region the model executor selects
            variant, _ = variant_for(plan, self.shapes)
            token_slots, row_slots = variant.num_tokens, variant.num_rows
        else:
            token_slots, row_slots = plan.num_tokens, len(plan.rows)
        seconds = self.cost.round_time(plan, token_slots, row_slots)
        if self.noise:
            seconds *= math.exp(self._rng.gauss(0.0, self.noise))
        return seconds, token_slots, row_slots

    def execute(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow]) -> StepResult:
        delay = self._host_delay(plan)
        seconds, token_slots, row_slots = self._time(plan) if plan.rows else (0.0, 0, 0)
        seconds += delay
        self.clock.advance(seconds)
        sampled = {row.request_id: self.token for row in plan.rows if row.sample}
        verified = {row.request_id: self._verify(row.tokens[-row.num_draft :]) for row in plan.rows if row.num_draft}
        return StepResult(
            sampled=sampled, token_slots=token_slots, row_slots=row_slots, build_s=0.0, step_s=seconds, verified=verified
        )

    def _host_delay(self, plan: RoundPlan) -> float:
        if not any(m.kind != "copy" for m in plan.state_moves):
            return 0.0
        if self.host is None:
            kinds = ", ".join(sorted({m.kind for m in plan.state_moves} - {"copy"}))
            raise ValueError(f"a plan moves states or KV pages to or from the host tier ({kinds}), but this "
                             "simulated executor has no host link")  # fmt: skip
        return self.host.round_delay(plan.state_moves, self.clock.now)

    def _verify(self, draft: tuple[int, ...]) -> tuple[int, ...]:
        """The simulated greedy tokens after a draft's positions: each drafted token with the
        acceptance probability of its position (the last one given for later positions) while
        every earlier one was accepted, then another id."""
        out = []
        for i, token in enumerate(draft):
            if self._rng.random() >= self.acceptance[min(i, len(self.acceptance) - 1)]:
                other = self.token if token != self.token else self.token + 1
                return tuple(out) + (other,) * (len(draft) - i)
            out.append(token)
        return tuple(out)

    def reset(self) -> None:
        """Nothing to rebuild: the simulated executor holds no device buffers."""

    def lose_device_state(self) -> None:
        """Nothing to lose (fault injection): the simulated executor holds no device state."""
