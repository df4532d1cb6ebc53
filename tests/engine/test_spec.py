"""The engine spec derives the model's facts once (no JAX, no model): the cache geometry, the step
shapes under the scheduler's names, the scheduler config completed with the model; one default
policy; one switch for the prefix cache; the round timer's host times."""

from __future__ import annotations

import pytest

from radixflow_jax.cache.config import PAGE_SIZE, CacheConfig
from radixflow_jax.engine.config import EngineConfig, ServingClock
from radixflow_jax.engine.protocol import StepResult
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.engine.timing import RoundTimer
from radixflow_jax.scheduler.config import SchedulerConfig


def _spec(hybrid: bool, **options: object) -> EngineSpec:
    return EngineSpec(
        config=EngineConfig.from_options(**options),
        hybrid=hybrid,
        chunk_sizes=(64,) if hybrid else (),
        num_pages=100,
        num_slots=20,
        max_model_len=1000,
    )


def test_the_spec_derives_geometry_shapes_and_scheduler_config_once() -> None:
    spec = _spec(True, page_size=48, max_num_seqs=8, max_num_batched_tokens=512, bucket_mode="pow2")
    assert spec.cache_config == CacheConfig(page_size=48, grid=192, hybrid=True)
    shapes = spec.shapes()
    assert (shapes.max_num_seqs, shapes.max_num_batched_tokens, shapes.grid) == (8, 512, 192)
    assert shapes.max_pages_per_row == 21 and shapes.mode == "pow2"
    sched = spec.scheduler()
    assert (sched.grid, sched.hybrid, sched.page_size) == (192, True, 48)
    assert sched.cache_config == spec.cache_config
    flat = _spec(False).cache_config
    assert flat == CacheConfig(page_size=PAGE_SIZE, grid=PAGE_SIZE, hybrid=False)


def test_mixed_layout_auto_packs_only_where_the_executor_prices_rows_by_token() -> None:
    """``mixed_layout="auto"`` is packed exactly where the spec says a one-token row costs one token
    in the prefill region (``packed_rows_free``: the native CPU kernels); explicit values win."""
    import dataclasses

    base = _spec(True)
    assert base.config.mixed_layout == "auto" and base.shapes().mixed_layout == "window"
    native = dataclasses.replace(base, packed_rows_free=True)
    assert native.shapes().mixed_layout == "packed"
    for layout in ("window", "packed"):
        forced = dataclasses.replace(native, config=EngineConfig.from_options(mixed_layout=layout))
        assert forced.shapes().mixed_layout == layout
    with pytest.raises(ValueError, match="mixed_layout='flat'"):
        EngineConfig.from_options(mixed_layout="flat")


def test_one_default_policy_and_one_prefix_cache_switch() -> None:
    assert SchedulerConfig().policy == EngineConfig().scheduler.policy == "pair"
    assert EngineConfig.from_options(policy="no-cache").scheduler.policy == "no-cache"
    with pytest.raises(TypeError, match="enable_prefix_cache.*policy='no-cache'"):
        EngineConfig.from_options(enable_prefix_cache=False)
    with pytest.raises(ValueError, match="grid 0"):
        SchedulerConfig().cache_config  # no model yet: no geometry


def test_round_timer_takes_compiles_off_the_clock_once() -> None:
    clock = ServingClock(lambda: 100.0)
    timer = RoundTimer(clock)
    timer.start()
    times = timer.launched(0.01, 2.0, overlapped=True)  # a launch that compiled while a round ran
    assert clock() == 98.0 and times.host_s == 0.0 and times.overlapped
    result = StepResult(sampled={}, token_slots=8, row_slots=2, build_s=0.5, step_s=1.0, compile_s=2.0)
    assert timer.collected(times, result) == times  # taken off at the launch, not again
    assert clock() == 98.0
    sync = timer.executed(0.25, result)  # execute: launch and collect in one call
    assert clock() == 96.0 and sync.host_s == 0.75 and not sync.overlapped
