"""Error answers of the HTTP layer: every failure leaves as the OpenAI envelope
``{"error": {"message", "type", "param", "code"}}`` and counts in ``radixflow:http_errors``.

Invariants:
  * Malformed JSON and invalid fields are 400 (never FastAPI's 422); an unknown route is 404
    ``no such route``; a 500 never carries exception text: an exception no route expected, or a
    request whose step kept failing, answers a generic message with an error id (``err-<16 hex>``)
    and the exception is logged with that id.
  * One mapping for an engine failure about one request (:func:`engine_error`), whether it shows
    at submission, while waiting or while streaming.
"""

from __future__ import annotations

import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixflow_jax.replicas.background import EngineDeadError, RequestFailedError
from radixflow_jax.serve import responses as R
from radixflow_jax.serve.metrics import ServerMetrics
from radixflow_jax.serve.protocol import ProtocolError


class ApiError(Exception):
    """An answer a route gives instead of its result: ``status`` and the envelope's fields."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


ENGINE_ERRORS = (EngineDeadError, RequestFailedError, ValueError)


def engine_error(exc: EngineDeadError | RequestFailedError | ValueError, param: str | None = None) -> ApiError:
    """The API error for a failure the engine reports about one request, one mapping for submission,
    waiting and streaming: a dead engine is 503, a request whose rounds kept failing is 500
    ``step_failed``, a request the engine refused (``ValueError``) is 400."""
    if isinstance(exc, EngineDeadError):
        return ApiError(503, str(exc), code="engine_dead")
    if isinstance(exc, RequestFailedError):
        ref = _log_failure("request failed in the engine", exc)
        return ApiError(500, f"the request failed in the engine (error id {ref})", code="step_failed")
    return ApiError(400, str(exc), param=getattr(exc, "field", None) or param)


class ErrorAnswers:
    """The app's exception handlers: each turns an exception into the envelope and counts it."""

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics

    def respond(
        self, status: int, message: str, param: str | None = None, code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> JSONResponse:
        self.metrics.error(status)
        return JSONResponse(R.error_body(status, message, param, code), status_code=status, headers=headers)

    def install(self, app: FastAPI) -> None:
        app.add_exception_handler(ApiError, self.api_error)  # type: ignore[arg-type]
        app.add_exception_handler(ProtocolError, self.protocol_error)  # type: ignore[arg-type]
        app.add_exception_handler(RequestValidationError, self.validation)  # type: ignore[arg-type]
        app.add_exception_handler(StarletteHTTPException, self.http)  # type: ignore[arg-type]
        app.add_exception_handler(Exception, self.internal)

    async def api_error(self, _: Request, exc: ApiError) -> JSONResponse:
        return self.respond(exc.status, exc.message, exc.param, exc.code, exc.headers)

    async def protocol_error(self, _: Request, exc: ProtocolError) -> JSONResponse:
        return self.respond(exc.status, exc.message, exc.param, exc.code)

    async def validation(self, _: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in err["loc"]) or None
        return self.respond(400, f"{where}: {err['msg']}" if where else err["msg"], where)

    async def http(self, _: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404 and message == "Not Found":
            message = "no such route"
        return self.respond(exc.status_code, message)

    async def internal(self, _: Request, exc: Exception) -> JSONResponse:
        ref = _log_failure("unexpected error", exc)
        return self.respond(500, f"internal server error (error id {ref})", code="internal_error")


def _log_failure(what: str, exc: BaseException) -> str:
    """Logs ``exc`` under a new error id and returns the id (answers carry the id, not the text)."""
    ref = "err-" + uuid.uuid4().hex[:16]
    logging.getLogger(__name__).error("%s [%s]: %r", what, ref, exc, exc_info=exc)
    return ref
