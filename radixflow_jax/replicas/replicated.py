"""Data-parallel replicas for a server: several :class:`BackgroundEngine` threads behind a router.

:class:`ReplicatedEngine` offers the serving interface of one :class:`BackgroundEngine`
(``submit``, ``num_waiting``, ``num_running``, ``error``, ``is_running``, ``shutdown``) over M
replicas, each a whole engine (its own scheduler, radix cache, pools and thread) on its own device
group or sharing the model's device (``llm.py``'s ``replica_groups``).

Invariants:
  * Routing happens on the caller's thread under one lock and reads only what is safe off the engine
    threads: each replica's queue lengths and the router's own record of the prefixes it sent
    there (``Router.routed_prefix``). A replica's radix tree is never walked from another thread,
    so the cache-side score that ``ReplicaSet`` adds in a single thread is left out here; prompts that
    share a prefix still follow the first one routed with it.
  * A request lives on one replica for its whole life: its handle talks to that replica only, so an
    abort, a disconnect or a failed step touches no other replica.
  * The replicas are identical engines: a prompt one refuses, all refuse (``submit`` checks it once,
    before routing, and the chosen replica queues the checked request), and every replica's output
    equals what a single engine computes.
"""

from __future__ import annotations

import threading
from typing import Sequence

from radixflow_jax.replicas.background import BackgroundEngine, RequestHandle
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.replicas.router import Router, RouterConfig


class ReplicatedEngine:
    def __init__(self, replicas: Sequence[BackgroundEngine], config: RouterConfig = RouterConfig()):
        if not replicas:
            raise ValueError("ReplicatedEngine needs at least one replica")
        self.replicas = list(replicas)
        self.router = Router(len(self.replicas), config)
        self._lock = threading.Lock()

    @property
    def core(self) -> EngineCore:
        """The first replica's core: its fixed settings (``max_model_len``, vocabulary, validation)
        hold for every replica. Not for reading live state (that belongs to each replica's thread)."""
        return self.replicas[0].core

    def submit(self, prompt: Sequence[int], params: SamplingParams) -> RequestHandle:
        """Routes and queues a request; validation errors raise here, before any replica is chosen
        (the first replica's check holds for all: they are identical), and the chosen replica takes
        the checked request as it is."""
        checked = self.core.check(prompt, params)
        return self.replicas[self._route(checked.prompt)].enqueue(checked)

    def submit_group(self, prompt: Sequence[int], params: SamplingParams) -> list[RequestHandle]:
        """:meth:`submit` for several samples: every sibling goes to the one replica chosen for the
        prompt, so they share its prompt there (``BackgroundEngine.submit_group``)."""
        checked = self.core.check(prompt, params)
        return self.replicas[self._route(checked.prompt)].enqueue_group(checked)

    def _route(self, prompt: Sequence[int]) -> int:
        with self._lock:
            if len(self.replicas) == 1:
                choice = 0
            else:
                loads = [r.num_waiting + r.num_running for r in self.replicas]
                choice = self.router.choose(prompt, loads, [0] * len(self.replicas))
        return choice

    @property
    def num_waiting(self) -> int:
        return sum(r.num_waiting for r in self.replicas)

    @property
    def num_running(self) -> int:
        return sum(r.num_running for r in self.replicas)

    @property
    def error(self) -> BaseException | None:
        """The first replica failure: the server stops answering as one engine would (a replica that
        died takes its open requests with it; the others could serve, but a half-dead server that
        says it is healthy is worse than a restart)."""
        return next((r.error for r in self.replicas if r.error is not None), None)

    @property
    def is_running(self) -> bool:
        return all(r.is_running for r in self.replicas)

    def shutdown(self, timeout: float = 10.0) -> None:
        for r in self.replicas:
            r.shutdown(timeout)
