"""From an engine's :class:`RequestOutput` to the pieces of an OpenAI answer: token texts,
logprobs in either format, usage, and the final output of a request that does not stream.

Invariants:
  * A token's text is its own decoding (special tokens kept), or its id as a string when the
    model has no tokenizer.
  * :func:`final_output` aborts the request when the client disconnects first, which frees its
    pages and slots.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from fastapi import Request

from radixflow_jax.engine.params import RequestOutput
from radixflow_jax.replicas.background import RequestHandle
from radixflow_jax.serve import responses as R
from radixflow_jax.serve.errors import ENGINE_ERRORS, engine_error


def token_text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False) if tokenizer is not None else str(token_id)


def completion_logprobs(tokenizer: Any, out: RequestOutput, start: int, offset: int) -> R.CompletionLogprobs | None:
    """Completions-format logprobs of tokens ``start..`` (``offset``: text offset of token ``start``)."""
    return R.completion_logprobs(out.token_ids, out.logprobs, start, offset, functools.partial(token_text, tokenizer))


def chat_logprobs(tokenizer: Any, out: RequestOutput, start: int) -> R.ChatLogprobs | None:
    """Chat-format logprobs of tokens ``start..``."""
    return R.chat_logprobs(out.token_ids, out.logprobs, start, functools.partial(token_text, tokenizer))


def usage(out: RequestOutput) -> R.Usage:
    return R.Usage.of(out.prompt_tokens, len(out.token_ids), out.cached_tokens)


async def _last(handle: RequestHandle) -> RequestOutput:
    out = None
    async for out in handle.astream():
        pass
    assert out is not None
    return out


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def final_output(handle: RequestHandle, request: Request) -> RequestOutput:
    """Waits for the final event; aborts the request if the client goes away first."""
    result, gone = asyncio.ensure_future(_last(handle)), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not result.done():
            handle.abort()
        return await result
    except ENGINE_ERRORS as exc:  # ValueError: refused when the engine thread queued it
        raise engine_error(exc) from None
    finally:
        gone.cancel()
