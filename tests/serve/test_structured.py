"""Structured outputs over HTTP (``response_format``, vLLM's ``guided_*``): the app in-process
(httpx through Starlette's TestClient) on a tiny-qwen3.5 engine with one fixed-bucket step variant.
The weights are random, so the grammar alone makes outputs valid: of the outputs that finish with
``stop``, every one must validate (``jsonschema``) or match; the bad inputs answer 400 naming the
field while the server stays up."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from fastapi.testclient import TestClient

from radixflow_jax.engine.build import build_engine
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.replicas.background import BackgroundEngine
from radixflow_jax.serve.app import ServerConfig, ServerState, create_app
from radixflow_jax.serve.metrics import ServerMetrics
from tests.engine.workloads import SMALL_FIXED

MESSAGES = [{"role": "user", "content": "describe the river as JSON"}]

# the named schemas of the acceptance (issue 34): each output that ends with stop must validate
SCHEMAS: dict[str, dict] = {
    "required_fields": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                        "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": False},
    "enum": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
             "additionalProperties": False},
    "array_of_ints": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 4},
    "nested_object": {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"], "additionalProperties": False}},
        "required": ["point"], "additionalProperties": False},
    "string_pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}},
                       "required": ["code"], "additionalProperties": False},
    "boolean": {"type": "boolean"},
    "number_bounds": {"type": "object", "properties": {"t": {"type": "number", "minimum": -5, "maximum": 5}},
                      "required": ["t"], "additionalProperties": False},
    "integer_bounds": {"type": "integer", "minimum": 10, "maximum": 20},
    "const_and_null": {"type": "object", "properties": {"v": {"const": 1}, "n": {"type": "null"}},
                       "required": ["v", "n"], "additionalProperties": False},
    "any_of": {"anyOf": [{"type": "integer", "maximum": 9, "minimum": 0}, {"type": "boolean"}]},
    "short_string": {"type": "string", "maxLength": 5},
    "array_of_objects": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
        "ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}},
}


@pytest.fixture(scope="module")
def served(tiny_model):
    model = tiny_model("tiny-qwen3.5")
    core = build_engine(model, EngineConfig.from_options(**SMALL_FIXED))
    metrics = ServerMetrics("tiny", hybrid=True)
    engine = BackgroundEngine(core, observer=metrics.observe, trim_records=True)
    metrics.attach(engine)
    state = ServerState(
        engine=engine, tokenizer=model.tokenizer, metrics=metrics, config=ServerConfig("tiny"),
        max_model_len=core.max_model_len, vocab_size=model.config.vocab_size,
    )
    try:
        with TestClient(create_app(state)) as client:
            yield client
    finally:
        engine.shutdown()


def _chat(client: TestClient, extra: dict, **body) -> list[dict]:
    body = {"messages": MESSAGES, "max_tokens": 48, "temperature": 0.0, **body, **extra}
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"]


def test_json_schemas_validate(served) -> None:
    """Every named schema, greedy and sampled (n=2): each output that ends with stop validates."""
    stopped = 0
    for name, schema in SCHEMAS.items():
        fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
        for choice in _chat(served, {"response_format": fmt}) + _chat(served, {}, guided_json=schema, n=2,
                                                                       temperature=1.0, seed=7):  # fmt: skip
            if choice["finish_reason"] == "stop":
                stopped += 1
                jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    assert stopped >= len(SCHEMAS), f"only {stopped} outputs ended with stop"


def test_json_object_choice_regex_and_grammar(served) -> None:
    client = served
    out = _chat(client, {"response_format": {"type": "json_object"}}, max_tokens=64)[0]
    if out["finish_reason"] == "stop":
        assert isinstance(json.loads(out["message"]["content"]), dict)
    choices = ["yes", "no", "not sure"]
    for c in _chat(client, {"guided_choice": choices}, n=3, temperature=1.0, seed=3):
        assert c["finish_reason"] == "stop" and c["message"]["content"] in choices
    resp = client.post("/v1/completions", json={"prompt": "the code is", "max_tokens": 16, "temperature": 1.0,
                                                "n": 3, "seed": 5, "guided_regex": r"[0-9]{3}-[a-z]{2}"})
    assert resp.status_code == 200, resp.text
    for c in resp.json()["choices"]:
        assert c["finish_reason"] == "stop" and re.fullmatch(r"[0-9]{3}-[a-z]{2}", c["text"]), c
    grammar = 'start: item ("," item)*\nitem: "a" | "b" "c"?'
    c = _chat(client, {"guided_grammar": grammar}, max_tokens=24)[0]
    if c["finish_reason"] == "stop":
        assert re.fullmatch(r"(a|bc?)(,(a|bc?))*", c["message"]["content"])


def test_stream_of_a_constrained_request(served) -> None:
    body = {"messages": MESSAGES, "max_tokens": 16, "stream": True, "guided_choice": ["alpha", "beta"]}
    with served.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        lines = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    events = [json.loads(x) for x in lines[:-1]]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text in ("alpha", "beta")
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "stop"


@pytest.mark.parametrize("extra, param, fragment", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     "response_format", "objectx"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ({"response_format": {"type": "yaml"}}, "response_format", "yaml"),
    ({"guided_json": "{not json"}, "guided_json", "JSON"),
    ({"guided_regex": "a[b"}, "guided_regex", "regex"),
    ({"guided_choice": []}, "guided_choice", "choice"),
    ({"guided_grammar": "start: nothing_defined"}, "guided_grammar", "nothing_defined"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "only one"),
    ({"structured_outputs": {"regexp": "a"}}, "structured_outputs", "regexp"),
])  # fmt: skip
def test_bad_constraints_answer_400_and_the_server_stays_up(served, extra, param, fragment) -> None:
    resp = served.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4, **extra})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and fragment in err["message"], err
    assert served.get("/health").status_code == 200
    assert _chat(served, {}, max_tokens=2)[0]["finish_reason"] in ("stop", "length")


def test_the_openai_client(served) -> None:
    """The openai client's structured-output calls (its http client is the in-process TestClient)."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=str(served.base_url) + "/v1", api_key="none", http_client=served)
    schema = SCHEMAS["enum"]
    fmt = {"type": "json_schema", "json_schema": {"name": "color", "schema": schema, "strict": True}}
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, temperature=0,
                                         response_format=fmt)  # type: ignore[arg-type]  # fmt: skip
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)
    pick = client.completions.create(model="tiny", prompt="pick", max_tokens=8, extra_body={"guided_choice": ["p", "q"]})
    assert pick.choices[0].text in ("p", "q")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, extra_body={"guided_regex": "("})
    assert "guided_regex" in str(info.value)
