"""The OpenAI-compatible HTTP layer (FastAPI) over a :class:`BackgroundEngine`. No scheduling here.

:func:`create_app` wires the pieces: the error answers (``serve/errors.py``), the API key check,
then the routes in groups, generation (``serve/completions.py``), models, health and metrics
(``serve/info.py``), tokenizer and cache administration (``serve/admin.py``). The state they share
is :class:`ServerState` (``serve/state.py``).

Invariants:
  * Every error leaves as the OpenAI envelope ``{"error": {"message", "type", "param", "code"}}``:
    400 for malformed JSON and invalid fields (never FastAPI's 422), 401 for a missing or wrong key
    (compared in constant time; ``/health`` and ``/metrics`` stay open, ``/metrics`` not with
    ``private_cache_stats``), 403 for ``/reset_prefix_cache`` unless allowed, 404 for an unknown model or
    route, 413 for a body over the limit, 429 + ``Retry-After`` while the waiting queue is at
    ``max_waiting``, 503 while draining, after the engine died or while a step hangs (``/health``),
    500 (``step_failed``, a generic message and an error id) for a request whose rounds' step kept
    failing while the engine recovered and went on serving.
  * A request whose client disconnects is aborted, which frees its pages and slots.
  * A stream is ``data: {json}\\n\\n`` chunks, then ``data: [DONE]\\n\\n``; text deltas never split a
    UTF-8 character and never leak the start of a stop string that later completes.
"""

from __future__ import annotations

import functools
import hmac
from typing import Any, Callable

from fastapi import FastAPI

from radixflow_jax.serve.admin import AdminRoutes
from radixflow_jax.serve.completions import CompletionRoutes
from radixflow_jax.serve.errors import ErrorAnswers
from radixflow_jax.serve.info import InfoRoutes
from radixflow_jax.serve.state import ServerConfig, ServerState

OPEN_PATHS = frozenset({"/health", "/metrics"})


class ApiKeyMiddleware:
    """Pure ASGI (streams and disconnects pass through untouched): every path except
    ``open_paths`` (``OPEN_PATHS``; without ``/metrics`` under ``private_cache_stats``) needs
    ``Authorization: Bearer KEY``, compared in constant time."""

    def __init__(self, app: Any, key: str, reject: Callable[[], Any], open_paths: frozenset[str] = OPEN_PATHS):
        self.app, self.key, self.reject, self.open_paths = app, key.encode(), reject, open_paths

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            token = header[7:] if header[:7].lower() == b"bearer " else b""
            if not hmac.compare_digest(token, self.key):
                await self.reject()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def require_key(app: FastAPI, cfg: ServerConfig, answers: ErrorAnswers) -> None:
    """Puts the API key check in front of every route when ``cfg`` sets a key (401 otherwise)."""
    if cfg.api_key is None:
        return
    reject = functools.partial(
        answers.respond, 401, "missing or invalid API key (send 'Authorization: Bearer KEY')", code="invalid_api_key"
    )
    open_paths = OPEN_PATHS - {"/metrics"} if cfg.private_cache_stats else OPEN_PATHS
    app.add_middleware(ApiKeyMiddleware, key=cfg.api_key, reject=reject, open_paths=open_paths)


def create_app(state: ServerState) -> FastAPI:
    """The app over ``state``; routes are registered in a fixed order (``/v1/models`` before
    ``/v1/models/{model_id:path}``)."""
    app = FastAPI(title="radixflow serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    answers = ErrorAnswers(state.metrics)
    answers.install(app)
    require_key(app, state.config, answers)
    for routes in (CompletionRoutes(state), InfoRoutes(state), AdminRoutes(state)):
        routes.register(app)
    return app
