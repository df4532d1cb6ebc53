"""Feed a workload into an engine by arrival time and measure what the paper reports.

One driver serves both executors: with the model executor time is the wall clock (idle gaps are
slept), with the simulated executor it is the virtual clock (idle gaps are skipped). Multi-turn
conversations submit turn k+1 when turn k finished (``think_s`` later), with the real answer appended.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Callable

import numpy as np

from radixflow_jax.bench.workloads import BenchRequest
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.engine.params import RequestOutput, SamplingParams


# the report columns of a run: (RunResult field, heading, format)
COLUMNS = (
    ("rounds", "rounds", "{:d}"),
    ("mean_latency_s", "mean lat s", "{:.3f}"),
    ("p50_latency_s", "p50 s", "{:.3f}"),
    ("p99_latency_s", "p99 s", "{:.3f}"),
    ("mean_ttft_s", "TTFT s", "{:.3f}"),
    ("padding_tokens", "padding", "{:d}"),
    ("bubble_tokens", "bubbles", "{:d}"),
    ("reuse", "reuse", "{:.1%}"),
    ("throughput_tok_s", "tok/s", "{:.1f}"),
    ("utilization", "util", "{:.2f}"),
    ("completed", "done", "{:d}"),
)


@dataclasses.dataclass(frozen=True)
class RunResult:
    policy: str
    rounds: int
    mean_latency_s: float
    p50_latency_s: float
    p99_latency_s: float
    mean_ttft_s: float
    reuse: float
    bubble_tokens: int
    padding_tokens: int
    completed: int
    num_requests: int
    throughput_tok_s: float
    makespan_s: float
    mean_tpot_s: float
    consumers_blocked: int
    consumers_waiting: int
    utilization: float = 0.0  # fraction of the makespan in which a round was running
    checkpoints_planted: int = 0
    checkpoints_skipped: int = 0
    checkpoints_evicted_unused: int = 0
    consumers_paired: int = 0  # consumers run in their producer's round (policy pair)
    drafted_tokens: int = 0  # speculative decoding: drafted tokens verified, and those accepted
    accepted_tokens: int = 0
    host_spills: int = 0  # checkpoints copied to the host tier, and back (cache/tiers.py)
    host_restores: int = 0
    host_kv_spills: int = 0  # KV pages copied to the host tier, and back (cache/hostkv.py)
    host_kv_restores: int = 0
    # model executor: step programs compiled during the run (the model's store grew by these), and the
    # seconds the engine's clock stood still for first-use compiles and primes (not in the latencies)
    compiles: int = 0
    paused_s: float = 0.0
    latencies: tuple[float, ...] = dataclasses.field(default=(), repr=False)

    def as_dict(self) -> dict[str, float | int | str]:
        out = dataclasses.asdict(self)
        out.pop("latencies")
        return out


def drive(
    engine: EngineCore,
    requests: list[BenchRequest],
    *,
    wait: Callable[[float], None] = time.sleep,
    progress: Callable[[int, int], None] | None = None,
) -> list[RequestOutput]:
    """Runs ``requests`` (sorted by arrival) to completion; returns their outputs in input order."""
    clock = engine.clock
    t0 = clock()
    pending = collections.deque(r for r in requests if r.turn == 0)
    follow: dict[int, collections.deque[BenchRequest]] = collections.defaultdict(collections.deque)
    for r in requests:
        if r.turn > 0:
            follow[r.group].append(r)
    history: dict[int, tuple[int, ...]] = {}
    rid_to_req: dict[int, tuple[int, BenchRequest]] = {}
    outputs: dict[int, RequestOutput] = {}
    order = {id(r): i for i, r in enumerate(requests)}

    def submit(r: BenchRequest, prompt: tuple[int, ...], at: float) -> None:
        rid = engine.add_request(prompt, SamplingParams(max_tokens=r.max_tokens, ignore_eos=True), arrival_time=at)
        rid_to_req[rid] = (order[id(r)], r)

    while pending or engine.has_unfinished():
        now = clock() - t0
        while pending and pending[0].arrival_s <= now:
            r = pending.popleft()
            prompt = history.get(r.group, ()) + r.prompt
            submit(r, prompt, t0 + max(r.arrival_s, 0.0))
        if not engine.has_unfinished():
            if pending:  # idle until the head arrives, then submit it: a clock of floats may read
                r = pending.popleft()  # a hair before its arrival after the wait (then spin for ever)
                wait(max(r.arrival_s - (clock() - t0), 0.0))
                submit(r, history.get(r.group, ()) + r.prompt, t0 + max(r.arrival_s, 0.0))
            continue
        for out in engine.step():
            if not out.finished:
                continue
            index, r = rid_to_req[out.request_id]
            outputs[index] = out
            if progress is not None:
                progress(len(outputs), len(requests))
            if follow[r.group]:
                history[r.group] = tuple(out.prompt_token_ids) + tuple(out.token_ids)
                nxt = follow[r.group].popleft()
                due = dataclasses.replace(nxt, arrival_s=clock() - t0 + nxt.think_s)
                order[id(due)] = order[id(nxt)]
                at = next((i for i, p in enumerate(pending) if p.arrival_s > due.arrival_s), len(pending))
                pending.insert(at, due)
    return [outputs[i] for i in sorted(outputs)]


def summarize(policy: str, engine: EngineCore, outputs: list[RequestOutput], num_requests: int) -> RunResult:
    lat = np.array([o.latency for o in outputs if o.latency is not None])
    ttft = np.array([o.ttft for o in outputs if o.ttft is not None])
    tpot = [
        (o.latency - o.ttft) / (len(o.token_ids) - 1)
        for o in outputs
        if o.latency is not None and o.ttft is not None and len(o.token_ids) > 1
    ]
    prompt = sum(o.prompt_tokens for o in outputs)
    cached = sum(o.cached_tokens for o in outputs)
    start = min((o.arrival_time for o in outputs), default=0.0)
    end = max((o.finish_time or 0.0 for o in outputs), default=0.0)
    makespan = max(end - start, 1e-9)
    recs = engine.records
    return RunResult(
        policy=policy,
        rounds=len(recs),
        mean_latency_s=float(lat.mean()) if lat.size else float("nan"),
        p50_latency_s=float(np.percentile(lat, 50)) if lat.size else float("nan"),
        p99_latency_s=float(np.percentile(lat, 99)) if lat.size else float("nan"),
        mean_ttft_s=float(ttft.mean()) if ttft.size else float("nan"),
        reuse=cached / prompt if prompt else 0.0,
        bubble_tokens=sum(r.bubble_tokens for r in recs),
        padding_tokens=sum(r.padding_tokens for r in recs),
        completed=sum(1 for o in outputs if o.finish_reason in ("stop", "length")),
        num_requests=num_requests,
        throughput_tok_s=sum(len(o.token_ids) for o in outputs) / makespan,
        makespan_s=makespan,
        mean_tpot_s=float(np.mean(tpot)) if tpot else float("nan"),
        consumers_blocked=sum(r.consumers_blocked for r in recs),
        consumers_waiting=sum(r.consumers_waiting for r in recs),
        utilization=min(sum(r.step_s for r in recs) / makespan, 1.0),
        checkpoints_planted=sum(r.checkpoints_planted for r in recs),
        checkpoints_skipped=sum(r.checkpoints_skipped for r in recs),
        checkpoints_evicted_unused=sum(r.checkpoints_evicted_unused for r in recs),
        consumers_paired=sum(r.consumers_paired for r in recs),
        drafted_tokens=sum(r.drafted_tokens for r in recs),
        accepted_tokens=sum(r.accepted_tokens for r in recs),
        host_spills=sum(r.spilled for r in recs),
        host_restores=sum(r.restored for r in recs),
        host_kv_spills=sum(r.kv_spilled for r in recs),
        host_kv_restores=sum(r.kv_restored for r in recs),
        latencies=tuple(float(x) for x in lat),
    )
