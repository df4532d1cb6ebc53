"""``POST /v1/completions`` and ``POST /v1/chat/completions``: parse, check, submit, then answer
with one JSON body or a server-sent event stream.

Invariants:
  * The checks run in this order: engine alive, body read and parsed, model name, translation to
    an engine request (prompt limits), queue room; the first failing one answers.
  * Ids are ``cmpl-<32 hex>`` / ``chatcmpl-<32 hex>``; a stream answers ``text/event-stream`` with
    ``Cache-Control: no-cache`` and ``X-Accel-Buffering: no``.
"""

from __future__ import annotations

import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixflow_jax.serve import protocol
from radixflow_jax.serve import responses as R
from radixflow_jax.serve.checks import check_alive, check_model, read_json, submit
from radixflow_jax.serve.outputs import chat_logprobs, completion_logprobs, final_output, usage
from radixflow_jax.serve.state import ServerState
from radixflow_jax.serve.streaming import stream


class CompletionRoutes:
    """The two generation routes over one server's state."""

    def __init__(self, state: ServerState):
        self.state = state

    def register(self, app: FastAPI) -> None:
        app.add_api_route("/v1/completions", self.completions, methods=["POST"])
        app.add_api_route("/v1/chat/completions", self.chat_completions, methods=["POST"])

    async def completions(self, request: Request) -> Response:
        return await self.generate(request, protocol.COMPLETIONS)

    async def chat_completions(self, request: Request) -> Response:
        return await self.generate(request, protocol.CHAT)

    async def generate(self, request: Request, kind: str) -> Response:
        state = self.state
        check_alive(state)
        body = protocol.parse_body(kind, await read_json(request, state.config))
        check_model(state.config, body.model)
        req = protocol.to_engine_request(body, state.tokenizer, max_model_len=state.max_model_len,
                                         vocab_size=state.vocab_size)  # fmt: skip
        handle = submit(state, req)
        rid = ("chatcmpl-" if kind == protocol.CHAT else "cmpl-") + uuid.uuid4().hex
        if req.stream:
            events = stream(handle, req, rid, state.config.model_name, state.tokenizer)
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
        out = await final_output(handle, request)
        name, tok = state.config.model_name, state.tokenizer
        if kind == protocol.CHAT:
            choice = R.ChatChoice(message=R.AssistantMessage(content=out.text or ""), finish_reason=out.finish_reason,
                                  logprobs=chat_logprobs(tok, out, 0))  # fmt: skip
            resp: R.ChatCompletionResponse | R.CompletionResponse = R.ChatCompletionResponse(
                id=rid, model=name, choices=[choice], usage=usage(out))
        else:
            choice = R.CompletionChoice(text=out.text or "", finish_reason=out.finish_reason,
                                        logprobs=completion_logprobs(tok, out, 0, 0))  # fmt: skip
            resp = R.CompletionResponse(id=rid, model=name, choices=[choice], usage=usage(out))
        return JSONResponse(resp.model_dump())
