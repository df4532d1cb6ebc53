"""Structured outputs in OpenAI / vLLM request bodies -> the engine's
:class:`~radixflow_jax.engine.grammar.StructuredOutputsParams`.

Accepted (both endpoints; at most one per request):
  * ``response_format``: ``{"type": "text"}`` (nothing), ``{"type": "json_object"}`` (any JSON
    object), ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``;
  * vLLM's extras: ``guided_json`` (a schema, object or JSON text), ``guided_regex``,
    ``guided_choice`` (a list of strings), ``guided_grammar`` (llguidance's Lark-like syntax; GBNF
    is converted), and ``structured_outputs`` (vLLM's newer object: ``json``, ``regex``, ``choice``,
    ``grammar``, ``json_object``).
An invalid schema, regex, choice list or grammar raises :class:`GrammarError` naming the field it
came in (``serve/protocol.py`` answers it with a 400 on that field). Needs only pydantic and llguidance (no JAX).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from radixflow_jax.engine.grammar import GrammarError, StructuredOutputsParams

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``; ``json_schema`` holds ``name`` / ``schema`` / ``strict``."""

    model_config = ConfigDict(extra="ignore")
    type: str = "text"
    json_schema: dict[str, Any] | None = None


def structured_params(body: Any) -> StructuredOutputsParams | None:
    """The constraint a body asks for (None: none); :class:`GrammarError` for a bad one."""
    given: list[tuple[str, dict[str, Any]]] = []
    fmt: ResponseFormat | None = getattr(body, "response_format", None)
    if fmt is not None and fmt.type != "text":
        given.append(("response_format", _from_format(fmt)))
    for name, key in _GUIDED.items():
        value = getattr(body, name, None)
        if value is not None:
            given.append((name, {key: value}))
    so = getattr(body, "structured_outputs", None)
    if so is not None:
        if not isinstance(so, dict):
            raise GrammarError("must be an object", "structured_outputs")
        given.append(("structured_outputs", dict(so)))
    if not given:
        return None
    if len(given) > 1:
        names = ", ".join(n for n, _ in given)
        raise GrammarError(f"only one structured output constraint per request, got {names}", given[1][0])
    field, values = given[0]
    try:
        return StructuredOutputsParams(**values, field=field)
    except TypeError as exc:  # an unknown key of structured_outputs
        raise GrammarError(str(exc), field) from None


def _from_format(fmt: ResponseFormat) -> dict[str, Any]:
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.type != "json_schema":
        raise GrammarError(f"unknown type {fmt.type!r} (text, json_object or json_schema)", "response_format")
    schema = (fmt.json_schema or {}).get("schema")
    if schema is None:
        raise GrammarError("json_schema.schema is required", "response_format")
    return {"json": schema}
