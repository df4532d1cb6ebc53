"""Speculative decoding on ``/metrics`` (in-process server on the simulated executor, whose drafts
are accepted with a given probability per position): drafted and accepted tokens, and per drafted
position the verify rows that drafted a token there and those accepted through it."""

from __future__ import annotations

from fastapi.testclient import TestClient

from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.replicas.background import BackgroundEngine
from radixflow_jax.scheduler.drafts import position_counts
from radixflow_jax.serve.app import ServerConfig, ServerState, create_app
from radixflow_jax.serve.metrics import ServerMetrics
from radixflow_jax.sim.engines import build_sim_engine
from radixflow_jax.sim.specs import get_device_spec, get_model_spec
from tests.serve.test_host_metrics import _value


def test_position_counts() -> None:
    rows = [((5, 6, 7), (5, 6, 9)), ((5,), (4,)), ((1, 2), (1, 2))]
    assert position_counts(rows) == ((3, 2, 1), (2, 2, 0))
    assert position_counts([]) == ((), ())


def test_acceptance_per_position_on_metrics() -> None:
    metrics = ServerMetrics("sim", hybrid=True)
    ec = EngineConfig.from_options(max_num_seqs=2, max_num_batched_tokens=256, max_model_len=512, speculative="ngram")
    core = build_sim_engine(get_model_spec("qwen3.5-4b"), get_device_spec("h200"), ec, acceptance=(1.0, 0.0))
    engine = BackgroundEngine(core, observer=metrics.observe, trim_records=True)
    metrics.attach(engine)
    state = ServerState(engine=engine, tokenizer=None, metrics=metrics, config=ServerConfig("sim"), max_model_len=512,
                        vocab_size=None)  # fmt: skip
    try:
        with TestClient(create_app(state)) as c:
            for s in range(3):  # the simulator samples token 1: "1 1" recurs, so n-gram drafts follow
                r = c.post("/v1/completions", json={"prompt": [10 + s] * 8, "max_tokens": 24, "ignore_eos": True})
                assert r.status_code == 200, r.text
            text = c.get("/metrics").text
    finally:
        engine.shutdown()
    first, second = (_value(text, "spec_draft_positions_total", f'position="{j}"') for j in (1, 2))
    assert first > 0 and second > 0
    assert _value(text, "spec_accepted_positions_total", 'position="1"') == first  # always accepted there
    assert _value(text, "spec_accepted_positions_total", 'position="2"') == 0  # never there
    assert _value(text, "spec_accepted_tokens_total") == first
    assert _value(text, "spec_draft_tokens_total") >= first + second


def test_draft_model_state_on_metrics(tiny_model) -> None:
    """With a draft model, ``spec_draft_model_active`` is 1 while it drafts and 0 once it stopped
    (``engine/drafter.py``: three failures in a row)."""
    from radixflow_jax.engine.build import build_engine

    ec = EngineConfig.from_options(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=256,
                                   speculative={"method": "draft", "draft_model": "tiny-qwen3.5"})  # fmt: skip
    core = build_engine(tiny_model("tiny-qwen3.5"), ec)
    metrics = ServerMetrics("tiny", hybrid=True)
    engine = BackgroundEngine(core, observer=metrics.observe, trim_records=True)
    metrics.attach(engine)
    try:
        assert _value(metrics.render().decode(), "spec_draft_model_active") == 1.0
        core.scheduler.drafter.disabled = "RuntimeError: down"
        assert _value(metrics.render().decode(), "spec_draft_model_active") == 0.0
    finally:
        engine.shutdown()
