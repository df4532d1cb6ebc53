"""Data-parallel replicas behind the server (``radixflow serve --dp M``), in-process on the simulated
executor (no model, no compile): requests sharing a prefix land on the replica that holds it and hit
its cache; outputs equal one engine's; gauges and ``/reset_prefix_cache`` cover every replica; one
replica's death turns the server to 503."""

from __future__ import annotations

import functools
import re

import pytest
from fastapi.testclient import TestClient

from radixflow_jax.sim.engines import build_sim_engine
from radixflow_jax.replicas.background import BackgroundEngine, EngineDeadError
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.replicas.replicated import ReplicatedEngine
from radixflow_jax.replicas.router import RouterConfig
from radixflow_jax.sim.specs import get_device_spec, get_model_spec
from radixflow_jax.serve.app import ServerConfig, ServerState, create_app
from radixflow_jax.serve.metrics import ServerMetrics

EC = EngineConfig.from_options(max_num_seqs=4, max_num_batched_tokens=128, max_model_len=512)


def make_state(replicas: int, router: str = "prefix") -> ServerState:
    metrics = ServerMetrics("sim", hybrid=True)
    engines = [
        BackgroundEngine(
            build_sim_engine(get_model_spec("qwen3.5-4b"), get_device_spec("h200"), EC),
            observer=functools.partial(metrics.observe, replica=i), trim_records=True,
        )  # fmt: skip
        for i in range(replicas)
    ]
    router_config = RouterConfig(policy=router, block=EC.scheduler.page_size)
    engine = engines[0] if replicas == 1 else ReplicatedEngine(engines, router_config)
    metrics.attach(engine)
    return ServerState(
        engine=engine, tokenizer=None, metrics=metrics, config=ServerConfig("sim", allow_cache_reset=True),
        max_model_len=512, vocab_size=None,
    )


def prompts() -> list[list[int]]:
    """Two 64-token articles, three questions each, one article after the other."""
    articles = [[10 + i % 50 for i in range(64)], [200 + i % 40 for i in range(64)]]
    return [articles[k // 3] + [900 + k, 901 + k] for k in range(6)]


def run(state: ServerState) -> list[dict]:
    with TestClient(create_app(state)) as c:
        out = []
        for p in prompts():  # one at a time: the first of an article commits before its siblings come
            r = c.post("/v1/completions", json={"prompt": p, "max_tokens": 4, "ignore_eos": True})
            assert r.status_code == 200, r.text
            out.append(r.json())
        metrics = c.get("/metrics").text
        reset = c.post("/reset_prefix_cache").json()
    return out + [{"metrics": metrics, "reset": reset}]


def gauge(text: str, name: str) -> float:
    m = re.search(rf"^radixflow:{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_replicas_route_by_prefix_and_equal_one_engine():
    one, two = make_state(1), make_state(2)
    try:
        base = run(one)
        got = run(two)
    finally:
        one.engine.shutdown()
        two.engine.shutdown()
    router = two.engine.router
    assert router.routed == [3, 3]  # each article's questions on one replica
    assert router.prefix_hits == 4  # every question after an article's first followed its prefix
    for a, b in zip(base[:-1], got[:-1]):
        assert a["choices"][0]["text"] == b["choices"][0]["text"]
        assert a["usage"] == b["usage"]  # the same cache hits: siblings met their article's replica
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in got[:-1]]
    assert cached[0] == cached[3] == 0 and all(cached[k] > 0 for k in (1, 2, 4, 5))
    m1, m2 = base[-1]["metrics"], got[-1]["metrics"]
    assert gauge(m2, "kv_pages_total") == 2 * gauge(m1, "kv_pages_total")
    assert gauge(m2, "state_slots_total") == 2 * gauge(m1, "state_slots_total")
    assert gauge(m2, "num_requests_running") == 0 and gauge(m2, "engine_alive") == 1.0
    reset1, reset2 = base[-1]["reset"], got[-1]["reset"]
    assert reset2["kv_pages_free"] == reset2["kv_pages_total"] == 2 * reset1["kv_pages_total"]
    assert reset2["state_slots_free"] == reset2["state_slots_total"]


def test_round_robin_spreads_an_article():
    state = make_state(2, router="round-robin")
    try:
        got = run(state)
    finally:
        state.engine.shutdown()
    assert state.engine.router.routed == [3, 3]
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in got[:-1]]
    assert cached[1] == 0 < cached[2]  # question 1 went to the other (cold) replica, question 2 back to the first


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the engine thread re-raises
def test_one_dead_replica_gives_503():
    state = make_state(2)
    a, b = state.engine.replicas
    try:
        with TestClient(create_app(state)) as c:
            assert c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}).status_code == 200

            def boom() -> list:
                raise RuntimeError("device lost")

            b.core.step = boom  # type: ignore[method-assign]
            with pytest.raises(EngineDeadError):
                b.submit([5, 6, 7], SamplingParams(max_tokens=2)).result(timeout=30)
            health = c.get("/health")
            assert health.status_code == 503 and "device lost" in health.json()["error"]["message"]
            dead = c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
            assert dead.status_code == 503 and dead.json()["error"]["code"] == "engine_dead"
            assert gauge(c.get("/metrics").text, "engine_alive") == 0.0
            assert a.is_running  # the other replica was not touched
    finally:
        state.engine.shutdown()


def test_n_samples_stay_on_one_replica_and_share_its_prompt():
    state = make_state(2, router="round-robin")
    prompt = [10 + i % 50 for i in range(129)]  # 2 grid steps + 1: a sibling computes one prompt token
    try:
        with TestClient(create_app(state)) as c:
            r = c.post("/v1/completions", json={"prompt": prompt, "n": 3, "max_tokens": 2, "ignore_eos": True})
            assert r.status_code == 200, r.text
            body = r.json()
            assert [ch["index"] for ch in body["choices"]] == [0, 1, 2]
            assert body["usage"]["prompt_tokens"] == 129 and body["usage"]["completion_tokens"] == 6
        rounds = sorted(r.core.num_rounds for r in state.replicas)
        assert rounds[0] == 0 and rounds[1] > 0  # every sibling ran on one replica
    finally:
        state.engine.shutdown()
