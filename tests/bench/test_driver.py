"""``bench/driver.drive`` on a virtual clock: it always terminates, even where the clock's floats
read a hair before an arrival after waiting for it exactly."""

from __future__ import annotations

import math

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
