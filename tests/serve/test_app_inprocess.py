"""The app in-process on the simulated executor (no model, no compile): engine death turns
``/health`` and new requests into 503; ``--memory-fraction`` sizing; the streamed-text holdback."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from radixflow_jax.engine.build import memory_pools
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.models.api import read_config, resolve_model_path
from radixflow_jax.models.batch import state_bytes_per_slot
from radixflow_jax.replicas.background import BackgroundEngine
from radixflow_jax.serve.app import ServerConfig, ServerState, create_app
from radixflow_jax.serve.metrics import ServerMetrics
from radixflow_jax.serve.streaming import TextStream
from radixflow_jax.sim.engines import build_sim_engine
from radixflow_jax.sim.specs import get_device_spec, get_model_spec


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the engine thread re-raises
def test_engine_death_gives_503():
    ec = EngineConfig.from_options(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512)
    core = build_sim_engine(get_model_spec("qwen3.5-4b"), get_device_spec("h200"), ec)
    metrics = ServerMetrics("sim", hybrid=True)
    engine = BackgroundEngine(core, observer=metrics.observe, trim_records=True)
    metrics.attach(engine)
    state = ServerState(
        engine=engine, tokenizer=None, metrics=metrics, config=ServerConfig("sim"),
        max_model_len=512, vocab_size=None,
    )
    try:
        with TestClient(create_app(state)) as c:
            ok = c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3, "ignore_eos": True})
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
            assert c.post("/v1/completions", json={"prompt": "text"}).json()["error"]["message"].endswith("send token ids")

            def boom() -> list:
                raise RuntimeError("device lost")

            core.step = boom  # type: ignore[method-assign]
            dead = c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3})
            assert dead.status_code == 503 and "device lost" in dead.json()["error"]["message"]
            health = c.get("/health")
            assert health.status_code == 503 and "device lost" in health.json()["error"]["message"]
            again = c.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
            assert again.status_code == 503 and again.json()["error"]["code"] == "engine_dead"
            assert "radixflow:engine_alive" in c.get("/metrics").text
    finally:
        engine.shutdown()


def test_memory_fraction_sizes_both_pools():
    cfg = read_config(resolve_model_path("tiny-qwen3.5"))
    ec = EngineConfig.from_options(max_num_seqs=4, max_num_batched_tokens=64)
    att = cfg.attention
    page_bytes = 2 * len(cfg.attention_layers) * ec.scheduler.page_size * att.num_kv_heads * att.head_dim * 4
    slot_bytes = state_bytes_per_slot(cfg, np.float32)
    total = 2**30
    pages, slots = memory_pools(cfg, np.float32, ec, 0.5, total, 400_000)
    assert slots - 1 == 4 + 64  # the fixed sizing's slots fit in half the budget
    used = (pages - 1) * page_bytes + (slots - 1) * slot_bytes
    budget = 0.5 * total - 400_000 - 64 * (cfg.hidden_size * 64 + cfg.vocab_size) * 4
    assert budget - page_bytes < used <= budget  # the rest went to KV pages
    small_pages, _ = memory_pools(cfg, np.float32, ec, 0.25, total, 400_000)
    assert small_pages < pages
    with pytest.raises(ValueError, match="leaves no room"):
        memory_pools(cfg, np.float32, ec, 0.0001, total, 400_000)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        memory_pools(cfg, np.float32, ec, 1.5, total, 400_000)


def test_text_stream_holds_back_stop_prefix_and_partial_utf8():
    s = TextStream(hold=2)
    assert s.delta("abc", False) == "a"
    assert s.delta("abcd\ufffd", False) == "bc"  # 'd' + U+FFFD held back
    assert s.delta("abcdé", True) == "dé"
    assert s.delta("abcdé", True) == ""


def test_background_observer_and_call():
    from radixflow_jax.engine.params import SamplingParams

    ec = EngineConfig.from_options(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512)
    core = build_sim_engine(get_model_spec("qwen3.5-4b"), get_device_spec("h200"), ec)
    seen: list = []

    def observer(events, records):
        seen.append((list(events), list(records)))
        if len(seen) == 2:
            raise RuntimeError("observer bug")  # logged; the engine keeps serving

    engine = BackgroundEngine(core, observer=observer, trim_records=True)
    try:
        outs = [engine.submit([1, 2, 3, 4], SamplingParams(max_tokens=3, ignore_eos=True)).result(30) for _ in range(2)]
        assert [len(o.token_ids) for o in outs] == [3, 3] and engine.is_running
        finals = [e for events, _ in seen for e in events if e.finished]
        assert len(finals) == 2 and sum(len(r) for _, r in seen) == core.num_rounds > 0
        assert core.records == []  # trimmed after each round
        assert engine.call(lambda c: c.scheduler.memory.pages.num_free).result(30) == core.scheduler.memory.pages.num_free
        with pytest.raises(ZeroDivisionError):
            engine.call(lambda c: 1 / 0).result(30)
        assert engine.is_running
    finally:
        engine.shutdown()
