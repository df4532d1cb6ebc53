"""Tool (function) calling on ``/v1/chat/completions``: the request's ``tools`` / ``tool_choice``
checked into a :class:`ToolPlan`, the prompt rendering of tools and of tool messages, the grammar
that enforces a call, and the parser that turns ``<tool_call>`` blocks of the output into
``message.tool_calls``. Needs only the standard library and (for checks) llguidance; no JAX.

Format (Hermes / Qwen): a call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Invariants:
  * A :class:`ToolPlan` that exists is valid: every tool is a function with a unique name and a
    parameters schema that compiles; ``named`` is one of the tools. Anything else raises
    :class:`ToolError` naming the field (``tools.<i>...`` or ``tool_choice``).
  * ``tool_choice``: ``auto`` (the default with tools) renders the tools, constrains nothing and
    parses what comes; ``required`` constrains the output to one or more calls of the tools; a
    named function to exactly one call of it; ``none`` renders without tools and parses nothing
    (``none`` is also accepted without ``tools``).
  * The parser never invents a call: a block whose JSON does not parse, is not an object with a
    string ``name`` of a requested tool, or has non-object ``arguments``, stays in the text;
    an unclosed block stays in the text.
  * Rendering: a chat template that mentions ``tools`` gets them (``tools=``, as HF's
    ``apply_chat_template``) and the messages as they came; otherwise the default system block
    (:func:`default_system_block`) leads the prompt and tool messages / assistant calls are
    rewritten into plain text the template can render (:func:`plain_messages`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any, Sequence

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_NO_WS = {"whitespace_flexible": False}


class ToolError(ValueError):
    """A bad ``tools`` / ``tool_choice``; ``field`` names the request field (dotted path)."""

    def __init__(self, message: str, field: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    """The checked tools of one request. ``functions``: each tool's ``function`` object (``name``,
    optional ``description``, ``parameters`` schema, default ``{"type": "object"}``); ``choice``:
    ``auto`` / ``none`` / ``required`` / ``named``; ``named``: the forced function's name."""

    functions: tuple[dict[str, Any], ...]
    choice: str
    named: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f["name"] for f in self.functions)

    @property
    def parses(self) -> bool:
        """Whether the output is parsed for calls (everything but ``none``)."""
        return self.choice != "none" and bool(self.functions)

    def rendered(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template gets them (OpenAI form), None when none are rendered."""
        if not self.parses:
            return None
        return [{"type": "function", "function": f} for f in self.functions]

    def grammar(self) -> str | None:
        """The llguidance (Lark) grammar enforcing calls: ``required`` one or more calls of any
        tool, ``named`` exactly one call of it; None for ``auto`` / ``none``."""
        if self.choice == "named":
            return _calls_grammar([f for f in self.functions if f["name"] == self.named], many=False)
        if self.choice == "required":
            return _calls_grammar(list(self.functions), many=True)
        return None


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": function["parameters"]},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _calls_grammar(functions: Sequence[dict[str, Any]], many: bool) -> str:
    schema = _call_schema(functions[0]) if len(functions) == 1 else {"anyOf": [_call_schema(f) for f in functions]}
    schema["x-guidance"] = _NO_WS
    start = r'start: call ("\n" call)*' if many else "start: call"
    return f'{start}\ncall: "{OPEN}" body "{CLOSE}"\nbody: %json {json.dumps(schema)}\n'


def _check_schema(schema: Any, field: str) -> None:
    if not isinstance(schema, dict):
        raise ToolError(f"must be a JSON schema object, got {type(schema).__name__}", field)
    import llguidance

    try:
        text = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_NO_WS)
        error = llguidance.LLMatcher.validate_grammar(text)
    except (TypeError, ValueError) as exc:
        error = str(exc)
    if error:
        raise ToolError(f"invalid JSON schema: {error.strip()}", field)


def _function(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise ToolError('each tool must be {"type": "function", "function": {...}}', f"tools.{i}.type")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise ToolError("a tool needs a function object", f"tools.{i}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ToolError("a function needs a name (a non-empty string)", f"tools.{i}.function.name")
    params = fn.get("parameters", {"type": "object"})
    _check_schema(params, f"tools.{i}.function.parameters")
    out = {"name": name, "parameters": params}
    if isinstance(fn.get("description"), str):
        out["description"] = fn["description"]
    return out


def tool_plan(tools: list[Any] | None, tool_choice: Any) -> ToolPlan | None:
    """The checked plan of a request's ``tools`` / ``tool_choice`` (None: no tools, no choice or
    ``none``); :class:`ToolError` naming the field for anything invalid."""
    if not tools:
        if tool_choice in (None, "none"):
            return None
        raise ToolError("tool_choice needs tools", "tool_choice")
    functions = tuple(_function(t, i) for i, t in enumerate(tools))
    names = [f["name"] for f in functions]
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise ToolError(f"two tools are named {dup!r}", f"tools.{names.index(dup, names.index(dup) + 1)}.function.name")
    if tool_choice is None or tool_choice in ("auto", "none", "required"):
        return ToolPlan(functions, tool_choice or "auto")
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if name not in names:
            raise ToolError(f"names the function {name!r}, which is not in tools ({', '.join(names)})", "tool_choice")
        return ToolPlan(functions, "named", name)
    raise ToolError(
        'must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}', "tool_choice"
    )


def default_system_block(functions: Sequence[dict[str, Any]]) -> str:
    """The system text that offers the tools to a model whose template has no tool support (a
    short form of the Hermes / Qwen 2.5 block): each function's JSON, one a line, inside
    ``<tools>``, then the call format."""
    listed = "\n".join(json.dumps({"type": "function", "function": f}) for f in functions)
    return (
        f"# Tools\n\nYou may call one or more functions. Their signatures:\n<tools>\n{listed}\n</tools>\n\n"
        "For each call, reply with a JSON object of the function name and arguments inside "
        '<tool_call></tool_call> tags:\n<tool_call>{"name": <function-name>, "arguments": <args-json-object>}'
        "</tool_call>"
    )


def call_text(name: str, arguments: Any) -> str:
    """One call as the model writes it (``arguments``: an object, or its JSON text)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"


def plain_messages(messages: list[dict[str, Any]], plan: ToolPlan | None) -> list[dict[str, str]]:
    """Messages any role/content template renders: assistant calls appended to its content as
    ``<tool_call>`` blocks, a ``tool`` result as a user turn in ``<tool_response>``, and with tools
    rendered the default system block first (merged into a leading system message)."""
    out: list[dict[str, str]] = []
    for m in messages:
        content = m.get("content") or ""
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [call_text(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
            content = "\n".join(([content] if content else []) + calls)
        if m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": content})
    if plan is not None and plan.rendered():
        block = default_system_block(plan.functions)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def history_calls(calls: list[Any], field: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` as templates take them (vLLM's form): ``id``,
    ``type``, ``function.name`` and ``function.arguments`` as an object (JSON text is decoded)."""
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ToolError("a tool call needs function.name", f"{field}.{j}.function")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise ToolError("function.arguments is not JSON", f"{field}.{j}.function.arguments") from None
        out.append({"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], plan: ToolPlan | None) -> str:
    """The prompt text of a chat: through the template with ``tools=`` when it supports tools,
    else the plain rewrite (:func:`plain_messages`) with the default system block."""
    if template_has_tools(getattr(tokenizer, "chat_template", None)):
        tools = plan.rendered() if plan is not None else None
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
    return tokenizer.apply_chat_template(plain_messages(messages, plan), add_generation_prompt=True)


def template_has_tools(template: str | None) -> bool:
    """A chat template renders tools when it refers to the ``tools`` variable."""
    return bool(template) and re.search(r"\btools\b", template or "") is not None


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parse_block(inner: str, names: Sequence[str]) -> dict[str, Any] | None:
    """The OpenAI ``tool_calls`` entry of one block's inside, or None (left as text)."""
    try:
        obj = json.loads(inner)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return {"id": new_call_id(), "type": "function", "function": {"name": obj["name"], "arguments": json.dumps(args)}}


def parse_tool_calls(text: str, names: Sequence[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, calls)`` of an output: every well-formed block of a known tool becomes a call
    (in order); the rest of the text, stripped, is the content (None when empty)."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for m in _BLOCK.finditer(text):
        call = parse_block(m.group(1).strip(), names)
        kept.append(text[last : m.start()] if call is not None else text[last : m.end()])
        last = m.end()
        if call is not None:
            calls.append(call)
    if not calls:
        return text, calls
    kept.append(text[last:])
    content = "".join(kept).strip()
    return (content or None), calls


class ToolStream:
    """Splits a streamed output into content deltas and calls: text before a ``<tool_call>``
    streams as content (a trailing prefix of ``<tool_call>`` is held back), a block is buffered
    until it closes and then comes out as one call (or, when it is not a valid call, as content);
    whitespace after a call is held until text follows it (whitespace around calls is not content).
    :meth:`feed` takes the next piece of text; ``final`` flushes what is held (an unclosed block
    as content). ``calls``: how many calls were emitted (the next call's ``index``)."""

    def __init__(self, names: Sequence[str]):
        self.names = tuple(names)
        self.buffer = ""
        self.calls = 0
        self.space = ""  # whitespace after a call, sent only when more text follows it

    def feed(self, piece: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        self.buffer += piece
        content: list[str] = []
        calls: list[dict[str, Any]] = []
        while True:
            start = self.buffer.find(OPEN)
            if start < 0:
                keep = 0 if final else _prefix_held(self.buffer)
                content.append(self.buffer[: len(self.buffer) - keep])
                self.buffer = self.buffer[len(self.buffer) - keep :]
                break
            end = self.buffer.find(CLOSE, start)
            if end < 0:
                content.append(self.buffer[:start])
                self.buffer = self.buffer[start:]
                if final:
                    content.append(self.buffer)
                    self.buffer = ""
                break
            content.append(self.buffer[:start])
            call = parse_block(self.buffer[start + len(OPEN) : end].strip(), self.names)
            if call is None:
                content.append(self.buffer[start : end + len(CLOSE)])
            else:
                calls.append({"index": self.calls, **call})
                self.calls += 1
            self.buffer = self.buffer[end + len(CLOSE) :]
        text = self.space + "".join(content)
        self.space = ""
        if self.calls and not text.strip():  # whitespace between or after calls: held, dropped at the end
            self.space, text = ("" if final else text), ""
        return text, calls


def _prefix_held(text: str) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0
