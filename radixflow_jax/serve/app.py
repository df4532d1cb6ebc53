"""The OpenAI-compatible HTTP layer (FastAPI) over a :class:`BackgroundEngine`. No scheduling here.

Invariants:
  * Every error leaves as the OpenAI envelope ``{"error": {"message", "type", "param", "code"}}``:
    400 for malformed JSON and invalid fields (never FastAPI's 422), 401 for a missing or wrong key
    (compared in constant time; ``/health`` and ``/metrics`` stay open), 404 for an unknown model or
    route, 413 for a body over the limit, 429 + ``Retry-After`` while the waiting queue is at
    ``max_waiting``, 503 while draining or after the engine died, 500 (``step_failed``) for a request
    whose rounds' step kept failing while the engine recovered and went on serving.
  * A request whose client disconnects is aborted, which frees its pages and slots.
  * A stream is ``data: {json}\\n\\n`` chunks, then ``data: [DONE]\\n\\n``; text deltas never split a
    UTF-8 character and never leak the start of a stop string that later completes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixflow_jax.replicas.background import BackgroundEngine, EngineDeadError, RequestFailedError, RequestHandle
from radixflow_jax.engine.params import RequestOutput
from radixflow_jax.replicas.replicated import ReplicatedEngine
from radixflow_jax.serve import protocol
from radixflow_jax.serve import responses as R
from radixflow_jax.serve.metrics import ServerMetrics
from radixflow_jax.serve.protocol import EngineRequest, ProtocolError

OPEN_PATHS = frozenset({"/health", "/metrics"})


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    model_name: str
    api_key: str | None = None
    max_waiting: int | None = None
    max_body_bytes: int = 4 << 20
    retry_after_s: int = 1


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


@dataclasses.dataclass
class ServerState:
    engine: BackgroundEngine | ReplicatedEngine  # data-parallel replicas behind a router: ReplicatedEngine
    tokenizer: Any
    metrics: ServerMetrics
    config: ServerConfig
    max_model_len: int
    vocab_size: int | None
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    draining: bool = False

    @property
    def replicas(self) -> list[BackgroundEngine]:
        return list(self.engine.replicas) if isinstance(self.engine, ReplicatedEngine) else [self.engine]


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


class ApiKeyMiddleware:
    """Pure ASGI (streams and disconnects pass through untouched): every path except
    ``OPEN_PATHS`` needs ``Authorization: Bearer KEY``, compared in constant time."""

    def __init__(self, app: Any, key: str, reject: Any):
        self.app, self.key, self.reject = app, key.encode(), reject

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            token = header[7:] if header[:7].lower() == b"bearer " else b""
            if not hmac.compare_digest(token, self.key):
                await self.reject()(scope, receive, send)
                return
        await self.app(scope, receive, send)


ENGINE_ERRORS = (EngineDeadError, RequestFailedError, ValueError)


def engine_error(exc: EngineDeadError | RequestFailedError | ValueError, param: str | None = None) -> ApiError:
    """The API error for a failure the engine reports about one request, one mapping for submission,
    waiting and streaming: a dead engine is 503, a request whose rounds kept failing is 500
    ``step_failed``, a request the engine refused (``ValueError``) is 400."""
    if isinstance(exc, EngineDeadError):
        return ApiError(503, str(exc), code="engine_dead")
    if isinstance(exc, RequestFailedError):
        return ApiError(500, str(exc), code="step_failed")
    return ApiError(400, str(exc), param=param)


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="radixflow serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    cfg, engine, metrics = state.config, state.engine, state.metrics

    def error_response(status: int, message: str, param=None, code=None, headers=None) -> JSONResponse:
        metrics.error(status)
        return JSONResponse(R.error_body(status, message, param, code), status_code=status, headers=headers)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)

    @app.exception_handler(ProtocolError)
    async def _protocol_error(_: Request, exc: ProtocolError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in err["loc"]) or None
        return error_response(400, f"{where}: {err['msg']}" if where else err["msg"], where)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404 and message == "Not Found":
            message = "no such route"
        return error_response(exc.status_code, message)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    if cfg.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, key=cfg.api_key, reject=lambda: error_response(
            401, "missing or invalid API key (send 'Authorization: Bearer KEY')", code="invalid_api_key"))  # fmt: skip

    # ------------------------------------------------------------------ helpers
    async def read_json(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cfg.max_body_bytes:
            raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {cfg.max_body_bytes}")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > cfg.max_body_bytes:
                raise ApiError(413, f"request body exceeds the limit of {cfg.max_body_bytes} bytes")
        if not body:
            raise ApiError(400, "the request body is empty; expected a JSON object", code="invalid_body")
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None

    def check_model(name: str | None) -> None:
        if name is not None and name != cfg.model_name:
            raise ApiError(404, f"the model '{name}' does not exist; this server serves '{cfg.model_name}'",
                           param="model", code="model_not_found")  # fmt: skip

    def check_alive() -> None:
        if engine.error is not None or not engine.is_running:
            raise ApiError(503, f"the engine has stopped: {engine.error!r}", code="engine_dead")
        if state.draining:
            raise ApiError(503, "the server is shutting down", code="draining")

    def submit(req: EngineRequest) -> RequestHandle:
        if cfg.max_waiting is not None and engine.num_waiting >= cfg.max_waiting:
            raise ApiError(429, f"too many waiting requests ({cfg.max_waiting}); retry later",
                           code="queue_full", headers={"Retry-After": str(cfg.retry_after_s)})  # fmt: skip
        try:
            return engine.submit(req.prompt_ids, req.params)
        except (EngineDeadError, ValueError) as exc:
            raise engine_error(exc, "prompt" if req.kind == protocol.COMPLETIONS else "messages") from None

    async def final_output(handle: RequestHandle, request: Request) -> RequestOutput:
        """Waits for the final event; aborts the request if the client goes away first."""

        async def last() -> RequestOutput:
            out = None
            async for out in handle.astream():
                pass
            assert out is not None
            return out

        async def disconnected() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        result, gone = asyncio.ensure_future(last()), asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not result.done():
                handle.abort()
            return await result
        except ENGINE_ERRORS as exc:  # ValueError: refused when the engine thread queued it
            raise engine_error(exc) from None
        finally:
            gone.cancel()

    def token_text(token_id: int) -> str:
        tok = state.tokenizer
        return tok.decode([token_id], skip_special_tokens=False) if tok is not None else str(token_id)

    def completion_logprobs(out: RequestOutput, start: int, offset: int) -> R.CompletionLogprobs | None:
        return R.completion_logprobs(out.token_ids, out.logprobs, start, offset, token_text)

    def chat_logprobs(out: RequestOutput, start: int) -> R.ChatLogprobs | None:
        return R.chat_logprobs(out.token_ids, out.logprobs, start, token_text)

    def usage(out: RequestOutput) -> R.Usage:
        return R.Usage.of(out.prompt_tokens, len(out.token_ids), out.cached_tokens)

    async def stream(handle: RequestHandle, req: EngineRequest, rid: str) -> AsyncIterator[bytes]:
        created, model, chat = int(time.time()), cfg.model_name, req.kind == protocol.CHAT
        text = TextStream(max((len(s) for s in req.params.stop), default=1) - 1)
        usage_field = {"usage": None} if req.include_usage else {}
        finished = False
        lp_sent, offset = 0, 0

        def chunk(delta: str | None, reason: str | None, first: bool = False, out: RequestOutput | None = None) -> dict[str, Any]:
            nonlocal lp_sent, offset
            lp = None
            if out is not None and out.logprobs is not None and len(out.logprobs) > lp_sent:
                if chat:
                    lp = chat_logprobs(out, lp_sent).model_dump()
                else:
                    lp = completion_logprobs(out, lp_sent, offset).model_dump()
                    offset += sum(len(t) for t in lp["tokens"])
                lp_sent = len(out.logprobs)
            if chat:
                d = {"role": "assistant", "content": delta or ""} if first else ({"content": delta} if delta else {})
                choice = {"index": 0, "delta": d, "logprobs": lp, "finish_reason": reason}
                return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": [choice], **usage_field}  # fmt: skip
            choice = {"index": 0, "text": delta or "", "logprobs": lp, "finish_reason": reason}
            return {"id": rid, "object": "text_completion", "created": created, "model": model,
                    "choices": [choice], **usage_field}  # fmt: skip

        try:
            if chat:
                yield _sse(chunk("", None, first=True))
            out = None
            async for out in handle.astream():
                delta = text.delta(out.text or "", out.finished)
                if out.finished:
                    finished = True
                    yield _sse(chunk(delta, out.finish_reason, out=out))
                elif delta:
                    yield _sse(chunk(delta, None, out=out))
            if req.include_usage and out is not None:
                body = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                        "created": created, "model": model, "choices": [], "usage": usage(out).model_dump()}  # fmt: skip
                yield _sse(body)
        except ENGINE_ERRORS as exc:  # ValueError: refused when the engine thread queued it
            finished = True
            err = engine_error(exc)
            yield _sse(R.error_body(err.status, err.message, err.param, err.code))
        finally:
            if not finished:
                handle.abort()  # client gone (or cancelled): free the request's pages and slots
        yield _sse("[DONE]")

    async def generate(request: Request, kind: str) -> Response:
        check_alive()
        body = protocol.parse_body(kind, await read_json(request))
        check_model(body.model)
        req = protocol.to_engine_request(body, state.tokenizer, max_model_len=state.max_model_len,
                                         vocab_size=state.vocab_size)  # fmt: skip
        handle = submit(req)
        rid = ("chatcmpl-" if kind == protocol.CHAT else "cmpl-") + uuid.uuid4().hex
        if req.stream:
            return StreamingResponse(stream(handle, req, rid), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
        out = await final_output(handle, request)
        if kind == protocol.CHAT:
            choice = R.ChatChoice(message=R.AssistantMessage(content=out.text or ""), finish_reason=out.finish_reason,
                                  logprobs=chat_logprobs(out, 0))  # fmt: skip
            resp = R.ChatCompletionResponse(id=rid, model=cfg.model_name, choices=[choice], usage=usage(out))
        else:
            choice = R.CompletionChoice(text=out.text or "", finish_reason=out.finish_reason,
                                        logprobs=completion_logprobs(out, 0, 0))  # fmt: skip
            resp = R.CompletionResponse(id=rid, model=cfg.model_name, choices=[choice], usage=usage(out))
        return JSONResponse(resp.model_dump())

    # ------------------------------------------------------------------ routes
    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, protocol.COMPLETIONS)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, protocol.CHAT)

    def card() -> R.ModelCard:
        return R.ModelCard(id=cfg.model_name, created=state.created, root=cfg.model_name, max_model_len=state.max_model_len)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return R.ModelList(data=[card()]).model_dump()

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        check_model(model_id)
        return card().model_dump()

    @app.get("/health")
    async def health() -> Response:
        check_alive()  # 503 (engine_dead / draining) through the ApiError handler
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def need_tokenizer(param: str) -> Any:
        if state.tokenizer is None:
            raise ApiError(400, "this model has no tokenizer", param=param)
        return state.tokenizer

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        raw = await read_json(request)
        if not isinstance(raw, dict):
            raise ApiError(400, "the request body must be a JSON object", code="invalid_body")
        check_model(raw.get("model"))
        if "messages" in raw:
            body = protocol.parse_body(protocol.CHAT, {"messages": raw["messages"]})
            ids = protocol.to_engine_request(body, need_tokenizer("messages")).prompt_ids
        elif isinstance(raw.get("prompt"), str):
            ids = need_tokenizer("prompt").encode(raw["prompt"])
        else:
            raise ApiError(400, "prompt: expected a string (or send messages)", param="prompt")
        return {"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        raw = await read_json(request)
        if not isinstance(raw, dict):
            raise ApiError(400, "the request body must be a JSON object", code="invalid_body")
        check_model(raw.get("model"))
        tokens = raw.get("tokens")
        if not isinstance(tokens, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in tokens):
            raise ApiError(400, "tokens: expected a list of integers", param="tokens")
        vocab = state.vocab_size
        bad = next((t for t in tokens if vocab is not None and not 0 <= t < vocab), None)
        if bad is not None:
            raise ApiError(400, f"tokens: token id {bad} is outside the vocabulary [0, {vocab})", param="tokens")
        return {"prompt": need_tokenizer("tokens").decode(tokens)}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict[str, Any]:
        check_alive()

        def flush(core: Any) -> dict[str, int]:
            mem = core.scheduler.memory
            mem.flush()
            slots = mem.slots
            return {"kv_pages_free": mem.pages.num_free, "kv_pages_total": mem.pages.capacity,
                    "state_slots_free": slots.num_free if slots else 0, "state_slots_total": slots.capacity if slots else 0}  # fmt: skip

        try:  # every replica's cache; the pool counts are summed over them
            each = [await asyncio.wrap_future(r.call(flush)) for r in state.replicas]
        except EngineDeadError as exc:
            raise engine_error(exc) from None
        return {"status": "ok", **{k: sum(p[k] for p in each) for k in each[0]}}

    return app
