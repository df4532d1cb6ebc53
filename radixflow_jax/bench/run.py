"""Run one workload under several policies, side by side, in one process.

Model executor: the model is loaded once; each policy gets a fresh engine (fresh pools and cache)
whose step variants are compiled before its clock starts. Simulated executor: a :class:`ModelSpec`
on a :class:`DeviceSpec` with pools sized from the device memory.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from radixflow_jax.bench.driver import RunResult, drive, summarize
from radixflow_jax.bench.repeats import Repeated, relative_change, run_repeated  # noqa: F401 (relative_change: re-exported)
from radixflow_jax.bench.workloads import BenchRequest
from radixflow_jax.engine.config import EngineConfig, RoundRecord, ServingClock
from radixflow_jax.sim.engines import build_sim_engine
from radixflow_jax.sim.executor import VirtualClock
from radixflow_jax.sim.specs import DeviceSpec, ModelSpec


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """``overhead_s`` / ``sim_noise``: the simulated executor's per-round cost (``None``: the device
    spec's) and the relative noise of its round times (``SimExecutor``); ``spec_acceptance``: the
    simulated drafts' acceptance per position (speculative decoding on the simulator). Both
    executors pad to the engine's ``bucket_mode``."""

    policies: tuple[str, ...] = ("native", "radixflow", "pair")
    engine: EngineConfig = EngineConfig()
    overhead_s: float | None = None
    sim_noise: float = 0.0
    spec_acceptance: tuple[float, ...] = ()


Records = dict[str, list[RoundRecord]]


Runner = Callable[[str], tuple[RunResult, list[RoundRecord]]]


def model_runner(
    model: Any,
    requests: list[BenchRequest],
    cfg: BenchConfig,
    dtype: str = "float32",
    progress: Callable[[str, int, int], None] | None = None,
) -> Runner:
    """One policy on a fresh engine over one loaded model (a ``LoadedModel`` or a name). Every step
    variant an earlier run used (any policy) is primed on the fresh engine before its clock starts
    (executed once on padding, silently), so a run after a warm-up pass neither compiles nor primes
    on its clock, and keeps overlap across a variant's first use; ``compiles`` counts the step
    programs a run still compiled."""
    from radixflow_jax.engine.build import build_engine
    from radixflow_jax.models.api import load

    loaded = load(model, dtype=dtype) if isinstance(model, str) else model
    used: list[Any] = []  # the variants earlier runs ran, in first-use order

    def run(policy: str) -> tuple[RunResult, list[RoundRecord]]:
        engine = build_engine(loaded, cfg.engine.with_options(policy=policy))
        executor: Any = engine.executor
        if used:  # primed silently: a compile on first use inside the run is still reported
            shown, executor.progress = executor.progress, None
            executor.warmup(used, scorer=False)
            executor.progress = shown
        cb = (lambda done, total: progress(policy, done, total)) if progress else None
        known = len(loaded.compiled_variants)
        outputs = drive(engine, requests, progress=cb)
        result = summarize(policy, engine, outputs, len(requests))
        paused = engine.clock.paused_s if isinstance(engine.clock, ServingClock) else 0.0
        result = dataclasses.replace(result, compiles=len(loaded.compiled_variants) - known, paused_s=paused)
        used.extend(v for v in executor.shapes.variants() if executor.step.is_compiled(v) and v not in used)
        return result, engine.records

    return run


def sim_runner(
    spec: ModelSpec,
    device: DeviceSpec,
    requests: list[BenchRequest],
    cfg: BenchConfig,
    progress: Callable[[str, int, int], None] | None = None,
) -> Runner:
    """One policy on a fresh simulated engine (virtual clock: idle gaps are skipped)."""

    def run(policy: str) -> tuple[RunResult, list[RoundRecord]]:
        ec = cfg.engine.with_options(policy=policy)
        engine = build_sim_engine(
            spec, device, ec, overhead_s=cfg.overhead_s, noise=cfg.sim_noise, acceptance=cfg.spec_acceptance
        )
        clock = engine.clock  # the virtual clock the engine was wired with
        assert isinstance(clock, VirtualClock)
        cb = (lambda done, total: progress(policy, done, total)) if progress else None
        outputs = drive(engine, requests, wait=clock.advance, progress=cb)
        return summarize(policy, engine, outputs, len(requests)), engine.records

    return run


def run_policies(
    runner: Runner, cfg: BenchConfig, repeats: int = 1, warmup: int = 0
) -> tuple[list[Repeated], Records]:
    """Every policy of ``cfg`` ``warmup`` times untimed, then ``repeats`` times, interleaved (see
    ``bench/repeats.py``)."""
    return run_repeated(cfg.policies, repeats, runner, warmup)


def run_model(
    model: Any,
    requests: list[BenchRequest],
    cfg: BenchConfig,
    dtype: str = "float32",
    progress: Callable[[str, int, int], None] | None = None,
    with_records: bool = False,
    repeats: int = 1,
) -> Any:
    """Each policy ``repeats`` times (interleaved) on fresh engines over the same loaded model.
    Returns the per-policy medians, and with ``with_records`` also the per-round records per policy."""
    reps, records = run_policies(model_runner(model, requests, cfg, dtype, progress), cfg, repeats)
    results = [r.median for r in reps]
    return (results, records) if with_records else results


def run_sim(
    spec: ModelSpec,
    device: DeviceSpec,
    requests: list[BenchRequest],
    cfg: BenchConfig,
    progress: Callable[[str, int, int], None] | None = None,
    with_records: bool = False,
) -> Any:
    reps, records = run_policies(sim_runner(spec, device, requests, cfg, progress), cfg)
    results = [r.median for r in reps]
    return (results, records) if with_records else results


def timed(fn: Callable[[], list[RunResult]]) -> tuple[list[RunResult], float]:
    start = time.perf_counter()
    return fn(), time.perf_counter() - start
