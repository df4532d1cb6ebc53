"""Simulated engines: a :class:`ModelSpec` on a :class:`DeviceSpec` (pools from the device memory,
round time from a cost model, a virtual clock), and the simulated mirror of a model engine. Both are
assembled by ``engine/build.py`` like every engine, so they decide as the model engine would."""

from __future__ import annotations

import dataclasses
from typing import Any

from radixflow_jax.engine.build import assemble_engine, device_pools
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.engine.roundcost import LinearRoundCost
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.sim.executor import RooflineCost, SimExecutor, VirtualClock
from radixflow_jax.sim.specs import DeviceSpec, ModelSpec


def build_sim_engine(
    spec: ModelSpec, device: DeviceSpec, ec: EngineConfig, *, overhead_s: float | None = None, noise: float = 0.0,
    acceptance: tuple[float, ...] = (),
) -> EngineCore:
    """A simulated engine for ``spec`` on ``device``: pools from the device memory (unless ``ec``
    sets them), rounds padded to the runner's variants of ``ec.bucket_mode`` (as the model engine),
    round time from :class:`RooflineCost` (``overhead_s`` overrides the device spec's per-round
    cost), with seeded relative ``noise`` (``SimExecutor``; seed ``ec.seed``); ``acceptance``: per
    drafted position, the probability a drafted token is accepted (speculative decoding, which
    needs it)."""
    sc = ec.scheduler
    if sc.speculative is not None and not acceptance:
        raise ValueError("a simulated engine with speculative decoding needs the drafts' acceptance per position")
    pages, slots = device_pools(spec, device, sc.page_size)
    if ec.num_kv_pages is not None:
        pages = ec.num_kv_pages
    if ec.num_state_slots is not None:
        slots = ec.num_state_slots
    engine_spec = EngineSpec(
        config=ec,
        hybrid=spec.is_hybrid,
        chunk_sizes=tuple(spec.chunk_sizes),
        num_pages=pages,
        num_slots=slots,
        max_model_len=ec.max_model_len or 32768,
    )
    clock = VirtualClock()
    cost = RooflineCost(spec, device, overhead_s=overhead_s)
    return assemble_engine(
        engine_spec,
        lambda shapes: SimExecutor(cost, clock, shapes, noise=noise, seed=ec.seed, acceptance=acceptance),
        clock=clock,
    )


def calibrate(engine: EngineCore) -> LinearRoundCost:
    """A cost model fitted to the measured rounds (plan + build + step) of a model-executor run."""
    return LinearRoundCost.from_records(engine.records, with_plan=True)


def mirror_sim_engine(engine: EngineCore, cost: Any) -> EngineCore:
    """A simulated engine built from ``engine``'s spec (same configuration, pools, step shapes and
    overlap mode, so the same decisions), with ``cost`` as its round time; without the model's
    tokenizer and EOS ids (simulated samples are a fixed id)."""
    clock = VirtualClock()
    spec = dataclasses.replace(engine.spec, eos_token_ids=(), tokenizer=None, vocab_size=None)
    return assemble_engine(spec, lambda shapes: SimExecutor(cost, clock, shapes, overlap=engine.overlap), clock=clock)
