"""Simulated engines: a :class:`ModelSpec` on a :class:`DeviceSpec` (pools from the device memory,
round time from a cost model, a virtual clock), and the simulated mirror of a model engine. Both are
assembled by ``engine/build.py`` like every engine, so they decide as the model engine would."""

from __future__ import annotations

import dataclasses
from typing import Any

from radixflow_jax.engine.build import assemble_engine, device_pools, host_tier_sizes
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.engine.roundcost import LinearRoundCost
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.sim.executor import RooflineCost, SimExecutor, VirtualClock
from radixflow_jax.sim.hostlink import HostLink, HostLinkTimeline
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
    needs it). A host tier only when ``ec`` asks for one (:func:`sim_host_tier`), its copies over
    the device's host link (``sim/hostlink.py``)."""
    sc = ec.scheduler
    if sc.speculative is not None and not acceptance:
        raise ValueError("a simulated engine with speculative decoding needs the drafts' acceptance per position")
    pages, slots = device_pools(spec, device, sc.page_size)
    if ec.num_kv_pages is not None:
        pages = ec.num_kv_pages
    if ec.num_state_slots is not None:
        slots = ec.num_state_slots
    page_bytes = spec.page_bytes(sc.page_size)
    num_host, num_host_pages = sim_host_tier(spec, device, ec, pages=pages, slots=slots, page_bytes=page_bytes)
    engine_spec = EngineSpec(
        config=ec,
        hybrid=spec.is_hybrid,
        chunk_sizes=tuple(spec.chunk_sizes),
        num_pages=pages,
        num_slots=slots,
        num_host_slots=num_host,
        num_host_pages=num_host_pages,
        state_bytes=spec.state_bytes,
        page_bytes=page_bytes,
        max_model_len=ec.max_model_len or 32768,
    )
    clock = VirtualClock()
    cost = RooflineCost(spec, device, overhead_s=overhead_s)
    link = (
        HostLink(device.host_link_bandwidth, device.host_link_latency_s, spec.state_bytes, page_bytes=page_bytes)
        if num_host or num_host_pages
        else None
    )

    def executor(shapes: Any) -> SimExecutor:
        host = HostLinkTimeline(link) if link is not None else None
        return SimExecutor(cost, clock, shapes, noise=noise, seed=ec.seed, acceptance=acceptance, host=host)

    return assemble_engine(engine_spec, executor, clock=clock)


def sim_host_tier(
    spec: ModelSpec, device: DeviceSpec, ec: EngineConfig, *, pages: int, slots: int, page_bytes: int
) -> tuple[int, int]:
    """The simulated host tier's ``(checkpoints, KV pages)`` (``engine/build.host_tier_sizes``, split
    like the device pools of ``pages`` and ``slots``), none by default: a simulated host has no RAM
    to take an eighth of. ``ValueError`` for a tier on a device whose host link is not published
    (``sim/specs.py``)."""
    sizes = host_tier_sizes(
        slot_bytes=spec.state_bytes, page_bytes=page_bytes, device_state_bytes=slots * spec.state_bytes,
        device_kv_bytes=pages * page_bytes, ec=ec, default_gb=0.0,
    )
    if any(sizes) and device.host_link_bandwidth is None:
        raise ValueError(f"host_cache_gb: device {device.name!r} has no published host link to simulate a host tier on")
    return sizes


def calibrate(engine: EngineCore) -> LinearRoundCost:
    """A cost model fitted to the measured rounds (plan + build + step) of a model-executor run."""
    return LinearRoundCost.from_records(engine.records, with_plan=True)


def mirror_sim_engine(engine: EngineCore, cost: Any) -> EngineCore:
    """A simulated engine built from ``engine``'s spec (same configuration, pools, step shapes and
    overlap mode, so the same decisions), with ``cost`` as its round time; without the model's
    tokenizer and EOS ids (simulated samples are a fixed id). Its host tier's copies cost nothing
    beyond ``cost``: a line fitted to measured rounds holds their restores already."""
    clock = VirtualClock()
    spec = dataclasses.replace(engine.spec, eos_token_ids=(), tokenizer=None, vocab_size=None)
    tiered = spec.num_host_slots or spec.num_host_pages
    free = HostLink(bandwidth=float("inf"), latency_s=0.0, state_bytes=1, page_bytes=1) if tiered else None

    def executor(shapes: Any) -> SimExecutor:
        host = HostLinkTimeline(free) if free is not None else None
        return SimExecutor(cost, clock, shapes, overlap=engine.overlap, host=host)

    return assemble_engine(spec, executor, clock=clock)
