"""What a request passes before it reaches the engine: a bounded JSON body, the served model's
name, a live engine, a tokenizer where one is needed, room in the waiting queue.

Invariants:
  * A body over ``max_body_bytes`` is refused (413) from its declared length when it has one and
    while it is read otherwise, so no more than the limit plus one chunk is ever held.
  * Nothing here changes the engine but :func:`submit`, and that only after the queue check.
  * :func:`admit` runs twice: before a request is prepared (it counts one) and when it is
    submitted (it counts its ``n`` / ``best_of`` samples).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from radixflow_jax.replicas.background import EngineDeadError, RequestHandle
from radixflow_jax.serve import protocol
from radixflow_jax.serve.errors import ApiError, engine_error
from radixflow_jax.serve.prepare import decode_json
from radixflow_jax.serve.protocol import EngineRequest
from radixflow_jax.serve.state import ServerConfig, ServerState


async def read_body(request: Request, cfg: ServerConfig) -> bytes:
    """The request body's bytes (413 over the limit); decoding is preparation (``serve/prepare.py``)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cfg.max_body_bytes:
        raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {cfg.max_body_bytes}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > cfg.max_body_bytes:
            raise ApiError(413, f"request body exceeds the limit of {cfg.max_body_bytes} bytes")
    return bytes(body)


def decode_object(body: bytes, cfg: ServerConfig) -> dict[str, Any]:
    """A body decoded as a JSON object naming the served model, if any (the tokenizer routes,
    which take no OpenAI body; run on the preparation pool): 400 empty, invalid, too deep or not
    an object, 404 another model."""
    raw = decode_json(body, cfg.caps)
    if not isinstance(raw, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_body")
    check_model(cfg, raw.get("model"))
    return raw


def check_model(cfg: ServerConfig, name: str | None) -> None:
    """404 ``model_not_found`` unless ``name`` is absent or the served model's id."""
    if name is not None and name != cfg.model_name:
        raise ApiError(
            404,
            f"the model '{name}' does not exist; this server serves '{cfg.model_name}'",
            param="model",
            code="model_not_found",
        )


def check_alive(state: ServerState) -> None:
    """503 once the engine has stopped (``engine_dead``) or while the server drains (``draining``)."""
    engine = state.engine
    if engine.error is not None or not engine.is_running:
        raise ApiError(503, f"the engine has stopped: {engine.error!r}", code="engine_dead")
    if state.draining:
        raise ApiError(503, "the server is shutting down", code="draining")


def need_tokenizer(state: ServerState, param: str) -> Any:
    """The model's tokenizer (400 on ``param`` when it has none)."""
    if state.tokenizer is None:
        raise ApiError(400, "this model has no tokenizer", param=param)
    return state.tokenizer


def admit(state: ServerState, samples: int = 1) -> None:
    """429 + ``Retry-After`` when ``samples`` more requests would make more than ``max_waiting``
    wait: the engines' waiting requests (each sibling counts) and the requests in preparation."""
    cfg = state.config
    if cfg.max_waiting is None:
        return
    waiting = state.engine.num_waiting + state.preparer.in_flight
    if waiting + samples > cfg.max_waiting:
        raise ApiError(
            429,
            f"too many waiting requests: {waiting} wait or are being prepared and this request adds {samples} "
            f"(the server's bound, --max-waiting, is {cfg.max_waiting}); retry later",
            code="queue_full",
            headers={"Retry-After": str(cfg.retry_after_s)},
        )


def submit(state: ServerState, req: EngineRequest) -> list[RequestHandle]:
    """Hands ``req`` to the engine, one handle per sample (``n`` / ``best_of`` siblings, queued
    together on one replica): 429 + ``Retry-After`` when its samples do not fit under
    ``max_waiting`` (:func:`admit`), the engine's refusal as :func:`engine_error` on the prompt's field."""
    admit(state, req.params.num_samples)
    engine = state.engine
    try:
        return engine.submit_group(req.prompt_ids, req.params)
    except (EngineDeadError, ValueError) as exc:
        raise engine_error(exc, "prompt" if req.kind == protocol.COMPLETIONS else "messages") from None
