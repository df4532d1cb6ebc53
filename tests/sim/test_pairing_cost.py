"""The extra scan of a round with paired consumers, per backend (sim/pairing_cost.py)."""

from __future__ import annotations

import dataclasses

import pytest

from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan, pairing_spans
from radixflow_jax.sim.executor import RooflineCost
from radixflow_jax.sim.pairing_cost import pairing_pass_s
from radixflow_jax.sim.specs import get_device_spec, get_model_spec


def _paired(depth: int, producer_len: int = 2048, consumers: int = 1) -> RoundPlan:
    """A producer emitting a checkpoint at ``depth`` into slot 99 and ``consumers`` rows paired with it."""
    producer = RowPlan(
        request_id=0,
        tokens=(1,) * producer_len,
        start=0,
        pages=(),
        slot=1,
        copy_from=None,
        emits=((depth, 99),),
        sample=True,
    )
    paired = tuple(
        RowPlan(
            request_id=1 + i,
            tokens=(1,) * 64,
            start=depth,
            pages=(),
            slot=2 + i,
            copy_from=None,
            emits=(),
            sample=True,
            pair_slot=99,
        )
        for i in range(consumers)
    )
    return RoundPlan((producer, *paired), 0, RoundStats())


def test_unpaired_round_costs_nothing_extra() -> None:
    plan = dataclasses.replace(_paired(1024), rows=_paired(1024).rows[:1])
    assert pairing_spans(plan.rows) == {}
    assert pairing_pass_s(plan, 2048, get_model_spec("qwen3.5-9b"), get_device_spec("h200")) == 0.0


def test_gpu_pre_pass_grows_with_depth_not_with_partners() -> None:
    m, gpu = get_model_spec("qwen3.5-9b"), get_device_spec("h200")
    shallow, deep = (pairing_pass_s(_paired(d), 4096, m, gpu) for d in (256, 2048))
    assert pairing_spans(_paired(2048, consumers=3).rows) == {0: 2048}
    assert 0 < shallow < deep  # the producer's serial chunk chain up to the deepest pairing chunk
    assert pairing_pass_s(_paired(2048, consumers=3), 4096, m, gpu) == deep  # once per producer
    # at least one more kernel per recurrent layer, whatever the depth
    assert shallow >= m.gdn * gpu.kernel_launch_s
    # the serial chain: depth / chunk chunks, each a program's work on one SM
    no_launch = dataclasses.replace(gpu, kernel_launch_s=0.0)
    assert pairing_pass_s(_paired(2048), 4096, m, no_launch) == pytest.approx(deep - m.gdn * gpu.kernel_launch_s)


def test_tpu_second_scan_follows_the_call_not_the_depth() -> None:
    m, tpu = get_model_spec("qwen3.5-9b"), get_device_spec("tpu-v6e")
    shallow, deep = (pairing_pass_s(_paired(d), 4096, m, tpu) for d in (256, 2048))
    assert shallow == deep > 0  # the whole call runs again
    assert pairing_pass_s(_paired(256), 8192, m, tpu) > shallow  # over every token slot of the variant
    steps = m.gdn * m.gdn_v_heads * 4096 // m.gdn_chunk
    assert deep >= steps * tpu.grid_step_s


def test_roofline_adds_the_pass_to_paired_rounds() -> None:
    m = get_model_spec("qwen3.5-9b")
    for device in ("h200", "tpu-v6e"):
        dev = get_device_spec(device)
        cost = RooflineCost(m, dev)
        plan = _paired(1024)
        unpaired = RoundPlan(tuple(dataclasses.replace(r, pair_slot=None) for r in plan.rows), 0, RoundStats())
        extra = cost.round_time(plan, 4096, 2) - cost.round_time(unpaired, 4096, 2)
        assert extra == pytest.approx(pairing_pass_s(plan, 4096, m, dev))
