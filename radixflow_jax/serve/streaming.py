"""Server-sent events of a streamed completion or chat completion.

Invariants:
  * A stream is ``data: {json}\\n\\n`` chunks (compact JSON), then ``data: [DONE]\\n\\n``; an
    engine failure mid-stream is one error-envelope chunk before ``[DONE]``.
  * Text deltas never split a UTF-8 character and never leak the start of a stop string that
    later completes (:class:`TextStream`).
  * Each sampled token's logprobs are sent exactly once, with the chunk that first carries them.
  * A stream that ends before the final event (client gone, cancelled) aborts its request.
"""

from __future__ import annotations

import json
import time
from typing import Any, AsyncIterator

from radixflow_jax.engine.params import RequestOutput
from radixflow_jax.replicas.background import RequestHandle
from radixflow_jax.serve import protocol
from radixflow_jax.serve import responses as R
from radixflow_jax.serve.errors import ENGINE_ERRORS, engine_error
from radixflow_jax.serve.outputs import chat_logprobs, completion_logprobs, usage
from radixflow_jax.serve.protocol import EngineRequest


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
    """The chunk bodies of one stream; remembers how many tokens' logprobs (and, for completions,
    how much text offset) were already sent."""

    def __init__(self, rid: str, model: str, chat: bool, tokenizer: Any, include_usage: bool):
        self.rid, self.model, self.chat, self.tokenizer = rid, model, chat, tokenizer
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

    def chunk(self, delta: str | None, reason: str | None, first: bool = False,
              out: RequestOutput | None = None) -> dict[str, Any]:  # fmt: skip
        lp = self._logprobs(out)
        if self.chat:
            d = {"role": "assistant", "content": delta or ""} if first else ({"content": delta} if delta else {})
            choice = {"index": 0, "delta": d, "logprobs": lp, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": lp, "finish_reason": reason}
        return {"id": self.rid, "object": self.object, "created": self.created, "model": self.model,
                "choices": [choice], **self.usage_field}  # fmt: skip

    def usage_chunk(self, out: RequestOutput) -> dict[str, Any]:
        return {"id": self.rid, "object": self.object, "created": self.created, "model": self.model,
                "choices": [], "usage": usage(out).model_dump()}  # fmt: skip


async def stream(handle: RequestHandle, req: EngineRequest, rid: str, model: str, tokenizer: Any) -> AsyncIterator[bytes]:
    """The SSE body of a streamed request (chat: a first chunk with the assistant role)."""
    chat = req.kind == protocol.CHAT
    chunks = Chunks(rid, model, chat, tokenizer, req.include_usage)
    text = TextStream(max((len(s) for s in req.params.stop), default=1) - 1)
    finished = False
    try:
        if chat:
            yield sse(chunks.chunk("", None, first=True))
        out = None
        async for out in handle.astream():
            delta = text.delta(out.text or "", out.finished)
            if out.finished:
                finished = True
                yield sse(chunks.chunk(delta, out.finish_reason, out=out))
            elif delta:
                yield sse(chunks.chunk(delta, None, out=out))
        if req.include_usage and out is not None:
            yield sse(chunks.usage_chunk(out))
    except ENGINE_ERRORS as exc:  # ValueError: refused when the engine thread queued it
        finished = True
        err = engine_error(exc)
        yield sse(R.error_body(err.status, err.message, err.param, err.code))
    finally:
        if not finished:
            handle.abort()  # client gone (or cancelled): free the request's pages and slots
    yield sse("[DONE]")
