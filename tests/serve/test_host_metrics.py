"""The host tier on ``/metrics`` (in-process server on the simulated executor): conversations that
come back after others pushed their checkpoints out of a small state pool (and their pages out of a
small page pool) are restored; the spill and restore counters, the bytes each way (checkpoints
times one checkpoint's bytes, pages times one page's) and the host pool gauges say so."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.replicas.background import BackgroundEngine
from radixflow_jax.serve.app import ServerConfig, ServerState, create_app
from radixflow_jax.serve.metrics import ServerMetrics
from radixflow_jax.sim.engines import build_sim_engine
from radixflow_jax.sim.specs import get_device_spec, get_model_spec

EC = EngineConfig.from_options(max_num_seqs=2, max_num_batched_tokens=256, max_model_len=512, num_state_slots=5,
                               num_host_slots=16)  # fmt: skip


def _value(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^radixflow:{name}\{{[^}}]*{labels}[^}}]*\}} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def _serve_conversations(ec: EngineConfig):
    """Six conversations of two turns, one request at a time; returns the engine core and /metrics."""
    metrics = ServerMetrics("sim", hybrid=True)
    core = build_sim_engine(get_model_spec("qwen3.5-4b"), get_device_spec("h200"), ec)
    engine = BackgroundEngine(core, observer=metrics.observe, trim_records=True)
    metrics.attach(engine)
    state = ServerState(engine=engine, tokenizer=None, metrics=metrics, config=ServerConfig("sim"), max_model_len=512,
                        vocab_size=None)  # fmt: skip
    first = [[10 + s] + [20 + (7 * s + i) % 400 for i in range(127)] for s in range(6)]
    try:
        with TestClient(create_app(state)) as c:
            for turn in range(2):
                for s, prompt in enumerate(first):  # the simulator samples token 1: the answer is known
                    body = {"prompt": prompt + [1] * 4 * turn + [5] * turn, "max_tokens": 4, "ignore_eos": True}
                    r = c.post("/v1/completions", json=body)
                    assert r.status_code == 200, r.text
                    if turn:
                        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 128, s
            text = c.get("/metrics").text
    finally:
        engine.shutdown()
    return core, text


def test_spills_restores_and_bytes_on_metrics() -> None:
    core, text = _serve_conversations(EC)
    spills, restores = _value(text, "host_spills_total"), _value(text, "host_restores_total")
    assert spills >= 4 and restores >= 4  # six conversations' ends, two checkpoint slots
    state_bytes = core.spec.state_bytes
    assert state_bytes == get_model_spec("qwen3.5-4b").state_bytes
    assert _value(text, "host_transfer_bytes_total", 'direction="device_to_host"') == spills * state_bytes
    assert _value(text, "host_transfer_bytes_total", 'direction="host_to_device"') == restores * state_bytes
    assert _value(text, "host_hits_total") >= 4
    assert _value(text, "host_restore_waits_total") == 0  # one request at a time: each read its host copy at once
    assert _value(text, "host_restore_wait_seconds_total") == 0
    assert _value(text, "host_slots_total") == 16
    assert 0 <= _value(text, "host_slots_free") < 16
    assert _value(text, "host_pages_total") == 0 and _value(text, "host_kv_spills_total") == 0


def test_kv_pages_on_metrics() -> None:
    """A page pool that holds about two of the six conversations: their pages go to the host tier
    and come back; the bytes each way count pages too."""
    ec = EngineConfig.from_options(max_num_seqs=2, max_num_batched_tokens=256, max_model_len=512, num_state_slots=5,
                                   num_host_slots=16, num_kv_pages=40, num_host_pages=64)  # fmt: skip
    core, text = _serve_conversations(ec)
    spills, restores = _value(text, "host_spills_total"), _value(text, "host_restores_total")
    kv_spills, kv_restores = _value(text, "host_kv_spills_total"), _value(text, "host_kv_restores_total")
    assert kv_spills > 0 and kv_restores > 0 and restores >= 4
    state, page = core.spec.state_bytes, core.spec.page_bytes
    assert page == get_model_spec("qwen3.5-4b").kv_bytes_per_token * 16
    assert _value(text, "host_transfer_bytes_total", 'direction="device_to_host"') == spills * state + kv_spills * page
    assert _value(text, "host_transfer_bytes_total", 'direction="host_to_device"') == restores * state + kv_restores * page
    assert _value(text, "host_pages_total") == 64 and 0 <= _value(text, "host_pages_free") < 64


def test_restore_wait_seconds_count_each_waiting_request_for_its_round() -> None:
    """``host_restore_wait_seconds``: a round of 0.5 s (plan + build + step) in which two requests
    waited for their restores adds 1 s; one with none adds nothing."""
    from radixflow_jax.engine.config import RoundRecord

    metrics = ServerMetrics("m", hybrid=True)
    zero = dict(index=0, num_tokens=8, num_rows=1, token_slots=8, row_slots=1, padding_tokens=0, bubble_tokens=0,
                bubble_rows=0, admitted=1, consumers_blocked=0, consumers_waiting=2, preempted=0,
                checkpoints_planted=0, checkpoints_skipped=0, checkpoints_evicted_unused=0)  # fmt: skip
    waited = RoundRecord(**zero, plan_s=0.1, build_s=0.1, step_s=0.3, restore_waits=2)
    plain = RoundRecord(**zero, plan_s=0.2, build_s=0.2, step_s=0.6)
    metrics.observe([], [waited, plain])
    text = metrics.render().decode()
    assert _value(text, "host_restore_wait_seconds_total") == pytest.approx(1.0)
    assert _value(text, "host_restore_waits_total") == 2
