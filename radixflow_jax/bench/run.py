"""Run one workload under several policies, side by side, in one process.

Model executor: the model is loaded once; each policy gets a fresh engine (fresh pools and cache)
whose step variants are compiled before its clock starts. Simulated executor: a :class:`ModelSpec`
on a :class:`DeviceSpec` with pools sized from the device memory.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable

from radixflow_jax.bench.driver import RunResult, drive, summarize
from radixflow_jax.bench.workloads import BenchRequest
from radixflow_jax.engine.core import EngineConfig, EngineCore, RoundRecord, model_grid
from radixflow_jax.engine.sim import RooflineCost, SimExecutor, VirtualClock
from radixflow_jax.engine.specs import DeviceSpec, ModelSpec
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.scheduler.scheduler import SchedulerConfig


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    policies: tuple[str, ...] = ("native", "radixflow")
    engine: EngineConfig = EngineConfig()


Records = dict[str, list[RoundRecord]]


def run_model(
    model: Any, requests: list[BenchRequest], cfg: BenchConfig, dtype: str = "float32",
    progress: Callable[[str, int, int], None] | None = None, with_records: bool = False,
) -> Any:  # fmt: skip
    """Each policy on a fresh engine over the same loaded model (a ``LoadedModel`` or a name).
    Returns the results, and with ``with_records`` also the per-round records per policy."""
    from radixflow_jax.engine.llm import build_engine
    from radixflow_jax.models.api import load

    if isinstance(model, str):
        model = load(model, dtype=dtype)
    results, records = [], {}
    for policy in cfg.policies:
        engine = build_engine(model, dataclasses.replace(cfg.engine, policy=policy))
        cb = (lambda done, total, p=policy: progress(p, done, total)) if progress else None
        outputs = drive(engine, requests, progress=cb)
        results.append(summarize(policy, engine, outputs, len(requests)))
        records[policy] = engine.records
    return (results, records) if with_records else results


def sim_pools(spec: ModelSpec, device: DeviceSpec, page_size: int, state_fraction: float = 0.3) -> tuple[int, int]:
    """``(num_kv_pages, num_state_slots)`` from the device memory left after the weights (90 % usable)."""
    free = 0.9 * device.memory_bytes - spec.total_params * spec.dtype_bytes
    if free <= 0:
        raise ValueError(f"{spec.name} ({spec.total_params / 1e9:.1f}B parameters) does not fit on {device.name}")
    slots = int(free * state_fraction // spec.state_bytes) if spec.is_hybrid else 1
    kv_bytes = free - (slots * spec.state_bytes if spec.is_hybrid else 0)
    pages = int(kv_bytes // (spec.kv_bytes_per_token * page_size))
    return pages, max(slots, 1)


def build_sim_engine(spec: ModelSpec, device: DeviceSpec, ec: EngineConfig) -> EngineCore:
    chunk = [64] if spec.gdn else ([128] if spec.mamba else [])
    grid = model_grid(chunk, ec.page_size)
    pages, slots = sim_pools(spec, device, ec.page_size)
    if ec.num_kv_pages is not None:
        pages = ec.num_kv_pages
    if ec.num_state_slots is not None:
        slots = ec.num_state_slots
    max_model_len = ec.max_model_len or 32768
    shapes = ShapeConfig(ec.max_num_batched_tokens, ec.max_num_seqs, math.ceil(max_model_len / ec.page_size), grid)
    clock = VirtualClock()
    executor = SimExecutor(RooflineCost(spec, device), clock, shapes)
    sched = SchedulerConfig(
        max_num_seqs=ec.max_num_seqs, max_num_batched_tokens=ec.max_num_batched_tokens, page_size=ec.page_size,
        grid=grid, hybrid=spec.is_hybrid, policy=ec.policy, queue_order=ec.queue_order,
        enable_prefix_cache=ec.enable_prefix_cache, max_consumer_wait=ec.max_consumer_wait,
        checkpoint_interval=ec.checkpoint_interval,
        max_checkpoints=ec.max_checkpoints,
    )  # fmt: skip
    return EngineCore(executor, sched, num_pages=pages, num_slots=slots, max_model_len=max_model_len, clock=clock)


def run_sim(
    spec: ModelSpec, device: DeviceSpec, requests: list[BenchRequest], cfg: BenchConfig,
    progress: Callable[[str, int, int], None] | None = None, with_records: bool = False,
) -> Any:  # fmt: skip
    results, records = [], {}
    for policy in cfg.policies:
        engine = build_sim_engine(spec, device, dataclasses.replace(cfg.engine, policy=policy))
        clock = engine.clock
        assert isinstance(clock, VirtualClock)
        cb = (lambda done, total, p=policy: progress(p, done, total)) if progress else None
        outputs = drive(engine, requests, wait=clock.advance, progress=cb)
        results.append(summarize(policy, engine, outputs, len(requests)))
        records[policy] = engine.records
    return (results, records) if with_records else results


def relative_change(base: RunResult, new: RunResult) -> dict[str, float]:
    """``(new - base) / base`` for the headline metrics (negative = fewer / faster)."""
    out = {}
    for key in ("rounds", "mean_latency_s", "p99_latency_s", "mean_ttft_s", "throughput_tok_s"):
        b, n = getattr(base, key), getattr(new, key)
        out[key] = (n - b) / b if b else 0.0
    out["reuse_points"] = 100.0 * (new.reuse - base.reuse)
    return out


def timed(fn: Callable[[], list[RunResult]]) -> tuple[list[RunResult], float]:
    start = time.perf_counter()
    return fn(), time.perf_counter() - start


def calibrate(engine: EngineCore) -> "CalibratedCost":
    """A cost model fitted to the measured rounds (plan + build + step) of a model-executor run."""
    from radixflow_jax.engine.sim import CalibratedCost

    return CalibratedCost.fit([(r.token_slots, r.row_slots, r.plan_s + r.build_s + r.step_s) for r in engine.records])


def mirror_sim_engine(engine: EngineCore, cost: Any) -> EngineCore:
    """A simulated engine making the same decisions as ``engine`` (same scheduler config, pools
    and step shapes), with ``cost`` as its round time."""
    sched = engine.scheduler
    clock = VirtualClock()
    shapes = getattr(engine.executor, "shapes", None)
    executor = SimExecutor(cost, clock, shapes)
    slots = sched.memory.slots.size if sched.memory.slots is not None else 1
    return EngineCore(
        executor, sched.config, num_pages=sched.memory.pages.size, num_slots=slots,
        max_model_len=engine.max_model_len, clock=clock,
    )  # fmt: skip
