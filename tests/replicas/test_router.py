"""Data-parallel router: requests sharing a prefix land on the replica holding it (from its cache,
or from what was routed there), the least-loaded fallback engages under imbalance, and simulated
replicas keep reuse above round-robin's with balanced request counts. No JAX (simulated executors)."""

from __future__ import annotations

import pytest

from radixflow_jax.bench.cluster import drive_cluster, run_cluster
from radixflow_jax.bench.run import BenchConfig
from radixflow_jax.sim.engines import build_sim_engine
from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.replicas.router import ReplicaSet, Router, RouterConfig, state_ready_prefix
from radixflow_jax.sim.specs import get_device_spec, get_model_spec
from tests.engine.workloads import SMALL_FIXED

SPEC, DEVICE = get_model_spec("qwen3.5-9b"), get_device_spec("h200")
EC = EngineConfig.from_options(max_num_seqs=32, max_num_batched_tokens=4096)
ARTICLE = tuple(range(3, 403))


def engines(n: int) -> list:
    return [build_sim_engine(SPEC, DEVICE, EC) for _ in range(n)]


def test_prefix_follows_the_cache_holding_it() -> None:
    replicas = ReplicaSet(engines(4))
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    first, _ = replicas.add_request(ARTICLE + (7, 8, 9), params)
    while replicas.has_unfinished():
        replicas.step()
    assert state_ready_prefix(replicas.engines[first], ARTICLE + (11, 12)) >= 384  # checkpointed in its tree
    assert all(state_ready_prefix(e, ARTICLE + (11, 12)) == 0 for i, e in enumerate(replicas.engines) if i != first)
    fresh = Router(4)  # a router that never saw the first prompt: the cache alone decides
    ready = [state_ready_prefix(e, ARTICLE + (11, 12)) for e in replicas.engines]
    assert fresh.choose(ARTICLE + (11, 12), [0, 0, 0, 0], ready) == first
    other, _ = replicas.add_request((499,) * 50, params)  # no prefix anywhere: least loaded, not `first`
    assert other != first


def test_prefix_follows_prompts_still_queued() -> None:
    router = Router(4)
    a = router.choose(ARTICLE + (1,), [0, 0, 0, 0], [0, 0, 0, 0])
    loads = [0, 0, 0, 0]
    loads[a] = 1
    assert router.choose(ARTICLE + (2,), loads, [0, 0, 0, 0]) == a  # same article, still waiting there
    assert router.prefix_hits == 1 and router.fallbacks == 0
    assert router.choose((9,) * 40, loads, [0, 0, 0, 0]) != a  # unrelated: least loaded


def test_fallback_under_imbalance() -> None:
    router = Router(4, RouterConfig(imbalance=1.5, slack=2))
    a = router.choose(ARTICLE, [0, 0, 0, 0], [0, 0, 0, 0])
    loads = [0, 0, 0, 0]
    loads[a] = 3  # 3 <= 1.5 * 0.75 + 2: stays
    assert router.choose(ARTICLE + (5,), loads, [0, 0, 0, 0]) == a
    loads[a] = 10  # 10 > 1.5 * 2.5 + 2: the least-loaded replica instead
    b = router.choose(ARTICLE + (6,), loads, [0, 0, 0, 0])
    assert b != a and loads[b] == 0 and router.fallbacks == 1


def test_round_robin_and_bad_config() -> None:
    router = Router(3, RouterConfig(policy="round-robin"))
    assert [router.choose(ARTICLE, [5, 0, 0], [400, 0, 0]) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    with pytest.raises(ValueError, match="unknown router"):
        RouterConfig(policy="random")
    with pytest.raises(ValueError, match="loads"):
        Router(2).choose(ARTICLE, [0], [0])


def test_simulated_replicas_prefix_beats_round_robin() -> None:
    reqs = generate(WorkloadSpec("race", num_requests=96, arrival="sessions", rate=4.0, session_window=0.2))
    cfg = BenchConfig(policies=("radixflow",), engine=EC)
    prefix = run_cluster(SPEC, DEVICE, reqs, cfg, "radixflow", 4, RouterConfig(policy="prefix"))
    rr = run_cluster(SPEC, DEVICE, reqs, cfg, "radixflow", 4, RouterConfig(policy="round-robin"))
    assert prefix.overall.completed == rr.overall.completed == len(reqs)
    assert sum(prefix.requests) == len(reqs)
    assert prefix.overall.reuse > rr.overall.reuse + 0.3
    assert max(prefix.requests) <= 2 * len(reqs) / 4


def test_cluster_refuses_multiturn() -> None:
    reqs = generate(WorkloadSpec("multiturn", num_requests=8))
    with pytest.raises(ValueError, match="single-turn"):
        drive_cluster(ReplicaSet(engines(2)), reqs)


def test_bench_cli_replicas(tmp_path, capsys) -> None:
    import json

    from radixflow_jax import cli

    out = str(tmp_path / "c.json")
    rc = cli.main(["bench", "--model", "qwen3.5-9b", "--executor", "sim", "--replicas", "3", "--router", "prefix",
                   "--arrival", "sessions", "--num-requests", "40", "--policies", "radixflow", "--json", out,
                   "--no-progress"])  # fmt: skip
    assert rc == 0
    assert "radixflow/prefix" in capsys.readouterr().out
    data = json.load(open(out))
    assert data["config"]["replicas"] == 3 and sum(data["clusters"][0]["requests"]) == 40
    assert cli.main(["bench", "--model", "tiny-qwen3.5", "--replicas", "2"]) != 0
    assert "--executor sim" in capsys.readouterr().err


def test_llm_data_parallel_replicas_match_one_engine(tiny_model) -> None:
    from radixflow_jax.llm import LLM

    article = list(range(3, 70))
    prompts = [article + [100 + i, 200 + i] for i in range(3)] + [[300 + i for i in range(20)]]
    params = SamplingParams(max_tokens=3)
    # the fixed-bucket step shape of tests/engine/test_engine.py: its one variant comes from the XLA cache
    opts = SMALL_FIXED
    one = LLM(tiny_model("tiny-qwen3.5"), **opts)
    two = LLM(one.model, data_parallel_size=2, **opts)
    assert [o.token_ids for o in two.generate(prompts, params)] == [o.token_ids for o in one.generate(prompts, params)]
    assert two.replicas.router.routed == [3, 1] or two.replicas.router.routed == [1, 3]  # the article stays together
    with pytest.raises(ValueError, match="data_parallel_size"):
        LLM(one.model, data_parallel_size=2, tensor_parallel_size=2)
