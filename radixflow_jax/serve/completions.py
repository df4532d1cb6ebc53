"""``POST /v1/completions`` and ``POST /v1/chat/completions``: parse, check, submit, then answer
with one JSON body or a server-sent event stream.

Invariants:
  * The checks run in this order: engine alive, body read and parsed, model name, translation to
    an engine request (prompt limits), queue room; the first failing one answers.
  * A request for ``n`` samples (``best_of`` candidates) runs as sibling requests; its answer has
    ``n`` choices (the best by cumulative logprob, best first, with ``best_of``), ``choices[].index``
    0..n-1, and usage counting the prompt once.
  * Ids are ``cmpl-<32 hex>`` / ``chatcmpl-<32 hex>``; a stream answers ``text/event-stream`` with
    ``Cache-Control: no-cache`` and ``X-Accel-Buffering: no``.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixflow_jax.serve import protocol
from radixflow_jax.serve import responses as R
from radixflow_jax.serve.checks import check_alive, check_model, read_json, submit
from radixflow_jax.engine.siblings import choose, expand, is_group
from radixflow_jax.serve.outputs import chat_choice, completion_choice, final_outputs, usage
from radixflow_jax.serve.state import RouteGroup
from radixflow_jax.serve.streaming import stream


class CompletionRoutes(RouteGroup):
    """The two generation routes over one server's state."""

    def routes(self) -> list[tuple[str, Callable[..., Any], str]]:
        return [("/v1/completions", self.completions, "POST"), ("/v1/chat/completions", self.chat_completions, "POST")]

    async def completions(self, request: Request) -> Response:
        return await self.generate(request, protocol.COMPLETIONS)

    async def chat_completions(self, request: Request) -> Response:
        return await self.generate(request, protocol.CHAT)

    async def generate(self, request: Request, kind: str) -> Response:
        state = self.state
        check_alive(state)
        body = protocol.parse_body(kind, await read_json(request, state.config))
        check_model(state.config, body.model)
        req = protocol.to_engine_request(
            body,
            state.tokenizer,
            max_model_len=state.max_model_len,
            vocab_size=state.vocab_size,
            max_n=state.engine.core.limits.max_n,
        )
        handles = submit(state, req)
        rid = ("chatcmpl-" if kind == protocol.CHAT else "cmpl-") + uuid.uuid4().hex
        if req.stream:
            events = stream(handles, req, rid, state.config.model_name, state.tokenizer)
            return StreamingResponse(
                events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            )
        outs = await final_outputs(handles, request)
        if is_group(req.params):
            outs = choose(expand(req.params), outs)
        name, tok = state.config.model_name, state.tokenizer
        if kind == protocol.CHAT:
            choices = [chat_choice(tok, req, out, i) for i, out in enumerate(outs)]
            resp: R.ChatCompletionResponse | R.CompletionResponse = R.ChatCompletionResponse(
                id=rid, model=name, choices=choices, usage=usage(outs))
        else:
            choices = [completion_choice(tok, req, out, i) for i, out in enumerate(outs)]
            resp = R.CompletionResponse(id=rid, model=name, choices=choices, usage=usage(outs, req.score_only))
        return JSONResponse(resp.model_dump())
