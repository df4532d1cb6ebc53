"""``POST /v1/completions`` and ``POST /v1/chat/completions``: parse, check, submit, then answer
with one JSON body or a server-sent event stream.

Invariants:
  * The checks run in this order: engine alive, body read (size), queue room for one request
    (429), then on a preparation worker (``serve/prepare.py``): body decoded (depth) and parsed,
    model name, caps, translation to an engine request (prompt limits); then queue room for its
    samples; the first failing one answers.
  * A request for ``n`` samples (``best_of`` candidates) runs as sibling requests; its answer has
    ``n`` choices (the best by cumulative logprob, best first, with ``best_of``), ``choices[].index``
    0..n-1, and usage counting the prompt once.
  * Ids are ``cmpl-<32 hex>`` / ``chatcmpl-<32 hex>``; a stream answers ``text/event-stream`` with
    ``Cache-Control: no-cache`` and ``X-Accel-Buffering: no``.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from radixflow_jax.engine.grammar import GrammarError
from radixflow_jax.serve import protocol
from radixflow_jax.serve import responses as R
from radixflow_jax.serve.checks import admit, check_alive, check_model, read_body, submit
from radixflow_jax.serve.prepare import decode_json
from radixflow_jax.engine.siblings import choose, expand, is_group
from radixflow_jax.serve.outputs import chat_choice, completion_choice, final_outputs, usage
from radixflow_jax.serve.state import RouteGroup
from radixflow_jax.serve.streaming import TimedStreamingResponse, stream


class CompletionRoutes(RouteGroup):
    """The two generation routes over one server's state."""

    def routes(self) -> list[tuple[str, Callable[..., Any], str]]:
        return [("/v1/completions", self.completions, "POST"), ("/v1/chat/completions", self.chat_completions, "POST")]

    async def completions(self, request: Request) -> Response:
        return await self.generate(request, protocol.COMPLETIONS)

    async def chat_completions(self, request: Request) -> Response:
        return await self.generate(request, protocol.CHAT)

    def prepare(self, kind: str, raw: bytes) -> protocol.EngineRequest:
        """The engine request of a body (on a preparation worker: decoding, validation, caps,
        tokenising, the chat template, tools and structured-output conversion)."""
        state = self.state
        body = protocol.parse_body(kind, decode_json(raw, state.config.caps))
        check_model(state.config, body.model)
        req = protocol.to_engine_request(
            body,
            state.tokenizer,
            max_model_len=state.max_model_len,
            vocab_size=state.vocab_size,
            max_n=state.engine.core.limits.max_n,
            caps=state.config.caps,
        )
        spec = req.params.structured_outputs
        if spec is not None and state.grammars is not None:
            try:  # off the engine thread: compile and compute the first mask, refuse what is too costly
                state.grammars.trial(spec, state.config.grammar_trial_s)
            except GrammarError as exc:
                raise protocol.ProtocolError(str(exc), param=exc.field, code="grammar_too_complex") from None
        return req

    async def generate(self, request: Request, kind: str) -> Response:
        state = self.state
        check_alive(state)
        raw = await read_body(request, state.config)
        admit(state)  # 429 before any preparation work
        req = await state.preparer.run(functools.partial(self.prepare, kind, raw))
        handles = submit(state, req)
        rid = ("chatcmpl-" if kind == protocol.CHAT else "cmpl-") + uuid.uuid4().hex
        hide = state.config.private_cache_stats
        if req.stream:
            events = stream(handles, req, rid, state.config.model_name, state.tokenizer, hide_cached=hide)
            return TimedStreamingResponse(
                events, send_timeout=state.config.stream_timeout_s, media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        outs = await final_outputs(handles, request)
        if is_group(req.params):
            outs = choose(expand(req.params), outs)
        name, tok = state.config.model_name, state.tokenizer
        if kind == protocol.CHAT:
            choices = [chat_choice(tok, req, out, i) for i, out in enumerate(outs)]
            resp: R.ChatCompletionResponse | R.CompletionResponse = R.ChatCompletionResponse(
                id=rid, model=name, choices=choices, usage=usage(outs, hide_cached=hide))
        else:
            choices = [completion_choice(tok, req, out, i) for i, out in enumerate(outs)]
            resp = R.CompletionResponse(
                id=rid, model=name, choices=choices, usage=usage(outs, req.score_only, hide_cached=hide))
        return JSONResponse(resp.model_dump())
