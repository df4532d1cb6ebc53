"""Tool calling on ``/v1/chat/completions``: the parser on fixed texts (no engine), then the app
in-process (httpx through Starlette's TestClient) on a tiny-qwen3.5 engine with one fixed-bucket
step variant. The weights are random, so only the grammar (``tool_choice`` ``required`` or a named
function) makes a call valid: each parsed call's arguments must validate (``jsonschema``) against
its tool's parameters. Bad tools answer 400 naming the field while the server stays up."""

from __future__ import annotations

import json

import jsonschema
import pytest
from fastapi.testclient import TestClient

from radixflow_jax.serve.tools import ToolStream, parse_tool_calls, plain_messages, tool_plan

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
           "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"],
           "additionalProperties": False}  # fmt: skip
TIME = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
        "additionalProperties": False}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "time", "description": "the time", "parameters": TIME}}]
SCHEMAS = {"weather": WEATHER, "time": TIME}
MESSAGES = [{"role": "user", "content": "weather in Oslo?"}]
NAMES = ("weather", "time")


def _block(obj: object) -> str:
    return "<tool_call>" + (obj if isinstance(obj, str) else json.dumps(obj)) + "</tool_call>"


def test_parse_several_calls_with_text_around() -> None:
    text = ("Let me look. " + _block({"name": "weather", "arguments": {"city": "Oslo", "days": 2}}) + "\n"
            + _block({"name": "time", "arguments": {"zone": "utc"}}) + " done")  # fmt: skip
    content, calls = parse_tool_calls(text, NAMES)
    assert content == "Let me look. \n done"
    assert [c["function"]["name"] for c in calls] == ["weather", "time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "days": 2}
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    content, calls = parse_tool_calls(_block({"name": "time", "arguments": {"zone": "cet"}}), NAMES)
    assert content is None and len(calls) == 1


def test_malformed_unknown_and_unclosed_blocks_stay_text() -> None:
    for text in [_block("{not json"), _block({"name": "launch", "arguments": {}}), _block({"arguments": {}}),
                 _block({"name": "time", "arguments": [1]}), "<tool_call>{\"name\": \"time\", \"arguments\": {}}",
                 "plain answer"]:  # fmt: skip
        assert parse_tool_calls(text, NAMES) == (text, [])
    good = _block({"name": "time", "arguments": '{"zone": "utc"}'})  # arguments as JSON text
    content, calls = parse_tool_calls(_block("{bad") + good, NAMES)
    assert content == _block("{bad") and json.loads(calls[0]["function"]["arguments"]) == {"zone": "utc"}


def test_stream_parser_buffers_blocks() -> None:
    s = ToolStream(NAMES)
    text = "hi " + _block({"name": "time", "arguments": {"zone": "utc"}}) + "\n" + _block("{x")
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
    content, calls = "", []
    for j, piece in enumerate(pieces):
        c, found = s.feed(piece, j == len(pieces) - 1)
        assert "<tool" not in c or "{x" in c  # a valid block never leaks as content
        content, calls = content + c, calls + found
    assert content.startswith("hi ") and content.endswith(_block("{x")) and s.calls == 1
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "time"
    s = ToolStream(NAMES)  # whitespace after a call: dropped, unless text follows it
    assert s.feed(_block({"name": "time", "arguments": {"zone": "utc"}}), False)[1]
    assert [s.feed(p, False)[0] for p in ("\n", " ", "a", " ", "b")] == ["", "", "\n a", "", " b"]
    assert s.feed("  ", False) == ("", []) and s.feed("", True) == ("", [])


def test_plans_and_plain_rendering() -> None:
    assert tool_plan(None, None) is None and tool_plan(None, "none") is None
    assert tool_plan(TOOLS, None).choice == "auto" and tool_plan(TOOLS, "none").rendered() is None
    assert tool_plan(TOOLS, "auto").grammar() is None
    assert "%json" in tool_plan(TOOLS, {"type": "function", "function": {"name": "time"}}).grammar()
    history = MESSAGES + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "function": {"name": "weather", "arguments": {"city": "Oslo", "days": 1}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]  # fmt: skip
    out = plain_messages(history, tool_plan(TOOLS, "auto"))
    assert out[0]["role"] == "system" and '"name": "weather"' in out[0]["content"]
    assert out[2]["content"].startswith("<tool_call>") and "Oslo" in out[2]["content"]
    assert out[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}


# a template that renders tools (it mentions ``tools``), in the style of HF's
TOOL_TEMPLATE = ("{% if tools %}<tools>{{ tools | map(attribute='function.name') | join(',') }}</tools>{% endif %}"
                 "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if m.tool_calls is defined %}"
                 "{% for c in m.tool_calls %}[{{ c.function.name }}:{{ c.function.arguments.zone }}]{% endfor %}"
                 "{% endif %}{% endfor %}")  # fmt: skip


def test_a_template_with_tools_gets_them_and_the_history() -> None:
    from radixflow_jax.models.tokenizer import Tokenizer
    from radixflow_jax.serve.protocol import CHAT, _chat_messages, parse_body
    from radixflow_jax.serve.tools import render_chat

    tok = Tokenizer(None, chat_template=TOOL_TEMPLATE)  # the real jinja rendering (StrictUndefined)

    body = parse_body(CHAT, {"messages": MESSAGES + [
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "time", "arguments": '{"zone": "cet"}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "9:00"}], "tools": TOOLS})  # fmt: skip
    text = render_chat(tok, _chat_messages(body), tool_plan(body.tools, body.tool_choice))
    assert text == "<tools>weather,time</tools><user>weather in Oslo?<assistant>[time:cet]<tool>9:00"
    assert "<tools>" not in render_chat(tok, _chat_messages(body), tool_plan(TOOLS, "none"))


@pytest.fixture(scope="module")
def served(tiny_model):
    from radixflow_jax.engine.build import build_engine
    from radixflow_jax.engine.config import EngineConfig
    from radixflow_jax.replicas.background import BackgroundEngine
    from radixflow_jax.serve.app import ServerConfig, ServerState, create_app
    from radixflow_jax.serve.metrics import ServerMetrics
    from tests.engine.workloads import SMALL_FIXED

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


def _post(client: TestClient, **body) -> dict:
    body = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 96, "temperature": 0.0, **body}
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]


def _valid_calls(choice: dict, names: tuple[str, ...] = NAMES) -> list[dict]:
    calls = choice["message"]["tool_calls"]
    assert calls and choice["finish_reason"] == "tool_calls", choice
    for c in calls:
        assert c["function"]["name"] in names and c["id"].startswith("call_") and c["type"] == "function"
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
    return calls


def test_required_and_named_calls_round_trip(served) -> None:
    _valid_calls(_post(served, tool_choice="required"))
    _valid_calls(_post(served, tool_choice="required", temperature=1.0, seed=11))
    named = _post(served, tool_choice={"type": "function", "function": {"name": "time"}})
    calls = _valid_calls(named, ("time",))
    assert len(calls) == 1 and named["message"]["content"] is None
    # the second turn: the assistant's call and the tool's result in the history
    history = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": calls},
                          {"role": "tool", "tool_call_id": calls[0]["id"], "content": '{"time": "12:00"}'}]
    second = _post(served, messages=history, max_tokens=8)
    assert second["finish_reason"] in ("stop", "length", "tool_calls")
    assert _post(served, tool_choice="none", max_tokens=4)["message"]["tool_calls"] == []
    assert _post(served, tool_choice="auto", max_tokens=4)["finish_reason"] in ("stop", "length", "tool_calls")


def test_streamed_tool_calls(served) -> None:
    body = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 96, "stream": True,
            "tool_choice": {"type": "function", "function": {"name": "weather"}}}  # fmt: skip
    with served.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert len(calls) == 1 and calls[0]["index"] == 0 and calls[0]["function"]["name"] == "weather"
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), WEATHER)
    assert "".join(d.get("content") or "" for d in deltas) == ""
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "tool_calls"


@pytest.mark.parametrize("extra, param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "objectx"}}}]},
     "tools.0.function.parameters"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required", "guided_regex": "a"}, "tool_choice"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools.2.function.name"),
])  # fmt: skip
def test_bad_tools_answer_400_and_the_server_stays_up(served, extra, param) -> None:
    resp = served.post("/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS, "max_tokens": 4, **extra})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.json()
    assert served.get("/health").status_code == 200


def test_the_openai_client(served) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=str(served.base_url) + "/v1", api_key="none", http_client=served)
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                         max_tokens=96, temperature=0)  # type: ignore[arg-type]  # fmt: skip
    call = out.choices[0].message.tool_calls[0]
    assert out.choices[0].finish_reason == "tool_calls" and call.function.name in NAMES
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
