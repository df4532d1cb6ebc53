"""Policy pair's two parts under their fixed names, on the simulated executor: ``pair-nofill``
pairs and never declines a fill, ``radixflow-fill`` declines fills and never pairs, ``pair`` does
both; every policy that uses a round cost judges by the estimator fitted to the engine's own rounds."""

from __future__ import annotations

import pytest

from radixflow_jax.bench.driver import drive
from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.roundcost import FittedRoundCost
from radixflow_jax.sim.engines import build_sim_engine
from radixflow_jax.sim.specs import get_device_spec, get_model_spec

ENGINE = EngineConfig.from_options(max_num_seqs=64, max_num_batched_tokens=8192)


@pytest.fixture(scope="module")
def runs() -> dict:
    reqs = generate(WorkloadSpec("race", num_requests=400, arrival="sessions", rate=30.0, seed=0))
    out = {}
    for policy in ("radixflow", "radixflow-fill", "pair-nofill", "pair"):
        engine = build_sim_engine(get_model_spec("qwen3.5-9b"), get_device_spec("h200"), ENGINE.with_options(policy=policy))
        outputs = drive(engine, reqs, wait=engine.clock.advance)
        out[policy] = (engine, outputs)
    return out


def _total(engine, field: str) -> int:
    return sum(getattr(r, field) for r in engine.records)


def test_parts_do_what_their_names_say(runs) -> None:
    flow, fill, nofill, pair = (runs[p][0] for p in ("radixflow", "radixflow-fill", "pair-nofill", "pair"))
    assert flow.scheduler.round_cost is None  # radixflow never consults a round cost
    assert _total(fill, "consumers_paired") == 0 and _total(fill, "fill_declined") > 0
    assert _total(nofill, "consumers_paired") > 0 and _total(nofill, "fill_declined") == 0
    assert _total(pair, "consumers_paired") > 0
    for engine in (fill, nofill, pair):
        cost = engine.scheduler.round_cost
        assert isinstance(cost, FittedRoundCost) and cost.records is engine.records
        assert cost.line().rounds == min(len(engine.records), 256)  # fitted to the simulated rounds


def test_every_part_completes_everything_with_the_same_outputs(runs) -> None:
    ref = sorted((o.request_id, o.token_ids) for o in runs["radixflow"][1])
    for policy, (engine, outputs) in runs.items():
        assert sorted((o.request_id, o.token_ids) for o in outputs) == ref, policy
