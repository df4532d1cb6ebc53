"""``bench/driver.drive`` on a virtual clock: it always terminates, even where the clock's floats
read a hair before an arrival after waiting for it exactly."""

from __future__ import annotations

import dataclasses
import math

import pytest

from radixflow_jax.bench.driver import drive
from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.engine.build import assemble_engine
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.roundcost import LinearRoundCost
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.sim.executor import SimExecutor, VirtualClock


def test_idle_waits_submit_the_head_on_a_far_clock() -> None:
    config = EngineConfig.from_options(max_num_seqs=4, max_num_batched_tokens=64, page_size=16)
    spec = EngineSpec(config=config, hybrid=True, chunk_sizes=(16,), num_pages=1 + 4 * math.ceil(512 / 16),
                      num_slots=64, max_model_len=512)  # fmt: skip
    clock = VirtualClock()
    clock.now = 1e12 + 0.1  # a float step of 1.2e-4 s here: a wait shorter than half of it is lost

    def make(shapes: ShapeConfig) -> SimExecutor:
        return SimExecutor(LinearRoundCost((1e-3, 0.0, 0.0, 0.0, 0.0)), clock, shapes, overlap=False)

    engine = assemble_engine(spec, make, clock=clock)
    reqs = generate(WorkloadSpec("multiturn", 48, seed=1, arrival="sessions", rate=0.5, vocab=256, max_tokens=4))
    waits: list[float] = []

    def wait(seconds: float) -> None:
        waits.append(seconds)
        assert len(waits) < 10 * len(reqs), "the driver spins on an arrival its clock never reaches"
        clock.advance(seconds)

    outs = drive(engine, reqs, wait=wait)
    assert len(outs) == len(reqs) and all(o.finished for o in outs)
    assert waits and all(w >= 0.0 for w in waits)


def test_later_turns_arrive_a_think_time_after_the_answer() -> None:
    spec = WorkloadSpec("multiturn", 24, seed=3, arrival="all", vocab=256, max_tokens=2, think_time=5.0)
    reqs = generate(spec)
    thinks = [r.think_s for r in reqs if r.turn]
    assert all(r.think_s == 0.0 for r in reqs if not r.turn) and min(thinks) > 0 and 2.0 < sum(thinks) / len(thinks) < 9
    plain = generate(dataclasses.replace(spec, think_time=0.0))  # the same requests otherwise
    assert [dataclasses.replace(r, think_s=0.0) for r in reqs] == plain
    config = EngineConfig.from_options(max_num_seqs=4, max_num_batched_tokens=64, page_size=16)
    spec_e = EngineSpec(config=config, hybrid=True, chunk_sizes=(16,), num_pages=1 + 8 * math.ceil(512 / 16),
                        num_slots=64, max_model_len=512)  # fmt: skip
    clock = VirtualClock()
    engine = assemble_engine(spec_e, lambda shapes: SimExecutor(LinearRoundCost((1e-3, 0.0, 0.0, 0.0, 0.0)), clock,
                                                                  shapes), clock=clock)  # fmt: skip
    outs = drive(engine, reqs, wait=clock.advance)
    by_group: dict[int, list] = {}
    for r, o in zip(reqs, outs):
        by_group.setdefault(r.group, []).append((r.turn, r.think_s, o))
    for turns in by_group.values():
        turns.sort(key=lambda t: t[0])
        for (_, _, before), (_, think, after) in zip(turns, turns[1:]):
            assert after.arrival_time - before.finish_time == pytest.approx(think, abs=1e-6)
