"""Prometheus metrics of a server, under the ``radixflow:`` prefix.

Names mirror vLLM's where one exists (``num_requests_running``, ``kv_cache_usage_perc``,
``prefix_cache_queries``/``prefix_cache_hits`` in tokens, ``prompt_tokens``, ``generation_tokens``,
``request_success{finished_reason}``, ``num_preemptions``, the TTFT / inter-token / end-to-end /
queue-time histograms); the rest is what only this engine knows: state-slot usage, checkpoint hits
vs KV-only hit tokens, rounds, padding and bubble tokens, consumers waiting and blocked.

Invariants:
  * Every metric lives in the server's own :class:`CollectorRegistry` (no process-global state).
  * Counters and histograms are fed on the engine thread by :meth:`ServerMetrics.observe` (the
    :class:`BackgroundEngine` observer hook) before a finished request is forgotten; the gauges are
    read from the engine's pools and queues when scraped.
  * With data-parallel replicas (:class:`ReplicatedEngine`) every replica's thread feeds the same
    metrics through ``observe(..., replica=i)``; per-request bookkeeping is keyed by replica and
    request id, and the gauges sum the replicas' pools and queues.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from radixflow_jax.replicas.background import BackgroundEngine
from radixflow_jax.engine.config import RoundRecord
from radixflow_jax.engine.params import RequestOutput
from radixflow_jax.replicas.replicated import ReplicatedEngine

P = "radixflow:"
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0)
_ROUND = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# RoundRecord field -> (counter name, doc): each round adds the field to its counter
_PER_ROUND = {
    "num_tokens": ("round_tokens", "Real tokens computed in rounds."),
    "padding_tokens": ("padding_tokens", "Token slots of rounds that carried no real token."),
    "bubble_tokens": ("bubble_tokens", "Padding while an admissible waiting request was not scheduled (tokens)."),
    "bubble_rows": ("bubble_rows", "Padding while an admissible waiting request was not scheduled (rows)."),
    "consumers_waiting": ("consumers_waiting", "Consumer decisions WAIT (scan continued)."),
    "consumers_blocked": ("consumers_blocked", "Consumer decisions STOP_ROUND (scan halted)."),
    "attention_pairs": ("attention_pairs", "Query-key pairs the rounds' attention read over their real rows."),
    "verify_rows": ("spec_verify_rows", "Speculative decoding: rows that verified drafted tokens."),
    "drafted_tokens": ("spec_draft_tokens", "Speculative decoding: drafted tokens verified."),
    "accepted_tokens": ("spec_accepted_tokens", "Speculative decoding: drafted tokens accepted."),
    "spilled": ("host_spills", "Host tier: checkpoints copied from the device state pool to host memory."),
    "restored": ("host_restores", "Host tier: checkpoints copied back from host memory (each one a hit that would have been recomputed)."),
    "kv_spilled": ("host_kv_spills", "Host tier: KV pages copied from the device page pool to host memory."),
    "kv_restored": ("host_kv_restores", "Host tier: KV pages copied back from host memory."),
    "host_hits": ("host_hits", "Host tier: requests whose match resumed from a host checkpoint (read into their slot, or restored for a later round)."),
    "restore_waits": ("host_restore_waits", "Host tier: rounds requests waited for a pending restore (one per request per round)."),
}


@dataclasses.dataclass
class _Live:
    """Per-request bookkeeping between events (engine thread only)."""

    start: float | None = None  # first round it ran in
    last_token: float | None = None
    tokens: int = 0


class _Gauges(Collector):
    """Scrape-time gauges read from the engine (queue lengths and pool occupancy)."""

    def __init__(self, replicas: Sequence[BackgroundEngine], model_name: str):
        self.replicas = list(replicas)
        self.labels = {"model_name": model_name}

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(P + name, doc, labels=list(self.labels))
        g.add_metric(list(self.labels.values()), value)
        return g

    def collect(self) -> Iterator[GaugeMetricFamily]:
        mems = [r.core.scheduler.memory for r in self.replicas]
        pages_total = sum(m.pages.capacity for m in mems)
        pages_used = sum(m.pages.num_used for m in mems)
        running = sum(r.num_running for r in self.replicas)
        waiting = sum(r.num_waiting for r in self.replicas)
        yield self._gauge("num_requests_running", "Requests in the running set.", running)
        yield self._gauge("num_requests_waiting", "Requests accepted and not yet admitted.", waiting)
        yield self._gauge(
            "kv_cache_usage_perc",
            "Share of KV pages in use (requests and cached prefixes).",
            pages_used / max(pages_total, 1),
        )
        yield self._gauge("kv_pages_total", "KV pages that can be handed out.", pages_total)
        yield self._gauge("kv_pages_free", "KV pages on the free list.", sum(m.pages.num_free for m in mems))
        total = sum(m.slots.capacity for m in mems if m.slots is not None)
        free = sum(m.slots.num_free for m in mems if m.slots is not None)
        yield self._gauge(
            "state_slot_usage_perc",
            "Share of recurrent-state slots in use (requests and checkpoints).",
            (total - free) / total if total else 0.0,
        )
        yield self._gauge("state_slots_total", "Recurrent-state slots that can be handed out.", total)
        yield self._gauge("state_slots_free", "Recurrent-state slots on the free list.", free)
        hosts = [m.cache.host_pool for m in mems if m.cache is not None and m.cache.host_pool is not None]
        yield self._gauge("host_slots_total", "Host tier: checkpoints host memory can hold.", sum(h.capacity for h in hosts))
        yield self._gauge("host_slots_free", "Host tier: checkpoint rows free.", sum(h.num_free for h in hosts))
        kv = [m.cache.host_page_pool for m in mems if m.cache is not None and m.cache.host_page_pool is not None]
        yield self._gauge("host_pages_total", "Host tier: KV pages host memory can hold.", sum(h.capacity for h in kv))
        yield self._gauge("host_pages_free", "Host tier: KV page rows free.", sum(h.num_free for h in kv))
        drafters = [r.core.scheduler.drafter for r in self.replicas]
        drafters = [d for d in drafters if hasattr(d, "disabled")]
        if drafters:  # speculative method "draft" (engine/drafter.py)
            yield self._gauge(
                "spec_draft_model_active",
                "Speculative decoding with a draft model: 1 while every replica's draft engine drafts, 0 once one "
                "stopped after failing repeatedly (the log says why; the model decodes without drafts).",
                0.0 if any(d.disabled for d in drafters) else 1.0,
            )
        alive = all(r.is_running and r.error is None for r in self.replicas)  # the thread outlives its error briefly
        yield self._gauge("engine_alive", "1 while the engine thread (every replica's) runs.", 1.0 if alive else 0.0)


class ServerMetrics:
    def __init__(self, model_name: str, *, hybrid: bool):
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self.hybrid = hybrid
        self._live: dict[tuple[int, int], _Live] = {}  # (replica, request id)
        self.replicas: list[BackgroundEngine] = []  # set by attach()
        labels = ["model_name"]
        reg = self.registry

        def counter(name: str, doc: str, extra: Sequence[str] = ()) -> Counter:
            return Counter(P + name, doc, labels + list(extra), registry=reg)

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(P + name, doc, labels, buckets=buckets, registry=reg)

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens served from the prefix cache.")
        self.checkpoint_hits = counter("checkpoint_hits", "Requests of a hybrid model that resumed from a recurrent checkpoint (KV matched past it is not counted).")
        self.kv_only_hits = counter("kv_only_hits", "Requests of an attention-only model with a prefix-cache hit (KV pages only: no recurrent state to restore).")
        self.success = counter("request_success", "Finished requests by finish reason.", ["finished_reason"])
        self.preemptions = counter("num_preemptions", "Preempted requests.")
        self.rounds = counter("rounds", "Rounds (jitted steps) executed.")
        self.per_round = {field: counter(name, doc) for field, (name, doc) in _PER_ROUND.items()}
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.", _TTFT)
        self.itl = histogram("inter_token_latency_seconds", "Time between consecutive output tokens.", _ITL)
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end request latency.", _E2E)
        self.queue = histogram("request_queue_time_seconds", "Time from arrival to the first round.", _E2E)
        self.round_time = histogram("round_duration_seconds", "Plan + build + step time of one round.", _ROUND)
        self.host_bytes = counter("host_transfer_bytes", "Host tier: checkpoint and KV page bytes copied, by direction.", ["direction"])
        self.restore_wait_s = counter(
            "host_restore_wait_seconds",
            "Host tier: time requests waited for a pending restore they started (each waiting request, the rounds' "
            "plan + build + step time).",
        )
        self.drafted_at = counter(
            "spec_draft_positions", "Speculative decoding: verify rows that drafted a token at a position (1: the first).",
            ["position"],
        )
        self.accepted_at = counter(
            "spec_accepted_positions",
            "Speculative decoding: verify rows whose draft was accepted through a position (over spec_draft_positions: "
            "the acceptance rate there).",
            ["position"],
        )
        self.http_errors = counter("http_errors", "Error responses sent, by HTTP status.", ["status"])

    def attach(self, engine: BackgroundEngine | ReplicatedEngine) -> None:
        self.replicas = list(engine.replicas) if isinstance(engine, ReplicatedEngine) else [engine]
        self.registry.register(_Gauges(self.replicas, self.model_name))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def error(self, status: int) -> None:
        self.http_errors.labels(self.model_name, str(status)).inc()

    # ------------------------------------------------------------------ engine thread
    def observe(self, events: Sequence[RequestOutput], records: Sequence[RoundRecord], replica: int = 0) -> None:
        """The observer of replica ``replica``'s engine thread (bind it with ``functools.partial``)."""
        m = self.model_name
        core = self.replicas[replica].core if self.replicas else None
        now = core.clock() if core is not None else time.perf_counter()
        round_start = now
        for rec in records:
            dur = rec.plan_s + rec.build_s + rec.step_s
            round_start = now - dur
            self.rounds.labels(m).inc()
            self.round_time.labels(m).observe(dur)
            for field, count in self.per_round.items():
                count.labels(m).inc(getattr(rec, field))
            self.preemptions.labels(m).inc(rec.preempted)
            self.restore_wait_s.labels(m).inc(rec.restore_waits * dur)
            for j, (drafted, accepted) in enumerate(zip(rec.drafted_at, rec.accepted_at), start=1):
                self.drafted_at.labels(m, str(j)).inc(drafted)
                self.accepted_at.labels(m, str(j)).inc(accepted)
            if core is not None:
                spec = core.spec
                self.host_bytes.labels(m, "device_to_host").inc(
                    rec.spilled * spec.state_bytes + rec.kv_spilled * spec.page_bytes
                )
                self.host_bytes.labels(m, "host_to_device").inc(
                    rec.restored * spec.state_bytes + rec.kv_restored * spec.page_bytes
                )
        if records and core is not None:
            for req in core.scheduler.running:
                self._started((replica, req.request_id), req.arrival_time, round_start)
        for ev in events:
            key = (replica, ev.request_id)
            live = self._started(key, ev.arrival_time, round_start, ran=bool(ev.token_ids) or ev.finish_reason != "abort")
            new = len(ev.token_ids) - live.tokens
            if new > 0:
                self.generation_tokens.labels(m).inc(new)
                if live.last_token is None:
                    if ev.ttft is not None:
                        self.ttft.labels(m).observe(ev.ttft)
                else:
                    self.itl.labels(m).observe(now - live.last_token)
                live.last_token, live.tokens = now, len(ev.token_ids)
            if ev.finished:
                self._live.pop(key, None)
                self._finish(ev, now)

    def _started(self, key: tuple[int, int], arrival: float, round_start: float, *, ran: bool = True) -> _Live:
        """The request's bookkeeping; the first time it is seen running, its queue time is observed."""
        live = self._live.setdefault(key, _Live())
        if live.start is None and ran:
            live.start = round_start
            self.queue.labels(self.model_name).observe(max(0.0, round_start - arrival))
        return live

    def _finish(self, ev: RequestOutput, now: float) -> None:
        m = self.model_name
        self.success.labels(m, ev.finish_reason or "unknown").inc()
        self.prompt_tokens.labels(m).inc(ev.prompt_tokens)
        self.e2e.labels(m).observe(max(0.0, (ev.finish_time or now) - ev.arrival_time))
        if ev.finish_reason == "abort" and not ev.token_ids:
            return  # never ran: it queried nothing
        self.prefix_queries.labels(m).inc(ev.prompt_tokens)
        self.prefix_hits.labels(m).inc(ev.cached_tokens)
        if ev.cached_tokens > 0:
            (self.checkpoint_hits if self.hybrid else self.kv_only_hits).labels(m).inc()
