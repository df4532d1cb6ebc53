"""OpenAI response bodies (pydantic models) and the error envelope.

``usage.prompt_tokens_details.cached_tokens`` is present unless the server hides it
(``--private-cache-stats``: ``prompt_tokens_details`` is null): prompt tokens this request took
from the prefix cache (KV pages and a recurrent checkpoint) instead of computing them.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Generic, Literal, Sequence, TypeVar

from pydantic import BaseModel, Field

# HTTP status -> OpenAI error type
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    info = ErrorInfo(message=message, type=ERROR_TYPES.get(status, "invalid_request_error"), param=param, code=code)
    return ErrorResponse(error=info).model_dump()


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> Usage:
        """``cached_tokens`` None: the details are hidden (null)."""
        details = None if cached_tokens is None else PromptTokensDetails(cached_tokens=cached_tokens)
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=details,
        )


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


LogprobsT = TypeVar("LogprobsT", bound=BaseModel)


class _Choice(BaseModel, Generic[LogprobsT]):
    """What every choice of an answer carries besides its content: its index among the answer's
    choices, its logprobs (None unless asked for) and why it finished (None while streaming)."""

    index: int = 0
    logprobs: LogprobsT | None = None
    finish_reason: str | None = None


class CompletionChoice(_Choice[CompletionLogprobs]):
    text: str


class _Answer(BaseModel):
    """What every OpenAI completion answer carries: its id, creation time (Unix seconds) and model."""

    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


class CompletionResponse(_Answer):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    """``content`` None only when the message carries ``tool_calls``."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(_Choice[ChatLogprobs]):
    message: AssistantMessage


class ChatCompletionResponse(_Answer):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "radixflow"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


Logprobs = Sequence[tuple[float, Sequence[int], Sequence[float]]]


def completion_logprobs(
    token_ids: Sequence[int], logprobs: Logprobs | None, start: int, offset: int, text: Callable[[int], str]
) -> CompletionLogprobs | None:
    """Completions-format logprobs of tokens ``start..`` (``offset``: text offset of token ``start``).
    Alternatives that decode to the same text share a key: the best value is kept."""
    if logprobs is None:
        return None
    res = CompletionLogprobs()
    for tid, (lp, ids, lps) in zip(token_ids[start:], logprobs[start:]):
        t = text(tid)
        res.tokens.append(t)
        res.token_logprobs.append(lp)
        top: dict[str, float] = {}
        for i, v in zip(ids, lps):  # best first
            top.setdefault(text(i), v)
        res.top_logprobs.append(top or None)
        res.text_offset.append(offset)
        offset += len(t)
    return res


def chat_logprobs(
    token_ids: Sequence[int], logprobs: Logprobs | None, start: int, text: Callable[[int], str]
) -> ChatLogprobs | None:
    if logprobs is None:
        return None
    content = []
    for tid, (lp, ids, lps) in zip(token_ids[start:], logprobs[start:]):
        t = text(tid)
        tops = [TopLogprob(token=text(i), logprob=v, bytes=list(text(i).encode())) for i, v in zip(ids, lps)]
        content.append(TokenLogprob(token=t, logprob=lp, bytes=list(t.encode()), top_logprobs=tops))
    return ChatLogprobs(content=content)
