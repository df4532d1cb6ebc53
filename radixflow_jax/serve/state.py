"""What every route of the HTTP layer reads: the server's configuration and its state.

Invariants:
  * :class:`ServerConfig` is frozen: the model id, the API key and the limits never change while
    the server runs.
  * :class:`ServerState` is the one mutable record the routes share; only ``draining`` changes
    after start-up (set once, by the signal handler, never cleared).
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import Any, Callable

from fastapi import FastAPI

from radixflow_jax.engine.grammar import GrammarCompiler
from radixflow_jax.replicas.background import BackgroundEngine
from radixflow_jax.replicas.replicated import ReplicatedEngine
from radixflow_jax.serve.caps import (
    DEFAULT_CAPS,
    DEFAULT_GRAMMAR_TRIAL_S,
    DEFAULT_MAX_WAITING,
    DEFAULT_PREPARE_TIMEOUT_S,
    DEFAULT_PREPARE_WORKERS,
    DEFAULT_STEP_STALL_S,
    DEFAULT_STREAM_TIMEOUT_S,
    RequestCaps,
)
from radixflow_jax.serve.metrics import ServerMetrics
from radixflow_jax.serve.prepare import Preparer


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """``max_waiting``: answer 429 when a request would make more than this many requests wait
    (``n`` siblings count ``n``; requests in preparation count; None: never);
    ``max_body_bytes``: larger request bodies get 413; ``retry_after_s``: the 429's ``Retry-After``;
    ``stream_timeout_s``: a stream whose client takes no data for this long is aborted (None: never);
    ``prepare_workers`` / ``prepare_timeout_s``: the preparation pool (``serve/prepare.py``);
    ``caps``: the size caps of a body (``serve/caps.py``); ``allow_cache_reset``: serve
    ``/reset_prefix_cache`` (otherwise 403); ``private_cache_stats``: hide ``cached_tokens`` from
    answers and require the API key for ``/metrics``; ``step_stall_s``: ``/health`` answers 503
    while a step has run longer than this (None: never); ``grammar_trial_s``: a structured-output
    grammar whose first token mask takes longer than this in preparation is refused (400).
    (The most samples one request may ask for, ``--max-n``, is the engine's ``EngineConfig.max_n``.)"""

    model_name: str
    api_key: str | None = None
    max_waiting: int | None = DEFAULT_MAX_WAITING
    max_body_bytes: int = 4 << 20
    retry_after_s: int = 1
    stream_timeout_s: float | None = DEFAULT_STREAM_TIMEOUT_S
    prepare_workers: int = DEFAULT_PREPARE_WORKERS
    prepare_timeout_s: float | None = DEFAULT_PREPARE_TIMEOUT_S
    caps: RequestCaps = DEFAULT_CAPS
    allow_cache_reset: bool = False
    private_cache_stats: bool = False
    step_stall_s: float | None = DEFAULT_STEP_STALL_S
    grammar_trial_s: float | None = DEFAULT_GRAMMAR_TRIAL_S


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
    warmups: tuple[Any, ...] = ()  # each replica's BackgroundWarmup (``--warmup background``), else empty
    preparer: Preparer = dataclasses.field(init=False)
    grammars: GrammarCompiler | None = dataclasses.field(init=False)  # where preparation workers' trials compile

    def __post_init__(self) -> None:
        self.preparer = Preparer(self.config.prepare_workers, self.config.prepare_timeout_s)
        # the first replica's own cache: a trial compile is the compile its engine thread then reuses
        self.grammars = self.replicas[0].core.grammars

    def warmup_status(self) -> dict[str, Any]:
        """``/health``'s warm-up fields: ``phase`` (``warming``, ``ready``, ``failed``, or ``lazy``
        when nothing warms in the background), the variants compiled of all replicas', and with
        ``failed`` the first replica's reason (``warmup_error``: a compile error, or a warm-up
        stopped short of ``vm.max_map_count``; serving goes on with lazy compiles either way)."""
        if not self.warmups:
            return {"phase": "lazy"}
        phases = {w.phase for w in self.warmups}
        phase = "failed" if "failed" in phases else "warming" if "warming" in phases else "ready"
        status: dict[str, Any] = {
            "phase": phase,
            "variants_compiled": sum(w.compiled for w in self.warmups),
            "variants": sum(w.total for w in self.warmups),
        }
        if phase == "failed":
            status["warmup_error"] = next(w.failed for w in self.warmups if w.failed is not None)
        return status

    @property
    def replicas(self) -> list[BackgroundEngine]:
        return list(self.engine.replicas) if isinstance(self.engine, ReplicatedEngine) else [self.engine]


class RouteGroup(abc.ABC):
    """Routes over one server's state: ``routes()`` lists each route's path, endpoint and HTTP
    method; ``register`` adds them all to the app."""

    def __init__(self, state: ServerState):
        self.state = state

    @abc.abstractmethod
    def routes(self) -> list[tuple[str, Callable[..., Any], str]]:
        """``(path, endpoint, method)`` of every route of the group."""

    def register(self, app: FastAPI) -> None:
        for path, endpoint, method in self.routes():
            app.add_api_route(path, endpoint, methods=[method])
