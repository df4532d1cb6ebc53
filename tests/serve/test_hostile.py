"""Hostile clients against the app in-process (tiny-qwen3.5, one fixed-bucket step variant, httpx
over ASGI so requests really overlap): a flood of poison requests interleaved with normal ones
(every normal request completes with the output it has alone, every poison one gets a 4xx, the
engine stays up), siblings counted by the waiting bound, a stalled stream aborted, a reader that
never reads holding one snapshot, and the smaller promises of ``docs/serving.md`` ("Security")."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pytest

from radixflow_jax.engine.build import build_engine
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.replicas.background import BackgroundEngine
from radixflow_jax.serve.app import ServerConfig, ServerState, create_app
from radixflow_jax.serve.metrics import ServerMetrics
from tests.engine.workloads import SMALL_FIXED

MAX_N = 4
KEY = "hostile-key"
NORMAL = [{"prompt": f"the river {word} ran past the mill and", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
          for word in ("slowly", "quietly", "north", "again", "under", "over")]  # fmt: skip
CATASTROPHIC = "(a{1000}){1000}"  # llguidance's lexer gives up on it, or its first mask takes seconds


@pytest.fixture(scope="module")
def served(tiny_model):
    model = tiny_model("tiny-qwen3.5")
    core = build_engine(model, EngineConfig.from_options(**SMALL_FIXED, max_n=MAX_N))
    metrics = ServerMetrics("tiny", hybrid=True)
    engine = BackgroundEngine(core, observer=metrics.observe, trim_records=True)
    metrics.attach(engine)
    try:
        yield engine, model, metrics
    finally:
        engine.shutdown()


def _state(served: Any, **config: Any) -> ServerState:
    engine, model, metrics = served
    cfg = ServerConfig("tiny", **config)
    return ServerState(engine=engine, tokenizer=model.tokenizer, metrics=metrics, config=cfg,
                       max_model_len=engine.core.max_model_len, vocab_size=model.config.vocab_size)  # fmt: skip


def _client(state: ServerState, **kwargs: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(state), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test", timeout=300, **kwargs)


def _poison() -> list[tuple[str, str | None, Any]]:
    """``(path, param the 400 names or None, body)``; a str body is sent as raw bytes."""
    chat = {"messages": [{"role": "user", "content": "call something"}], "max_tokens": 4}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    tools = [{**tool, "function": {**tool["function"], "name": f"f{i}"}} for i in range(3000)]
    big_schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(4000)}}
    deep = '{"prompt": "a", "guided_json": ' + "[" * 5000 + "]" * 5000 + "}"
    base = {"prompt": "a", "max_tokens": 4}
    return [
        ("/v1/completions", "n", {**base, "n": 10**6}),
        ("/v1/completions", "best_of", {**base, "n": 2, "best_of": 10**9}),
        ("/v1/completions", None, deep),
        ("/v1/completions", None, "[" * 200_000),
        ("/v1/chat/completions", "tools", {**chat, "tools": tools}),
        ("/v1/completions", "stop", {**base, "stop": ["x"] * 5000}),
        ("/v1/completions", "stop", {**base, "stop": ["y" * 5000]}),
        ("/v1/completions", "stop_token_ids", {**base, "stop_token_ids": [1] * 10_000}),
        ("/v1/completions", "guided_choice", {**base, "guided_choice": [f"c{i}" for i in range(5000)]}),
        ("/v1/completions", "guided_json", {**base, "guided_json": big_schema}),
        ("/v1/chat/completions", "response_format",
         {**chat, "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": big_schema}}}),
        ("/v1/completions", "guided_regex", {**base, "guided_regex": "a" * 100_000}),
        ("/v1/completions", "guided_regex", {**base, "guided_regex": CATASTROPHIC}),
        ("/v1/chat/completions", "response_format", {**chat, "response_format": {"type": "json_schema", "json_schema": {
            "name": "s", "schema": {"type": "string", "pattern": f"^{CATASTROPHIC}$"}}}}),
        ("/v1/completions", "logit_bias", {**base, "logit_bias": {str(10**12): 1}}),
    ]  # fmt: skip


async def _send(c: httpx.AsyncClient, path: str, body: Any) -> httpx.Response:
    if isinstance(body, str):
        return await c.post(path, content=body.encode(), headers={"content-type": "application/json"})
    return await c.post(path, json=body)


def test_flood_of_poison_beside_normal_requests(served) -> None:
    engine = served[0]
    state = _state(served, max_waiting=64)

    async def run() -> tuple[list[httpx.Response], list[httpx.Response], list[httpx.Response]]:
        async with _client(state) as c:
            alone = [await _send(c, "/v1/completions", b) for b in NORMAL]
            poison = _poison()
            jobs: list[Any] = []
            for i in range(max(len(poison), len(NORMAL))):
                if i < len(poison):
                    jobs.append(_send(c, poison[i][0], poison[i][2]))
                if i < len(NORMAL):
                    jobs.append(_send(c, "/v1/completions", NORMAL[i]))
            together = await asyncio.gather(*jobs)
            return alone, together, [await c.get("/health")]

    alone, together, health = asyncio.run(run())
    want = [r.json()["choices"][0]["text"] for r in alone]
    assert all(r.status_code == 200 for r in alone)
    poison = _poison()
    got_normal: list[str] = []
    k = 0
    for i in range(max(len(poison), len(NORMAL))):
        if i < len(poison):
            resp, (path, param, _) = together[k], poison[i]
            k += 1
            assert 400 <= resp.status_code < 500, (path, param, resp.status_code, resp.text[:300])
            err = resp.json()["error"]
            assert param is None or err["param"] == param, (param, err)
        if i < len(NORMAL):
            assert together[k].status_code == 200, together[k].text[:300]
            got_normal.append(together[k].json()["choices"][0]["text"])
            k += 1
    assert got_normal == want
    assert health[0].status_code == 200 and engine.is_running and engine.error is None


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"top_k": 10**10}, "top_k"),
        ({"stop_token_ids": [10**10]}, "stop_token_ids"),
        ({"stop_token_ids": [300_000]}, "stop_token_ids"),  # fits int32, beyond the vocabulary (intake)
        ({"logit_bias": {"300000": 1.0}}, "logit_bias"),
    ],
)
def test_out_of_range_step_inputs_answer_400(served, extra, param) -> None:
    async def run() -> httpx.Response:
        async with _client(_state(served)) as c:
            return await c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, **extra})

    resp = asyncio.run(run())
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param
    assert served[0].is_running


def test_siblings_count_toward_the_waiting_bound(served) -> None:
    async def run() -> list[httpx.Response]:
        async with _client(_state(served, max_waiting=3)) as c:
            big = await c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, "n": 4})
            small = await c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, "n": 2})
            return [big, small]

    big, small = asyncio.run(run())
    assert big.status_code == 429 and big.headers["retry-after"] == "1"
    err = big.json()["error"]
    assert err["code"] == "queue_full" and "adds 4" in err["message"] and "--max-waiting" in err["message"]
    assert small.status_code == 200 and len(small.json()["choices"]) == 2


def test_stalled_stream_is_aborted(served) -> None:
    """A client that never takes the stream's bytes: the send blocks, the stream times out and
    the request is aborted (its pages and slots freed), while the engine goes on."""
    engine = served[0]
    app = create_app(_state(served, stream_timeout_s=0.5))
    body = json.dumps({"prompt": "a stalled reader", "max_tokens": 400, "ignore_eos": True, "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("test", 80)}  # fmt: skip
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client never hangs up
        return {}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and len(sent) >= 3:
            await asyncio.Event().wait()  # the socket is full: this send never completes

    asyncio.run(asyncio.wait_for(app(scope, receive, send), 60))  # TimeoutError if the stall were never noticed
    assert sent[0]["status"] == 200
    deadline = time.monotonic() + 60
    while engine.num_running + engine.num_waiting:
        assert time.monotonic() < deadline, "the stalled request was never aborted"
        time.sleep(0.05)
    assert engine.submit([5, 6, 7], SamplingParams(max_tokens=2)).result(timeout=120).finished


def test_a_handle_never_read_holds_one_snapshot(served) -> None:
    engine = served[0]
    handle = engine.submit([9, 8, 7, 6], SamplingParams(max_tokens=12, ignore_eos=True))
    deadline = time.monotonic() + 120
    while engine.num_running + engine.num_waiting:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    events = list(handle.stream(timeout=30))
    assert len(events) == 1 and events[0].finished and len(events[0].token_ids) == 12


def test_health_notices_a_hung_step(served) -> None:
    engine = served[0]

    async def health() -> httpx.Response:
        async with _client(_state(served, step_stall_s=5.0)) as c:
            return await c.get("/health")

    engine._step_started = time.monotonic() - 10  # as if a step had been running for 10 s
    try:
        hung = asyncio.run(health())
    finally:
        engine._step_started = None
    assert hung.status_code == 503 and hung.json()["error"]["code"] == "engine_stalled"
    assert asyncio.run(health()).status_code == 200


def test_admin_and_privacy_switches(served, monkeypatch) -> None:
    engine = served[0]
    private = _state(served, api_key=KEY, private_cache_stats=True)

    async def run() -> dict[str, httpx.Response]:
        out = {}
        async with _client(_state(served)) as c:
            out["reset"] = await c.post("/reset_prefix_cache")
            out["usage"] = await c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 2})
            with monkeypatch.context() as m:
                m.setattr(engine, "submit_group", _raise_secret)
                out["crash"] = await c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 2})
        async with _client(private, headers={"Authorization": f"Bearer {KEY}"}) as c:
            out["private_usage"] = await c.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 2})
            out["metrics_with_key"] = await c.get("/metrics")
        async with _client(private) as c:
            out["metrics_without_key"] = await c.get("/metrics")
            out["health_without_key"] = await c.get("/health")
        return out

    out = asyncio.run(run())
    assert out["reset"].status_code == 403 and "--enable-reset-prefix-cache" in out["reset"].json()["error"]["message"]
    assert out["usage"].json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0
    crash = out["crash"].json()["error"]
    assert out["crash"].status_code == 500 and "secret" not in crash["message"] and "error id err-" in crash["message"]
    private_usage = out["private_usage"].json()["usage"]
    assert out["private_usage"].status_code == 200 and private_usage["prompt_tokens_details"] is None
    assert out["metrics_with_key"].status_code == 200 and out["metrics_without_key"].status_code == 401
    assert out["health_without_key"].status_code == 200


def _raise_secret(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("secret internal detail")


class _GatedTokenizer:
    """The model's tokenizer whose ``encode`` waits for a gate (a slow tokenisation, held open)."""

    def __init__(self, inner: Any):
        self.inner, self.entered, self.gate = inner, threading.Event(), threading.Event()

    def encode(self, text: str) -> list[int]:
        self.entered.set()
        assert self.gate.wait(60)
        return self.inner.encode(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_preparation_runs_off_the_event_loop(served) -> None:
    """While one request's tokenisation is held, /health and other routes answer."""
    engine, model, metrics = served
    tok = _GatedTokenizer(model.tokenizer)
    state = ServerState(
        engine=engine,
        tokenizer=tok,
        metrics=metrics,
        config=ServerConfig("tiny"),
        max_model_len=engine.core.max_model_len,
        vocab_size=model.config.vocab_size,
    )

    async def run() -> tuple[int, int]:
        async with _client(state) as c:
            slow = asyncio.ensure_future(c.post("/v1/completions", json={"prompt": "held " * 100, "max_tokens": 1}))
            while not tok.entered.is_set():
                await asyncio.sleep(0.01)
            health = await asyncio.wait_for(c.get("/health"), 30)
            assert not slow.done()  # still tokenising
            tok.gate.set()
            return health.status_code, (await slow).status_code

    assert asyncio.run(run()) == (200, 200)


def test_compiled_grammars_are_shared_by_text(tiny_model) -> None:
    from radixflow_jax.engine.grammar import GrammarCompiler, StructuredOutputsParams

    model = tiny_model("tiny-qwen3.5")
    compiler = GrammarCompiler(model.tokenizer, model.config.vocab_size, [0])
    spec = StructuredOutputsParams(choice=("yes", "no"))
    first, second = compiler.open(spec), compiler.open(StructuredOutputsParams(choice=("yes", "no"), field="other"))
    assert compiler.cached == 1 and first is not second
    first.advance([model.tokenizer.encode("yes")[0]])
    assert second.consumed == 0 and not second.failed  # each request its own matcher
    compiler.open(StructuredOutputsParams(regex="[0-9]+"))
    assert compiler.cached == 2


def test_a_grammar_compiles_once_for_preparation_and_engine(served) -> None:
    """The preparation worker's trial compiles into the engine's own cache (``EngineCore.grammars``),
    so the engine thread reuses it; a grammar too complex to try answers 400 ``grammar_too_complex``."""
    state = _state(served)
    core = served[0].core
    assert state.grammars is core.grammars is not None
    before = core.grammars.cached
    body = {"prompt": "a", "max_tokens": 3, "guided_choice": ["alpha-once", "beta-once"]}

    async def run() -> tuple[httpx.Response, httpx.Response]:
        async with _client(state) as c:
            ok = await c.post("/v1/completions", json=body)
            bad = await c.post("/v1/completions", json={"prompt": "a", "max_tokens": 3, "guided_regex": CATASTROPHIC})
            return ok, bad

    ok, bad = asyncio.run(run())
    assert ok.status_code == 200, ok.text
    assert core.grammars.cached == before + 1  # one compile: the trial's, reused by the engine thread
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "guided_regex", bad.text
