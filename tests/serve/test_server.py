"""``radixflow serve`` end to end: one server subprocess (tiny-qwen3.5, 4 rows x 64 tokens, an API
key, ``--max-waiting 16``) shared by the module, driven with the official ``openai`` client and raw
``httpx`` for what the client refuses to send. The last test drains it with SIGTERM."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serve.server_proc import SMALL_ENGINE, start_test_server

KEY = "test-key-123"
MODEL = "tiny-qwen3.5"
MAX_WAITING = 8
MAX_BODY = 65536
ARTICLE = [(37 * j + 11) % 400 + 30 for j in range(200)]  # a shared "article" prefix (token ids)


@pytest.fixture(scope="module")
def server():
    args = [*SMALL_ENGINE, "--max-waiting", str(MAX_WAITING), "--max-body-bytes", str(MAX_BODY)]
    args.append("--enable-reset-prefix-cache")
    proc = start_test_server(args, api_key=KEY)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as c:
        yield c


def metrics(http: httpx.Client) -> dict[str, float]:
    """Samples by name (labels other than model_name folded into the name)."""
    out = {}
    for fam in text_string_to_metric_families(http.get("/metrics").text):
        for s in fam.samples:
            extra = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("model_name", "le"))
            if "le" not in s.labels:
                out[s.name + (f"{{{extra}}}" if extra else "")] = s.value
    return out


def wait_idle(http: httpx.Client, timeout: float = 120.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(http)
        if m["radixflow:num_requests_running"] == 0 and m["radixflow:num_requests_waiting"] == 0:
            return m
        assert time.monotonic() < deadline, f"requests still open: {m}"
        time.sleep(0.2)


def assert_pools_full(http: httpx.Client) -> None:
    """After every request ended: a prefix-cache reset gives every page and slot back."""
    wait_idle(http)
    r = http.post("/reset_prefix_cache")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["kv_pages_free"] == body["kv_pages_total"] > 0
    assert body["state_slots_free"] == body["state_slots_total"] > 0
    m = metrics(http)
    assert m["radixflow:kv_pages_free"] == m["radixflow:kv_pages_total"]
    assert m["radixflow:state_slots_free"] == m["radixflow:state_slots_total"]
    assert m["radixflow:kv_cache_usage_perc"] == 0 and m["radixflow:state_slot_usage_perc"] == 0


# ---------------------------------------------------------------------------------- happy paths
def test_models_and_health(server, client, http):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other-model")
    assert httpx.get(server.url + "/health").json() == {"status": "ok", "phase": "lazy"}  # open without a key


def test_completion_greedy_cached_rerun_is_identical(client):
    prompt = ARTICLE[:150]
    cold = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    warm = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert cold.usage.prompt_tokens == 150 and cold.usage.completion_tokens == 6
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.usage.prompt_tokens_details.cached_tokens > 0
    assert warm.choices[0].text == cold.choices[0].text and cold.choices[0].finish_reason == "length"


def test_shared_prefix_reports_cached_tokens(client):
    first = client.completions.create(model=MODEL, prompt=ARTICLE + [5, 6, 7], max_tokens=2, temperature=0)
    second = client.completions.create(model=MODEL, prompt=ARTICLE + [9, 8], max_tokens=2, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 128 <= cached <= len(ARTICLE)  # an earlier test's exact prompt end (150) may be the deepest
    assert cached >= first.usage.prompt_tokens_details.cached_tokens


def test_chat_stream_matches_non_stream(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, seed=1)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_completion_stream_text_and_stop_string(client):
    base = client.completions.create(model=MODEL, prompt="The passage says", max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True})  # fmt: skip
    text = base.choices[0].text
    cut = next(i for i in range(2, len(text)) if text[i].strip() and "\ufffd" not in text[i : i + 2])
    stop = text[cut : cut + 2]
    pos = text.find(stop)
    streamed = client.completions.create(model=MODEL, prompt="The passage says", max_tokens=12, temperature=0,
                                         stop=[stop], stream=True, extra_body={"ignore_eos": True})  # fmt: skip
    pieces = list(streamed)
    assert "".join(p.choices[0].text for p in pieces) == text[:pos]
    assert pieces[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(client):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=1234, extra_body={"ignore_eos": True})
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text and a.usage.completion_tokens == 8


def test_completion_logprobs(client):
    out = client.completions.create(model=MODEL, prompt="The passage says", max_tokens=5, temperature=0, logprobs=3,
                                    extra_body={"ignore_eos": True})  # fmt: skip
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    if not any("\ufffd" in t for t in lp.tokens):  # a lone byte of a multi-byte character decodes to U+FFFD
        assert "".join(lp.tokens) == out.choices[0].text
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 3 and chosen <= 0  # (ids that decode to the same text share a key)
        assert chosen == pytest.approx(max(top.values()), abs=1e-5)  # greedy picks the most likely token
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]


def test_chat_stream_logprobs(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=6, temperature=0, logprobs=True,
        top_logprobs=2, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))  # fmt: skip
    content = [c for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert len(content) == chunks[-1].usage.completion_tokens == 6
    assert all(len(c.top_logprobs) == 2 and c.logprob <= c.top_logprobs[0].logprob + 1e-5 for c in content)


def test_penalties_reduce_repetition(client):
    def tokens(**extra) -> list[str]:
        out = client.completions.create(model=MODEL, prompt=ARTICLE[:30], max_tokens=24, temperature=0, logprobs=0,
                                        extra_body={"ignore_eos": True, **extra})  # fmt: skip
        return out.choices[0].logprobs.tokens

    def repeats(toks: list[str]) -> int:
        return len(toks) - len(set(toks))

    base = tokens()
    assert repeats(base) > 0  # the tiny random model loops; penalties must break that
    penalised = tokens(presence_penalty=2.0, frequency_penalty=2.0, repetition_penalty=3.0)
    assert repeats(penalised) < repeats(base)


def test_tokenize_detokenize(http):
    ids = http.post("/tokenize", json={"prompt": "hello world"}).json()
    assert ids["count"] == len(ids["tokens"]) > 0 and ids["max_model_len"] == 512
    assert http.post("/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"] == "hello world"
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > ids["count"] - 2  # the template adds role markers


def test_metrics_parse_and_gauges_return_to_zero(http):
    m = wait_idle(http)
    for name in ("radixflow:prompt_tokens_total", "radixflow:generation_tokens_total", "radixflow:prefix_cache_queries_total",
                 "radixflow:prefix_cache_hits_total", "radixflow:rounds_total", "radixflow:checkpoint_hits_total",
                 "radixflow:time_to_first_token_seconds_count", "radixflow:e2e_request_latency_seconds_count",
                 "radixflow:inter_token_latency_seconds_count", "radixflow:request_queue_time_seconds_count"):  # fmt: skip
        assert m[name] > 0, name
    assert m["radixflow:prefix_cache_hits_total"] < m["radixflow:prefix_cache_queries_total"]
    assert m["radixflow:request_success_total{finished_reason=length}"] > 0
    assert m["radixflow:padding_tokens_total"] > 0 and "radixflow:bubble_tokens_total" in m  # prefill rounds pad a decode region
    assert m["radixflow:attention_pairs_total"] >= m["radixflow:round_tokens_total"]  # each token reads itself at least
    assert m["radixflow:num_requests_running"] == 0 and m["radixflow:num_requests_waiting"] == 0
    assert_pools_full(http)


# ---------------------------------------------------------------------------------- bad input
def _long_prompt() -> str:
    return "x" * (MAX_BODY + 10)


BAD = [
    # (method, path, body (dict/list = JSON, str = raw), headers override, status, message fragment)
    ("POST", "/v1/completions", "{bad json", None, 400, "not valid JSON"),
    ("POST", "/v1/completions", "", None, 400, "empty"),
    ("POST", "/v1/completions", [1, 2], None, 400, "JSON object"),
    ("POST", "/v1/completions", {}, None, 400, "prompt: Field required"),
    ("POST", "/v1/completions", {"prompt": "a", "model": "nope"}, None, 404, "'nope' does not exist"),
    ("POST", "/v1/completions", {"prompt": "a", "n": 17}, None, 400, "n: must be between 1 and 16"),
    ("POST", "/v1/completions", {"prompt": "a", "n": 3, "best_of": 2}, None, 400, "best_of: must be between n"),
    ("POST", "/v1/completions", {"prompt": "a", "best_of": 3, "stream": True}, None, 400, "best_of: cannot be used with stream"),
    ("POST", "/v1/completions", {"prompt": "a", "temperature": -1}, None, 400, "temperature"),
    ("POST", "/v1/completions", {"prompt": "a", "temperature": "hot"}, None, 400, "temperature: Input should be a valid number"),
    ("POST", "/v1/completions", {"prompt": "a", "top_p": 0}, None, 400, "top_p"),
    ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 0}, None, 400, "max_tokens: must be at least 1"),
    ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 100000}, None, 400, "maximum context length is 512"),
    ("POST", "/v1/completions", {"prompt": [1, 10**9]}, None, 400, "outside the vocabulary"),
    ("POST", "/v1/completions", {"prompt": ["a", "b"]}, None, 400, "several prompts"),
    ("POST", "/v1/completions", {"prompt": 5}, None, 400, "prompt"),
    ("POST", "/v1/completions", {"prompt": "a", "suffix": "b"}, None, 400, "no fill-in-the-middle"),
    ("POST", "/v1/completions", {"prompt": "a", "logit_bias": {"five": 1}}, None, 400, "logit_bias: key 'five'"),
    ("POST", "/v1/completions", {"prompt": "a", "logit_bias": {"99999999": 1}}, None, 400, "logit_bias: token id 99999999"),
    ("POST", "/v1/completions", {"prompt": "a", "logit_bias": {"5": -101}}, None, 400, "logit_bias: the bias"),
    ("POST", "/v1/completions", {"prompt": "a", "stop": [1]}, None, 400, "stop"),
    ("POST", "/v1/completions", {"prompt": "a", "seed": "x"}, None, 400, "seed"),
    ("POST", "/v1/completions", {"prompt": "a", "min_tokens": 30, "max_tokens": 3}, None, 400, "min_tokens"),
    ("POST", "/v1/completions", {"prompt": "a", "logprobs": 21}, None, 400, "logprobs: must be between 0 and 20"),
    ("POST", "/v1/completions", {"prompt": "a", "repetition_penalty": 0}, None, 400, "repetition_penalty must be"),
    ("POST", "/v1/completions", {"prompt": "a", "frequency_penalty": -2.5}, None, 400, "frequency_penalty must be in [-2, 2]"),
    ("POST", "/v1/completions", {"prompt": "a", "stream_options": {"include_usage": True}}, None, 400, "stream is true"),
    ("POST", "/v1/completions", {"prompt": _long_prompt()}, None, 413, "exceeds the limit"),
    ("POST", "/v1/completions", {"prompt": "a"}, {"Authorization": "Bearer wrong"}, 401, "invalid API key"),
    ("POST", "/v1/completions", {"prompt": "a"}, {"Authorization": ""}, 401, "invalid API key"),
    ("GET", "/v1/models", None, {"Authorization": "Bearer " + KEY + "x"}, 401, "invalid API key"),
    ("POST", "/v1/chat/completions", {"messages": []}, None, 400, "messages"),
    ("POST", "/v1/chat/completions", {"messages": "hi"}, None, 400, "messages"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, None, 400, "messages.0.role"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user"}]}, None, 400, "needs content"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     None, 400, "tools"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}}, None, 400, "response_format"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "guided_regex": "a[b"},
     None, 400, "guided_regex"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, None, 400, "top_logprobs"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"}, None, 404, "does not exist"),
    ("GET", "/v1/models/unknown", None, None, 404, "'unknown' does not exist"),
    ("GET", "/no/such/route", None, None, 404, "no such route"),
    ("POST", "/tokenize", {}, None, 400, "prompt"),
    ("POST", "/detokenize", {"tokens": ["a"]}, None, 400, "list of integers"),
    ("POST", "/detokenize", {"tokens": [10**9]}, None, 400, "outside the vocabulary"),
]  # fmt: skip


def test_bad_input_suite_then_still_serving(server, http, client):
    assert len(BAD) >= 25
    for method, path, body, headers, status, fragment in BAD:
        kw = {}
        if isinstance(body, str):
            kw["content"] = body
        elif body is not None:
            kw["json"] = body
        hdrs = dict(server.headers, **(headers or {}))
        r = httpx.request(method, server.url + path, headers=hdrs, timeout=30, **kw)
        assert r.status_code == status, (path, body if not isinstance(body, dict) or "prompt" not in body or len(str(body)) < 200 else "...", r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert fragment in err["message"], (fragment, err)
    # the open endpoints need no key; the server still answers correctly
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/metrics").status_code == 200
    out = client.completions.create(model=MODEL, prompt="Still there?", max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError) as info:  # the client sees the envelope too
        client.completions.create(model=MODEL, prompt="a", max_tokens=3, extra_body={"presence_penalty": "high"})
    assert info.value.body["param"] == "presence_penalty"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="a", max_tokens=3, presence_penalty=3.0)
    assert info.value.body["param"] == "presence_penalty" and "[-2, 2]" in info.value.body["message"]


# ---------------------------------------------------------------------------------- load and disconnects
async def _stream_client(c: httpx.AsyncClient, i: int, drop_after: int | None) -> dict:
    # a client that drops asks for many tokens: a stream sends the latest state, so a reader that
    # lags gets fewer, larger chunks, and a short request could end before its second chunk
    max_tokens = 4 if drop_after is None else 200
    body = {"model": MODEL, "prompt": ARTICLE[i : i + 10 + 3 * i], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    async with c.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return {"status": r.status_code}
        events = []
        async for line in r.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            events.append(line[6:])
            if drop_after is not None and len(events) >= drop_after:
                return {"status": 200, "dropped": True}
    return {"status": 200, "events": events}


def check_stream(events: list[str], max_tokens: int) -> None:
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("error" not in c for c in chunks)
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == max_tokens


def test_concurrent_streams_with_disconnects(server, http):
    """CI size: 8 clients (the waiting limit), every third disconnects after two chunks (the full
    200-client run is benchmarks/serve_load.py)."""
    before = metrics(http)

    async def run() -> list[dict]:
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=180) as c:
            return await asyncio.gather(*(_stream_client(c, i, 2 if i % 3 == 0 else None) for i in range(MAX_WAITING)))

    results = asyncio.run(run())
    assert all(r["status"] == 200 for r in results), [r["status"] for r in results]
    for r in results:
        if not r.get("dropped"):
            check_stream(r["events"], 4)
    after = wait_idle(http)
    aborted = after.get("radixflow:request_success_total{finished_reason=abort}", 0) - before.get(
        "radixflow:request_success_total{finished_reason=abort}", 0
    )
    assert aborted >= 1  # most dropped clients left before their request finished
    assert_pools_full(http)


def test_non_streaming_disconnect_aborts(server, http):
    start = metrics(http)
    before = start.get("radixflow:request_success_total{finished_reason=abort}", 0)
    lengths = start.get("radixflow:request_success_total{finished_reason=length}", 0)
    # 490 tokens (the most max_model_len 512 allows) take well over the client's 0.5 s; at 400
    # tokens and a 1.5 s timeout a warm server once finished first (cold CI run, 2026-11-30)
    body = {"model": MODEL, "prompt": ARTICLE[:20], "max_tokens": 490, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(server.url + "/v1/completions", json=body, headers=server.headers, timeout=0.5)
    deadline = time.monotonic() + 60  # the server notices the disconnect within a round or two
    while metrics(http).get("radixflow:request_success_total{finished_reason=abort}", 0) == before:
        assert time.monotonic() < deadline, "the disconnected request was never aborted"
        time.sleep(0.1)
    after = wait_idle(http, timeout=60)
    assert after["radixflow:request_success_total{finished_reason=abort}"] == before + 1
    assert after.get("radixflow:request_success_total{finished_reason=length}", 0) == lengths


def test_small_max_waiting_answers_429_while_admitted_complete(server, http):
    async def one(c: httpx.AsyncClient, i: int) -> httpx.Response:
        body = {"model": MODEL, "prompt": [40 + i, 41, 42, 43], "max_tokens": 2, "temperature": 0, "ignore_eos": True}
        return await c.post("/v1/completions", json=body)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=180) as c:
            return await asyncio.gather(*(one(c, i) for i in range(2 * MAX_WAITING)))

    responses = asyncio.run(run())
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429} and codes.count(429) >= 1 and codes.count(200) >= MAX_WAITING
    for r in responses:
        if r.status_code == 429:
            assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "queue_full"
        else:
            assert r.json()["usage"]["completion_tokens"] == 2
    wait_idle(http)


def test_bench_url_reports_serving_metrics(server, tmp_path, capsys):
    from radixflow_jax.cli import main

    out = tmp_path / "bench.json"
    rc = main(["bench", "--url", server.url, "--api-key", KEY, "--served-model-name", MODEL, "--workload", "multiturn",
               "--num-requests", "4", "--max-tokens", "2", "--arrival", "all", "--json", str(out)])  # fmt: skip
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["completed"] == 4 and report["failed"] == 0 and report["status_5xx"] == 0
    assert report["output_tokens"] == 8 and report["request_throughput"] > 0
    assert 0 < report["ttft_ms"]["mean"] <= report["e2el_ms"]["mean"] and report["e2el_ms"]["p99"] >= report["e2el_ms"]["median"]
    assert report["cache_hit_rate"] > 0  # later turns extend earlier ones (300-token first turns)
    printed = capsys.readouterr().out
    assert "TTFT" in printed and "TPOT" in printed and "cache hit rate" in printed


# ---------------------------------------------------------------------------------- drain (last)
def test_sigterm_drains_running_requests(server):
    """SIGTERM while a stream runs: the stream completes, new work is refused, the process exits 0."""

    async def run() -> dict:
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=180) as c:
            body = {"model": MODEL, "prompt": ARTICLE[:40], "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
            async with c.stream("POST", "/v1/completions", json=body) as r:
                events = []
                async for line in r.aiter_lines():
                    if line:
                        events.append(line[6:])
                        if len(events) == 2:
                            server.terminate()
                return {"status": r.status_code, "events": events}

    result = asyncio.run(run())
    assert result["status"] == 200
    check_stream(result["events"], 12)
    assert server.proc.wait(60) == 0
