"""``GET /v1/models``, ``/v1/models/{id}``, ``/health`` and ``/metrics``.

Invariants:
  * The model list holds one card, the served model's, its ``created`` the server's start time.
  * ``/health`` is 200 ``{"status": "ok", "phase": ...}`` only while the engine runs, the server
    is not draining and no replica's step has run longer than ``step_stall_s`` (the engine
    thread's heartbeat, ``BackgroundEngine.step_running_for``; 503 ``engine_stalled``), 503
    otherwise. ``phase`` is ``warming`` while step variants compile in the background (requests
    are served meanwhile), then ``ready``; ``lazy`` when nothing warms in the background;
    ``/health`` and ``/metrics`` need no API key (``/metrics`` does under ``private_cache_stats``).
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from radixflow_jax.serve import responses as R
from radixflow_jax.serve.checks import check_alive, check_model
from radixflow_jax.serve.errors import ApiError
from radixflow_jax.serve.state import RouteGroup


class InfoRoutes(RouteGroup):
    """The read-only routes over one server's state."""

    def routes(self) -> list[tuple[str, Callable[..., Any], str]]:
        return [
            ("/v1/models", self.models, "GET"),
            ("/v1/models/{model_id:path}", self.model, "GET"),
            ("/health", self.health, "GET"),
            ("/metrics", self.metrics_route, "GET"),
        ]

    def card(self) -> R.ModelCard:
        s = self.state
        return R.ModelCard(
            id=s.config.model_name, created=s.created, root=s.config.model_name, max_model_len=s.max_model_len
        )

    async def models(self) -> dict[str, Any]:
        return R.ModelList(data=[self.card()]).model_dump()

    async def model(self, model_id: str) -> dict[str, Any]:
        check_model(self.state.config, model_id)
        return self.card().model_dump()

    async def health(self) -> Response:
        check_alive(self.state)  # 503 (engine_dead / draining) through the ApiError handler
        bound = self.state.config.step_stall_s
        longest = max(r.step_running_for for r in self.state.replicas)
        if bound is not None and longest > bound:
            raise ApiError(503, f"a step has run for {longest:.0f} s (bound {bound:g} s)", code="engine_stalled")
        return JSONResponse({"status": "ok", **self.state.warmup_status()})

    async def metrics_route(self) -> Response:
        return Response(self.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
