"""From an engine's :class:`RequestOutput` to the pieces of an OpenAI answer: token texts,
logprobs in either format, usage, and the final output of a request that does not stream.

Invariants:
  * A token's text is its own decoding (special tokens kept), or its id as a string when the
    model has no tokenizer.
  * :func:`final_outputs` aborts a request's samples when the client disconnects first, which
    frees their pages and slots.
  * ``echo`` returns the prompt (the client's text) before the completion; its logprobs lead with
    the prompt tokens', the first of them null.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Sequence

from fastapi import Request

from radixflow_jax.engine.params import RequestOutput
from radixflow_jax.replicas.background import RequestHandle
from radixflow_jax.serve import responses as R
from radixflow_jax.serve.errors import ENGINE_ERRORS, engine_error
from radixflow_jax.serve.protocol import EngineRequest
from radixflow_jax.serve.tools import parse_tool_calls


def token_text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False) if tokenizer is not None else str(token_id)


def completion_logprobs(tokenizer: Any, out: RequestOutput, start: int, offset: int) -> R.CompletionLogprobs | None:
    """Completions-format logprobs of tokens ``start..`` (``offset``: text offset of token ``start``)."""
    return R.completion_logprobs(out.token_ids, out.logprobs, start, offset, functools.partial(token_text, tokenizer))


def chat_logprobs(tokenizer: Any, out: RequestOutput, start: int) -> R.ChatLogprobs | None:
    """Chat-format logprobs of tokens ``start..``."""
    return R.chat_logprobs(out.token_ids, out.logprobs, start, functools.partial(token_text, tokenizer))


def usage(out: RequestOutput | Sequence[RequestOutput], score_only: bool = False, hide_cached: bool = False) -> R.Usage:
    """Usage of one output or of one prompt's samples: the prompt counted once (its cached tokens
    are the fewest any sample took from the cache: the prompt's own computation; hidden with
    ``hide_cached``), the completion tokens of every returned sample (none when only scored)."""
    outs = [out] if isinstance(out, RequestOutput) else list(out)
    completion = 0 if score_only else sum(len(o.token_ids) for o in outs)
    cached = None if hide_cached else min(o.cached_tokens for o in outs)
    return R.Usage.of(outs[0].prompt_tokens, completion, cached)


def prompt_text(tokenizer: Any, req: EngineRequest) -> str:
    """The prompt as ``echo`` returns it: the client's text, else its ids decoded ("" without a tokenizer)."""
    if req.prompt_text is not None:
        return req.prompt_text
    return tokenizer.decode(req.prompt_ids) if tokenizer is not None else ""


def echo_logprobs(tokenizer: Any, out: RequestOutput) -> tuple[R.CompletionLogprobs, int]:
    """The prompt tokens in completions format (the first token's logprob and alternatives null,
    as OpenAI's ``echo``) and the text offset after them."""
    res, offset = R.CompletionLogprobs(), 0
    for tid, lp in zip(out.prompt_token_ids, out.prompt_logprobs or ()):
        t = token_text(tokenizer, tid)
        res.tokens.append(t)
        res.text_offset.append(offset)
        offset += len(t)
        top: dict[str, float] = {}
        if lp is not None:
            for i, v in zip(lp[1], lp[2]):  # best first
                top.setdefault(token_text(tokenizer, i), v)
        res.token_logprobs.append(None if lp is None else lp[0])
        res.top_logprobs.append(top or None)
    return res, offset


def completion_choice(tokenizer: Any, req: EngineRequest, out: RequestOutput, index: int) -> R.CompletionChoice:
    """One ``/v1/completions`` choice: the completion, after the prompt with ``echo``."""
    text = "" if req.score_only else out.text or ""
    if not req.echo:
        return R.CompletionChoice(
            index=index, text=text, finish_reason=out.finish_reason, logprobs=completion_logprobs(tokenizer, out, 0, 0)
        )
    logprobs = None
    if req.logprobs is not None:
        logprobs, offset = echo_logprobs(tokenizer, out)
        tail = None if req.score_only else completion_logprobs(tokenizer, out, 0, offset)
        for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            getattr(logprobs, name).extend(getattr(tail, name) if tail is not None else ())
    return R.CompletionChoice(
        index=index, text=prompt_text(tokenizer, req) + text, finish_reason=out.finish_reason, logprobs=logprobs
    )


def chat_choice(tokenizer: Any, req: EngineRequest, out: RequestOutput, index: int) -> R.ChatChoice:
    """One chat choice; with tools (``req.tool_names``) the output's ``<tool_call>`` blocks become
    ``message.tool_calls``, the rest the content (None when empty), and ``finish_reason`` is
    ``tool_calls`` when there is a call."""
    text, reason = out.text or "", out.finish_reason
    calls: list[dict[str, Any]] = []
    content: str | None = text
    if req.tool_names is not None:
        content, calls = parse_tool_calls(text, req.tool_names)
        reason = "tool_calls" if calls else reason
    message = R.AssistantMessage(content=content, tool_calls=[R.ToolCall.model_validate(c) for c in calls])
    return R.ChatChoice(index=index, message=message, finish_reason=reason, logprobs=chat_logprobs(tokenizer, out, 0))


async def final_outputs(handles: Sequence[RequestHandle], request: Request) -> list[RequestOutput]:
    """The final outputs of one request's samples (index order); a disconnect aborts them all."""
    results = [asyncio.ensure_future(_last(h)) for h in handles]
    everything, gone = asyncio.gather(*results), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({everything, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not everything.done():  # the client went away first
            for h in handles:
                h.abort()
        return list(await everything)
    except ENGINE_ERRORS as exc:  # ValueError: refused when the engine thread queued it
        for h, r in zip(handles, results):
            if not r.done():
                h.abort()
                r.cancel()
        raise engine_error(exc) from None
    finally:
        gone.cancel()


async def _last(handle: RequestHandle) -> RequestOutput:
    out = None
    async for out in handle.astream():
        pass
    assert out is not None
    return out


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
