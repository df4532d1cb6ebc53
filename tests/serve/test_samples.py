"""``n`` / ``best_of``, ``logit_bias``, ``min_tokens`` and ``echo`` over HTTP: the app in-process
(httpx through Starlette's TestClient; the openai client is not installed) on a tiny-qwen3.5
engine with one fixed-bucket step variant, and the 400s those fields answer while the server stays up."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from radixflow_jax.engine import intake
from radixflow_jax.engine.build import build_engine
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.replicas.background import BackgroundEngine
from radixflow_jax.serve.app import ServerConfig, ServerState, create_app
from radixflow_jax.serve.metrics import ServerMetrics
from tests.engine.workloads import SMALL_FIXED

MAX_N = 8
PROMPT = "the student read a story about the river and the"


@pytest.fixture(scope="module")
def served(tiny_model):
    model = tiny_model("tiny-qwen3.5")
    core = build_engine(model, EngineConfig.from_options(**SMALL_FIXED, max_n=MAX_N))
    metrics = ServerMetrics("tiny", hybrid=True)
    engine = BackgroundEngine(core, observer=metrics.observe, trim_records=True)
    metrics.attach(engine)
    state = ServerState(
        engine=engine, tokenizer=model.tokenizer, metrics=metrics, config=ServerConfig("tiny"),
        max_model_len=core.max_model_len, vocab_size=model.config.vocab_size,
    )
    try:
        with TestClient(create_app(state)) as client:
            yield client, model
    finally:
        engine.shutdown()


def _post(client: TestClient, body: dict, path: str = "/v1/completions") -> dict:
    resp = client.post(path, json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _events(client: TestClient, body: dict, path: str = "/v1/completions") -> list[dict]:
    with client.stream("POST", path, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        lines = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_n_samples_and_their_stream(served) -> None:
    client, model = served
    body = {"prompt": PROMPT, "n": 4, "max_tokens": 6, "temperature": 1.0, "seed": 11, "ignore_eos": True}
    out = _post(client, body)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert len({c["text"] for c in out["choices"]}) == 4
    prompt_len = len(model.tokenizer.encode(PROMPT))
    assert out["usage"]["prompt_tokens"] == prompt_len and out["usage"]["completion_tokens"] == 24  # prompt once
    events = _events(client, {**body, "stream_options": {"include_usage": True}})
    texts, reasons = ["" for _ in range(4)], [None] * 4
    for event in events[:-1]:
        (choice,) = event["choices"]
        texts[choice["index"]] += choice["text"]
        reasons[choice["index"]] = reasons[choice["index"]] or choice["finish_reason"]
    assert texts == [c["text"] for c in out["choices"]] and reasons == ["length"] * 4
    assert events[-1]["usage"]["completion_tokens"] == 24 and events[-1]["choices"] == []
    chat = _post(client, {"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 4, "temperature": 1.0,
                          "seed": 3}, "/v1/chat/completions")  # fmt: skip
    assert [c["index"] for c in chat["choices"]] == [0, 1]
    chat_events = _events(client, {"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 4,
                                   "temperature": 1.0, "seed": 3}, "/v1/chat/completions")  # fmt: skip
    roles = [e["choices"][0]["index"] for e in chat_events if e["choices"][0]["delta"].get("role") == "assistant"]
    ends = sorted(e["choices"][0]["index"] for e in chat_events if e["choices"][0]["finish_reason"])
    assert roles == [0, 1] and ends == [0, 1]
    streamed = ["".join(e["choices"][0]["delta"].get("content", "") for e in chat_events if e["choices"][0]["index"] == i)
                for i in range(2)]  # fmt: skip
    assert streamed == [c["message"]["content"] for c in chat["choices"]]


def test_best_of_picks_the_highest_cumulative_logprob(served) -> None:
    client, _ = served
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 1.0, "seed": 5, "ignore_eos": True}
    every = _post(client, {**body, "n": 3, "logprobs": 0})["choices"]
    scores = [sum(c["logprobs"]["token_logprobs"]) for c in every]
    best = _post(client, {**body, "best_of": 3})["choices"]
    assert len(best) == 1 and best[0]["text"] == every[int(np.argmax(scores))]["text"]
    assert best[0]["logprobs"] is None


def test_logit_bias_and_min_tokens(served) -> None:
    client, model = served
    tok = model.tokenizer
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    greedy = _post(client, body)["choices"][0]
    forced = _post(client, {**body, "logit_bias": {"77": 100}})["choices"][0]
    assert forced["text"] == tok.decode([77] * 4)
    first = int(np.argmax(model.logits(tok.encode(PROMPT))[-1]))  # the greedy first token, from the model itself
    assert greedy["logprobs"]["tokens"][0] == tok.decode([first], skip_special_tokens=False)
    banned = _post(client, {**body, "logit_bias": {str(first): -100}})["choices"][0]
    assert banned["logprobs"]["tokens"][0] != greedy["logprobs"]["tokens"][0]
    eos = str(model.config.eos_token_ids[0])
    eager = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logit_bias": {eos: 100}}
    assert _post(client, eager)["usage"]["completion_tokens"] == 1
    held = _post(client, {**eager, "min_tokens": 3})
    assert held["usage"]["completion_tokens"] == 4 and held["choices"][0]["finish_reason"] == "stop"


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_echo_returns_the_prompt_and_its_logprobs(served) -> None:
    client, model = served
    text = " ".join([PROMPT] * 6)  # longer than a checkpoint grid step: the second request hits the cache
    ids = model.tokenizer.encode(text)
    plain = _post(client, {"prompt": text, "max_tokens": 3, "temperature": 0})["choices"][0]
    echo = _post(client, {"prompt": text, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 2})
    choice = echo["choices"][0]
    assert choice["text"] == text + plain["text"]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 3 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    cold = _log_softmax(model.logits(ids))  # a cold computation of the whole prompt
    want = [cold[i - 1, ids[i]] for i in range(1, len(ids))]
    np.testing.assert_allclose(lp["token_logprobs"][1 : len(ids)], want, atol=1e-4)
    assert lp["text_offset"][0] == 0 and lp["text_offset"][len(ids)] == sum(len(t) for t in lp["tokens"][: len(ids)])
    again = _post(client, {"prompt": text, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 2})
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert again["choices"][0]["logprobs"]["token_logprobs"] == lp["token_logprobs"]  # cached prompt: recomputed
    scored = _post(client, {"prompt": text, "max_tokens": 0, "echo": True, "logprobs": 0})
    assert scored["choices"][0]["text"] == text and scored["usage"]["completion_tokens"] == 0
    assert len(scored["choices"][0]["logprobs"]["tokens"]) == len(ids)
    events = _events(client, {"prompt": text, "max_tokens": 2, "temperature": 0, "echo": True})
    assert events[0]["choices"][0]["text"] == text


def test_a_scored_prompt_over_the_cap_answers_400(served, monkeypatch: pytest.MonkeyPatch) -> None:
    """``echo`` with ``logprobs`` scores the prompt: over the scoring cap (lowered here below the
    prompt's length) it is a 400 naming ``prompt_logprobs``; the same prompt unscored still runs."""
    client, model = served
    monkeypatch.setattr(intake, "MAX_SCORED_PROMPT", 4)
    assert len(model.tokenizer.encode(PROMPT)) > 4
    resp = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "echo": True, "logprobs": 1})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "prompt_logprobs" and "at most 4 tokens" in err["message"]
    assert _post(client, {"prompt": PROMPT, "max_tokens": 1, "echo": True})["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("body, param, fragment", [
    ({"n": MAX_N + 1}, "n", f"between 1 and {MAX_N}"),
    ({"n": 3, "best_of": 2}, "best_of", "between n (3)"),
    ({"best_of": 2, "stream": True}, "best_of", "stream=true"),
    ({"logit_bias": {"abc": 1}}, "logit_bias", "not a token id"),
    ({"logit_bias": {"100000": 1}}, "logit_bias", "outside the vocabulary"),
    ({"logit_bias": {"5": 100.5}}, "logit_bias", "[-100, 100]"),
    ({"suffix": "end"}, "suffix", "fill-in-the-middle"),
])  # fmt: skip
def test_bad_fields_answer_400_and_the_server_stays_up(served, body, param, fragment) -> None:
    client, _ = served
    resp = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, **body})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == param and fragment in err["message"]
    assert client.get("/health").status_code == 200
    assert _post(client, {"prompt": PROMPT, "max_tokens": 1})["usage"]["completion_tokens"] == 1


def test_the_openai_client_n_and_logit_bias(served) -> None:
    """The openai client's ``n`` and ``logit_bias`` calls (its http client is the in-process TestClient)."""
    openai = pytest.importorskip("openai")
    client, model = served
    api = openai.OpenAI(base_url=str(client.base_url) + "/v1", api_key="none", http_client=client)
    many = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=3, n=4)
    assert sorted(c.index for c in many.choices) == [0, 1, 2, 3]
    assert len({c.text for c in many.choices}) > 1  # distinct samples
    assert many.usage.prompt_tokens == len(model.tokenizer.encode(PROMPT))  # the prompt counted once
    forced = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0,
                                    logit_bias={"77": 100})  # fmt: skip
    assert forced.choices[0].text == model.tokenizer.decode([77] * 3)
    with pytest.raises(openai.BadRequestError) as info:
        api.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, n=MAX_N + 1)
    assert info.value.param == "n"  # the field is named
