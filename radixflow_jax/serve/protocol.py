"""OpenAI request bodies (completions, chat completions) and their translation into engine input.

Importing this module needs only pydantic: the batch-jobs reader and the HTTP server share it.

``parse_body(kind, raw)`` validates a decoded JSON body into :class:`CompletionRequest` or
:class:`ChatCompletionRequest`; ``to_engine_request(body, tokenizer, ...)`` turns a validated body
into an :class:`EngineRequest` (prompt token ids + :class:`SamplingParams`). Both raise
:class:`ProtocolError` naming the offending field (``param``); a server answers it with a 400.

Invariants:
  * Unknown fields are accepted and ignored (clients send vendor extras); known fields that ask
    for something the engine does not do (``suffix``: these models have no fill-in-the-middle
    format; several prompts in one request) raise, never silently ignored.
  * Implemented: temperature, top_p, top_k, min_p, seed, stop, stop_token_ids, ignore_eos, the
    presence / frequency / repetition penalties, logprobs (completions: ``logprobs`` = number of
    alternatives; chat: ``logprobs`` + ``top_logprobs``), ``n`` and ``best_of`` (at most ``max_n``;
    ``best_of`` not with ``stream``), ``logit_bias`` (token-id string keys, biases in [-100, 100]),
    ``min_tokens``, and on completions ``echo`` (with ``logprobs``: prompt logprobs too; with
    ``max_tokens`` 0 the prompt is only scored), structured outputs (``response_format``
    ``json_object`` / ``json_schema``, vLLM's ``guided_json`` / ``guided_regex`` / ``guided_choice``
    / ``guided_grammar`` / ``structured_outputs``: ``serve/structured.py``), and on chat ``tools`` /
    ``tool_choice`` (``serve/tools.py``; ``required`` and a named function constrain the output).
  * Defaults follow the OpenAI API: ``temperature`` 1, ``top_p`` 1; completions ``max_tokens`` 16,
    chat ``max_tokens`` fills the context (``max_model_len - prompt``) when the limit is known.
  * Checks here are the API's own: the body's schema and the answers the OpenAI API defines for it
    (the field named in ``param``, ``context_length_exceeded``, an empty or out-of-vocabulary prompt
    as a 400 on ``prompt``). What the engine can run (penalty window, logprobs, stop strings, the KV
    pool) is checked once, by the engine (``engine/intake.py``), when the request is submitted.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

import pydantic

from radixflow_jax.engine.params import DEFAULT_MAX_N, SamplingParams, UnsupportedParameterError
from radixflow_jax.engine.grammar import GrammarError, StructuredOutputsParams
from radixflow_jax.serve.bodies import ChatCompletionRequest, CompletionRequest
from radixflow_jax.serve.caps import DEFAULT_CAPS, CapError, RequestCaps, check_caps
from radixflow_jax.serve.structured import structured_params
from radixflow_jax.serve.tools import ToolError, ToolPlan, history_calls, render_chat, tool_plan

COMPLETIONS = "completions"
CHAT = "chat"
_DEFAULT_COMPLETION_TOKENS = 16
_NO_SUFFIX = (
    "suffix is not supported: this model has no fill-in-the-middle (insertion) format, so a completion cannot "
    "be conditioned on text after it"
)


class ProtocolError(ValueError):
    """A request body the server must refuse. ``param`` names the field (dotted path) or is None;
    ``status`` is the HTTP status it maps to; ``code`` a short machine-readable reason."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code


class TextTokenizer(Protocol):
    """What translation needs from a tokenizer (``radixflow_jax.models.tokenizer.Tokenizer`` has it)."""

    def encode(self, text: str) -> list[int]: ...

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str: ...


@dataclasses.dataclass(frozen=True)
class EngineRequest:
    """What the engine takes for one body: the prompt ids and the sampling settings, plus the
    response options the server needs (``logprobs``: top alternatives per token, None = off)."""

    kind: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None
    model: str | None = None
    echo: bool = False  # completions: the prompt text (and, with logprobs, its logprobs) comes first
    prompt_text: str | None = None  # the prompt as the client sent it, when it was text
    score_only: bool = False  # echo with max_tokens 0: one token is generated and dropped
    tool_names: tuple[str, ...] | None = None  # chat with tools: the output is parsed for calls of these


def _loc(loc: Sequence[Any]) -> str:
    # pydantic adds union-branch tags such as "str" or "list[int]" to the location: drop them
    parts = [str(p) for p in loc if isinstance(p, int) or not any(c in str(p) for c in "[]") and str(p) not in _TAGS]
    return ".".join(parts) if parts else "body"


_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "TextPart", "literal"}


def parse_body(kind: str, raw: Any) -> CompletionRequest | ChatCompletionRequest:
    """Validates a decoded JSON body; the first validation error becomes a :class:`ProtocolError`."""
    cls = {COMPLETIONS: CompletionRequest, CHAT: ChatCompletionRequest}.get(kind)
    if cls is None:
        raise ValueError(f"unknown request kind {kind!r}")
    if not isinstance(raw, dict):
        raise ProtocolError(f"the request body must be a JSON object, got {type(raw).__name__}", code="invalid_body")
    try:
        return cls.model_validate(raw)
    except pydantic.ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = _loc(err["loc"])
        raise _invalid(where, f"{where}: {err['msg']}") from None


def _invalid(param: str | None, message: str) -> ProtocolError:
    """The error of a value the request may send but did not send validly (400 ``invalid_value``)."""
    return ProtocolError(message, param=param, code="invalid_value")


def _reject_if(condition: bool, param: str, message: str) -> None:
    if condition:
        raise ProtocolError(message, param=param, code="unsupported_parameter")


def _chat_messages(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The messages as template input: text content, ``developer`` as ``system``; an assistant
    message with ``tool_calls`` may have no content, a ``tool`` message keeps its ``tool_call_id``."""
    messages = []
    for i, msg in enumerate(body.messages):
        if isinstance(msg.content, list):
            content = "".join(part.text for part in msg.content)
        elif msg.content is None and not (msg.role == "assistant" and msg.tool_calls):
            raise ProtocolError(f"messages.{i}.content: a message needs content", param=f"messages.{i}.content")
        else:
            content = msg.content or ""
        entry: dict[str, Any] = {"role": "system" if msg.role == "developer" else msg.role, "content": content}
        if msg.tool_calls:
            entry["tool_calls"] = history_calls(msg.tool_calls, f"messages.{i}.tool_calls")
        for key in ("tool_call_id", "name"):
            if getattr(msg, key) is not None:
                entry[key] = getattr(msg, key)
        messages.append(entry)
    return messages


def _chat_prompt(body: ChatCompletionRequest, tokenizer: TextTokenizer | None) -> tuple[list[int], ToolPlan | None]:
    """The prompt ids of a chat (its messages, and its tools, through the chat template) and its
    checked tool plan; bad tools or tool messages are a 400 naming the field."""
    try:
        plan = tool_plan(body.tools, body.tool_choice)
        messages = _chat_messages(body)
    except ToolError as exc:
        raise _invalid(exc.field, str(exc)) from None
    if tokenizer is None:
        raise ProtocolError("messages: this model has no tokenizer or chat template", param="messages")
    try:
        text = render_chat(tokenizer, messages, plan)
    except ValueError as exc:  # TokenizerError: no template, or the template rejected the messages
        raise ProtocolError(f"messages: {exc}", param="messages") from None
    return tokenizer.encode(text), plan


def _prompt_ids(body: CompletionRequest, tokenizer: TextTokenizer | None) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        several = "several prompts in one request are not supported; send one request per prompt"
        _reject_if(len(prompt) != 1, "prompt", several)
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise ProtocolError("prompt: the prompt is empty", param="prompt")
        if tokenizer is None:
            raise ProtocolError("prompt: this model has no tokenizer; send token ids", param="prompt")
        return tokenizer.encode(prompt)
    if not prompt:
        raise ProtocolError("prompt: the prompt is empty", param="prompt")
    return [int(t) for t in prompt]


# sampling fields a body names as SamplingParams does, in SamplingParams' order (which _field_of reads)
_SAME_NAMED = ("ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "n")


def _sampling_dict(body: CompletionRequest | ChatCompletionRequest, max_tokens: int) -> dict[str, Any]:
    stop = body.stop if body.stop is not None else ()
    return {
        "max_tokens": max_tokens,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "seed": body.seed,
        "stop": (stop,) if isinstance(stop, str) else tuple(stop),
        "stop_token_ids": tuple(body.stop_token_ids or ()),
        **{name: getattr(body, name) for name in _SAME_NAMED},
        "best_of": body.best_of,
    }


def _field_of(message: str, names: Sequence[str]) -> str | None:
    for name in names:
        if message.startswith(name + " ") or f"'{name}'" in message:
            return name
    return None


def to_engine_request(
    body: CompletionRequest | ChatCompletionRequest,
    tokenizer: TextTokenizer | None,
    *,
    max_model_len: int | None = None,
    vocab_size: int | None = None,
    max_n: int = DEFAULT_MAX_N,
    caps: RequestCaps = DEFAULT_CAPS,
) -> EngineRequest:
    """Turns a validated body into engine input. Chat messages are rendered with the model's chat
    template; text is tokenized without special tokens (the template carries them). ``max_n``:
    the most samples (``n``, ``best_of``) one request may ask for; ``caps``: the size caps
    (``serve/caps.py``), checked before anything is tokenised or compiled."""
    _check_samples(body, max_n)
    try:
        check_caps(body, caps)
    except CapError as exc:
        raise ProtocolError(str(exc), param=exc.field, code="too_large") from None
    bias = _logit_bias(body.logit_bias, vocab_size)
    if body.stream_options is not None and not body.stream:
        raise ProtocolError("stream_options: only allowed when stream is true", param="stream_options")
    echo = score_only = False
    plan: ToolPlan | None = None
    if isinstance(body, CompletionRequest):
        _reject_if(body.suffix is not None, "suffix", _NO_SUFFIX)
        echo = body.echo
        score_only = echo and body.max_tokens == 0
        if body.logprobs is not None and not 0 <= body.logprobs <= 20:
            raise ProtocolError("logprobs: must be between 0 and 20", param="logprobs")
        ids = _prompt_ids(body, tokenizer)
        logprobs = body.logprobs
        requested = 1 if score_only else body.max_tokens
        default = _DEFAULT_COMPLETION_TOKENS
        kind = COMPLETIONS
    else:
        if body.top_logprobs is not None:
            if not 0 <= body.top_logprobs <= 20:
                raise ProtocolError("top_logprobs: must be between 0 and 20", param="top_logprobs")
            if not body.logprobs:
                raise ProtocolError("top_logprobs: needs logprobs to be true", param="top_logprobs")
        ids, plan = _chat_prompt(body, tokenizer)
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        default = max(1, max_model_len - len(ids)) if max_model_len else _DEFAULT_COMPLETION_TOKENS
        kind = CHAT
    if not ids:
        raise ProtocolError("the prompt encodes to no tokens", param="prompt" if kind == COMPLETIONS else "messages")
    if vocab_size is not None:
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ProtocolError(f"prompt: token id {bad} is outside the vocabulary [0, {vocab_size})", param="prompt")
    max_tokens = default if requested is None else requested
    max_field = "max_completion_tokens" if kind == CHAT and body.max_completion_tokens is not None else "max_tokens"
    if max_tokens < 1:
        raise ProtocolError(f"{max_field}: must be at least 1, got {max_tokens}", param=max_field)
    if max_model_len is not None and len(ids) + max_tokens > max_model_len:
        raise ProtocolError(
            f"this model's maximum context length is {max_model_len} tokens; the request has {len(ids)} prompt "
            f"tokens and asks for {max_tokens} more ({max_field})",
            param=max_field if len(ids) < max_model_len else ("prompt" if kind == COMPLETIONS else "messages"),
            code="context_length_exceeded",
        )
    structured = _constraint(body, plan if kind == CHAT else None)
    values = {**_sampling_dict(body, max_tokens), "logit_bias": bias, "structured_outputs": structured}
    if logprobs is not None:
        values["logprobs"] = logprobs
        if echo:
            values["prompt_logprobs"] = logprobs
    params = _params(values)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    names = plan.names if kind == CHAT and plan is not None and plan.parses else None
    return EngineRequest(
        kind=kind, prompt_ids=ids, params=params, stream=body.stream, include_usage=include_usage, logprobs=logprobs,
        model=body.model, echo=echo, prompt_text=_prompt_text(body), score_only=score_only, tool_names=names,
    )


def _constraint(
    body: CompletionRequest | ChatCompletionRequest, plan: ToolPlan | None
) -> StructuredOutputsParams | None:
    """The body's structured-output constraint, or the grammar a forced ``tool_choice`` (chat's
    ``plan``) imposes; both at once is a 400 on ``tool_choice``."""
    try:
        structured = structured_params(body)
        forced = plan.grammar() if plan is not None else None
        if forced is None:
            return structured
        _reject_if(
            structured is not None,
            "tool_choice",
            f"tool_choice {body.tool_choice!r} cannot be combined "
            f"with another structured output constraint ({structured and structured.field})",
        )
        return StructuredOutputsParams(grammar=forced, field="tool_choice")
    except GrammarError as exc:
        raise _invalid(exc.field, str(exc)) from None


def _params(values: dict[str, Any]) -> SamplingParams:
    """The engine's params of the body's sampling values; their refusals name the field."""
    try:
        return SamplingParams.from_dict(values)
    except UnsupportedParameterError as exc:
        param = _field_of(str(exc), list(values))
        raise ProtocolError(str(exc), param=param, code="unsupported_parameter") from None
    except (ValueError, TypeError) as exc:
        param = _field_of(str(exc), list(values))
        raise _invalid(param, str(exc)) from None


def _prompt_text(body: CompletionRequest | ChatCompletionRequest) -> str | None:
    """A completion's prompt when the client sent text (one string, or a list of one), else None."""
    text: Any = body.prompt if isinstance(body, CompletionRequest) else None
    if isinstance(text, list) and len(text) == 1 and isinstance(text[0], str):
        text = text[0]
    return text if isinstance(text, str) else None


def _check_samples(body: CompletionRequest | ChatCompletionRequest, max_n: int) -> None:
    """``n`` and ``best_of``: 1..max_n, ``best_of >= n``, no ``best_of > 1`` with ``stream`` (as vLLM)."""
    n = 1 if body.n is None else body.n
    if not 1 <= n <= max_n:
        raise _invalid("n", f"n: must be between 1 and {max_n} (this server's --max-n), got {n}")
    if body.best_of is None:
        return
    if not n <= body.best_of <= max_n:
        raise _invalid(
            "best_of", f"best_of: must be between n ({n}) and {max_n} (this server's --max-n), got {body.best_of}"
        )
    if body.stream and body.best_of > 1:
        raise _invalid(
            "best_of", "best_of: cannot be used with stream=true (candidates are ranked when all have finished)"
        )


def _logit_bias(bias: dict[str, float] | None, vocab_size: int | None) -> dict[int, float] | None:
    """``logit_bias`` with integer keys: each key a token id (a decimal string) inside the
    vocabulary when it is known, each value in [-100, 100]; anything else is a 400 on ``logit_bias``."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        token = key.strip()
        if not (token.isdigit() or (token.startswith("-") and token[1:].isdigit())):
            raise _invalid("logit_bias", f"logit_bias: key {key!r} is not a token id (an integer)")
        tid = int(token)
        if tid < 0 or (vocab_size is not None and tid >= vocab_size):
            where = f"[0, {vocab_size})" if vocab_size is not None else "the vocabulary"
            raise _invalid("logit_bias", f"logit_bias: token id {tid} is outside the vocabulary {where}")
        if not -100 <= value <= 100:
            raise _invalid("logit_bias", f"logit_bias: the bias of token {tid} must be in [-100, 100], got {value}")
        out[tid] = float(value)
    return out
