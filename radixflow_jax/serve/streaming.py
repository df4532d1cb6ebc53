"""Server-sent events of a streamed completion or chat completion.

Invariants:
  * A stream is ``data: {json}\\n\\n`` chunks (compact JSON), then ``data: [DONE]\\n\\n``; an
    engine failure mid-stream is one error-envelope chunk before ``[DONE]``.
  * Text deltas never split a UTF-8 character and never leak the start of a stop string that
    later completes (:class:`TextStream`).
  * Each sampled token's logprobs are sent exactly once, with the chunk that first carries them.
  * A stream that ends before the final event (client gone, cancelled, or stalled: a send not
    taken within the stream timeout, :class:`TimedStreamingResponse`) aborts its request.
  * Backpressure: nothing queues between the engine and the socket; each chunk carries the delta
    between the newest snapshot and what was sent before (text, tokens' logprobs), so a reader
    that falls behind gets fewer, larger chunks with the same concatenation.
  * With tools, text before a ``<tool_call>`` streams as content; each call comes whole, as one
    ``delta.tool_calls`` chunk, when its block closes (``serve/tools.ToolStream``).
  * ``n`` samples share one stream: each chunk carries one sample's ``choices[].index``; the usage
    chunk (``include_usage``) counts the prompt once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import Any, AsyncIterator, Sequence

from fastapi.responses import StreamingResponse

from radixflow_jax.engine.params import RequestOutput
from radixflow_jax.replicas.background import RequestHandle
from radixflow_jax.serve import protocol
from radixflow_jax.serve import responses as R
from radixflow_jax.serve.errors import ENGINE_ERRORS, engine_error
from radixflow_jax.serve.outputs import chat_logprobs, completion_logprobs, echo_logprobs, prompt_text, usage
from radixflow_jax.serve.protocol import EngineRequest
from radixflow_jax.serve.tools import ToolStream


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class TextStream:
    """Emits the growth of a detokenised text: holds back ``hold`` trailing characters (a stop
    string may still complete there) and a trailing U+FFFD (an unfinished UTF-8 sequence)."""

    def __init__(self, hold: int):
        self.hold = hold
        self.sent = 0

    def delta(self, text: str, final: bool) -> str:
        upto = len(text) if final else len(text) - self.hold
        if not final:
            while upto > self.sent and text[upto - 1] == "\ufffd":
                upto -= 1
        if upto <= self.sent:
            return ""
        out, self.sent = text[self.sent : upto], upto
        return out


class Chunks:
    """The chunk bodies of one sample's part of a stream (``choices[0].index`` = ``index``);
    remembers how many tokens' logprobs (and, for completions, how much text offset) were sent."""

    def __init__(self, rid: str, model: str, chat: bool, tokenizer: Any, include_usage: bool, index: int = 0):
        self.rid, self.model, self.chat, self.tokenizer, self.index = rid, model, chat, tokenizer, index
        self.created = int(time.time())
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self.usage_field: dict[str, Any] = {"usage": None} if include_usage else {}
        self.lp_sent, self.offset = 0, 0

    def _logprobs(self, out: RequestOutput | None) -> dict[str, Any] | None:
        if out is None or out.logprobs is None or len(out.logprobs) <= self.lp_sent:
            return None
        if self.chat:
            lp = chat_logprobs(self.tokenizer, out, self.lp_sent).model_dump()  # type: ignore[union-attr]
        else:
            lp = completion_logprobs(self.tokenizer, out, self.lp_sent, self.offset).model_dump()  # type: ignore[union-attr]
            self.offset += sum(len(t) for t in lp["tokens"])
        self.lp_sent = len(out.logprobs)
        return lp

    def chunk(
        self, delta: str | None, reason: str | None, first: bool = False, out: RequestOutput | None = None
    ) -> dict[str, Any]:
        return self._body(delta, reason, first, self._logprobs(out))

    def tool_chunk(self, calls: list[dict[str, Any]]) -> dict[str, Any]:
        """A chat chunk whose delta is whole parsed calls (each with its ``index``)."""
        choice = {"index": self.index, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}
        return self._envelope([choice], **self.usage_field)

    def echo(self, req: EngineRequest, out: RequestOutput) -> dict[str, Any]:
        """Completions ``echo``: the chunk with the prompt text (and, with logprobs, the prompt's)."""
        lp = None
        if req.logprobs is not None:
            logprobs, self.offset = echo_logprobs(self.tokenizer, out)
            lp = logprobs.model_dump()
        return self._body(prompt_text(self.tokenizer, req), None, False, lp)

    def _body(self, delta: str | None, reason: str | None, first: bool, lp: dict[str, Any] | None) -> dict[str, Any]:
        if self.chat:
            d = {"role": "assistant", "content": delta or ""} if first else ({"content": delta} if delta else {})
            choice = {"index": self.index, "delta": d, "logprobs": lp, "finish_reason": reason}
        else:
            choice = {"index": self.index, "text": delta or "", "logprobs": lp, "finish_reason": reason}
        return self._envelope([choice], **self.usage_field)

    def usage_chunk(
        self, outs: Sequence[RequestOutput], score_only: bool = False, hide: bool = False
    ) -> dict[str, Any]:
        return self._envelope([], usage=usage(outs, score_only, hide_cached=hide).model_dump())

    def _envelope(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """A chunk of this stream: its id, object, creation time and model around ``choices``."""
        return {"id": self.rid, "object": self.object, "created": self.created, "model": self.model, "choices": choices,
                **extra}


async def merged(handles: Sequence[RequestHandle]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """The newest snapshot of each handle as it comes, as ``(index, output)``; an error event of
    any raises here. Each handle has at most one read pending and nothing is queued between the
    handles and the caller: while the caller does not pull (a slow client), every handle keeps just
    its latest state (``RequestHandle``). The reads stop when the caller stops iterating."""
    streams = [h.astream() for h in handles]
    pending = {asyncio.ensure_future(s.__anext__()): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=pending.__getitem__):
                i = pending.pop(task)
                try:
                    out = task.result()
                except StopAsyncIteration:
                    continue
                yield i, out
                if not out.finished:
                    pending[asyncio.ensure_future(streams[i].__anext__())] = i
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for s in streams:
            await s.aclose()


class StalledStream(Exception):
    """The client did not take a chunk within the stream timeout."""


class TimedStreamingResponse(StreamingResponse):
    """A streaming response whose every send must complete within ``send_timeout`` seconds: a
    client that stops reading fills the socket buffers, the send blocks, and after the timeout the
    stream ends (its body iterator is closed, which aborts the request) and the connection drops."""

    def __init__(self, content: AsyncIterator[bytes], *, send_timeout: float | None, **kwargs: Any):
        super().__init__(content, **kwargs)
        self.send_timeout = send_timeout

    async def stream_response(self, send: Any) -> None:
        async def timed_send(message: Any) -> None:
            try:
                await asyncio.wait_for(send(message), self.send_timeout)
            except asyncio.TimeoutError:
                raise StalledStream(f"the client took no data for {self.send_timeout} s") from None

        try:
            await super().stream_response(timed_send if self.send_timeout else send)
        except StalledStream as exc:
            logging.getLogger(__name__).warning("stream aborted: %s", exc)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


async def stream(
    handles: Sequence[RequestHandle], req: EngineRequest, rid: str, model: str, tokenizer: Any,
    hide_cached: bool = False,
) -> AsyncIterator[bytes]:
    """The SSE body of a streamed request, its samples' chunks interleaved as they come (each with
    its ``choices[].index``; chat: a first chunk with the assistant role per sample; completions
    with ``echo``: the prompt before a sample's first text)."""
    chat = req.kind == protocol.CHAT
    chunks = [Chunks(rid, model, chat, tokenizer, req.include_usage, i) for i in range(len(handles))]
    hold = max((len(s) for s in req.params.stop), default=1) - 1
    texts = [TextStream(hold) for _ in handles]
    calls = [ToolStream(req.tool_names) if req.tool_names is not None else None for _ in handles]
    finals: list[RequestOutput | None] = [None] * len(handles)
    echoed = [False] * len(handles)
    events = merged(handles)
    try:
        if chat:
            for c in chunks:
                yield sse(c.chunk("", None, first=True))
        async for i, out in events:
            if req.echo and not echoed[i]:
                echoed[i] = True
                yield sse(chunks[i].echo(req, out))
            if req.score_only:
                out = dataclasses.replace(out, text="", logprobs=None)
            delta = texts[i].delta(out.text or "", out.finished)
            reason = out.finish_reason
            tool_stream = calls[i]
            if tool_stream is not None:
                delta, found = tool_stream.feed(delta, out.finished)
                if found:
                    yield sse(chunks[i].tool_chunk(found))
                reason = "tool_calls" if tool_stream.calls and out.finished else reason
            if out.finished:
                finals[i] = out
                yield sse(chunks[i].chunk(delta, reason, out=out))
            elif delta:
                yield sse(chunks[i].chunk(delta, None, out=out))
        done = [o for o in finals if o is not None]
        if req.include_usage and done:
            yield sse(chunks[0].usage_chunk(done, req.score_only, hide_cached))
    except ENGINE_ERRORS as exc:  # ValueError: refused when the engine thread queued it
        err = engine_error(exc)
        yield sse(R.error_body(err.status, err.message, err.param, err.code))
    finally:
        await events.aclose()  # its readers stop now, not when the loop finalises it
        for handle, final in zip(handles, finals):
            if final is None:
                handle.abort()  # client gone, cancelled or failed: free the request's pages and slots
    yield sse("[DONE]")
