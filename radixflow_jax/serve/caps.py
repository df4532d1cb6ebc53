"""Size caps on what one request body may ask the server to prepare: how many tools, stop strings
and ``guided_choice`` entries, how long a stop string, how large a schema, regex or grammar, how
deep the JSON nests. They bound the host work of preparing a request (tokenising, template
rendering, schema and grammar conversion) and the grammar compiled from it; ``docs/serving.md``
("Errors and limits") states the defaults.

Invariants:
  * :func:`check_caps` raises :class:`~radixflow_jax.serve.protocol.ProtocolError`-compatible
    :class:`CapError` (400, ``code`` ``too_large``) naming the field, before anything is compiled.
  * :func:`json_depth` walks without recursion, so any decoded body can be measured.
Needs only the standard library (batch jobs reuse it through ``serve/protocol.py``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any


# the server's defaults for the bounds beside the caps (``serve/state.ServerConfig``, ``radixflow serve``)
DEFAULT_MAX_WAITING = 1024
DEFAULT_STREAM_TIMEOUT_S = 60.0
DEFAULT_PREPARE_WORKERS = 4
DEFAULT_PREPARE_TIMEOUT_S = 30.0
DEFAULT_STEP_STALL_S = 600.0
DEFAULT_GRAMMAR_TRIAL_S = 2.0


@dataclasses.dataclass(frozen=True)
class RequestCaps:
    """The caps (module docstring). ``max_schema_chars``: a JSON schema's canonical text, a regex or
    a grammar; ``max_tools_chars``: all tools' JSON together."""

    max_json_depth: int = 64
    max_tools: int = 128
    max_tools_chars: int = 256 << 10
    max_stop: int = 16
    max_stop_chars: int = 256
    max_stop_token_ids: int = 128
    max_choices: int = 256
    max_choice_chars: int = 1024
    max_schema_chars: int = 64 << 10


DEFAULT_CAPS = RequestCaps()


class CapError(ValueError):
    """A body over a cap; ``field`` names the request field."""

    def __init__(self, message: str, field: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def json_depth(value: Any) -> int:
    """How deep a decoded JSON value nests (a scalar is 0, ``[]`` is 1)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        else:
            continue
        deepest = max(deepest, depth + 1)
    return deepest


def _text_size(value: Any) -> int:
    return len(value) if isinstance(value, str) else len(json.dumps(value))


def _check_count(values: Any, limit: int, field: str, what: str) -> None:
    if isinstance(values, (list, tuple)) and len(values) > limit:
        raise CapError(f"at most {limit} {what} per request, got {len(values)}", field)


def _check_stop(body: Any, caps: RequestCaps) -> None:
    stop = body.stop if body.stop is not None else ()
    stops = [stop] if isinstance(stop, str) else list(stop)
    _check_count(stops, caps.max_stop, "stop", "stop strings")
    if any(len(s) > caps.max_stop_chars for s in stops):
        raise CapError(f"a stop string may have at most {caps.max_stop_chars} characters", "stop")
    _check_count(body.stop_token_ids or (), caps.max_stop_token_ids, "stop_token_ids", "stop token ids")


def _check_choices(choices: Any, caps: RequestCaps, field: str) -> None:
    _check_count(choices, caps.max_choices, field, "choices")
    if not isinstance(choices, (list, tuple)):
        return
    if any(isinstance(c, str) and len(c) > caps.max_choice_chars for c in choices):
        raise CapError(f"a choice may have at most {caps.max_choice_chars} characters", field)


def _constraints(body: Any) -> list[tuple[str, Any]]:
    """``(field, value)`` of each schema, regex or grammar text the body carries."""
    out: list[tuple[str, Any]] = []
    fmt = getattr(body, "response_format", None)
    if fmt is not None and fmt.json_schema is not None:
        out.append(("response_format", fmt.json_schema.get("schema")))
    for name in ("guided_json", "guided_regex", "guided_grammar"):
        if getattr(body, name, None) is not None:
            out.append((name, getattr(body, name)))
    so = getattr(body, "structured_outputs", None)
    if isinstance(so, dict):
        out.extend(("structured_outputs", so[k]) for k in ("json", "regex", "grammar") if so.get(k) is not None)
    return out


def check_caps(body: Any, caps: RequestCaps = DEFAULT_CAPS) -> None:
    """Raises :class:`CapError` on the first cap a validated body (``serve/bodies.py``) is over."""
    _check_stop(body, caps)
    _check_choices(getattr(body, "guided_choice", None), caps, "guided_choice")
    so = getattr(body, "structured_outputs", None)
    if isinstance(so, dict):
        _check_choices(so.get("choice"), caps, "structured_outputs")
    for field, value in _constraints(body):
        if _text_size(value) > caps.max_schema_chars:
            raise CapError(f"a schema, regex or grammar may have at most {caps.max_schema_chars} characters", field)
    tools = getattr(body, "tools", None)
    if tools:
        _check_count(tools, caps.max_tools, "tools", "tools")
        if _text_size(tools) > caps.max_tools_chars:
            raise CapError(f"the tools may have at most {caps.max_tools_chars} characters of JSON together", "tools")
