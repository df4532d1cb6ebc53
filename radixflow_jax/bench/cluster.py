"""Simulated data-parallel replicas: ``radixflow bench --executor sim --replicas N --router R``.

Every replica is a simulated engine with its own virtual clock (replicas run concurrently). The
cluster driver is a discrete-event loop: the next event is either the next arrival (routed by
:class:`~radixflow_jax.replicas.router.ReplicaSet` at its arrival time, from the replicas' state at
that time) or the round of the busy replica whose clock is earliest. An idle replica's clock jumps
to the arrival it receives. Single-turn workloads only (a follow-up turn would need the router to
see the answer first; the multi-turn workload is refused).
"""

from __future__ import annotations

import collections
import dataclasses
import types
from typing import Any, Sequence

from radixflow_jax.bench.driver import RunResult, summarize
from radixflow_jax.bench.run import BenchConfig
from radixflow_jax.sim.engines import build_sim_engine
from radixflow_jax.bench.workloads import BenchRequest
from radixflow_jax.engine.params import RequestOutput, SamplingParams
from radixflow_jax.replicas.router import ReplicaSet, RouterConfig
from radixflow_jax.sim.executor import VirtualClock
from radixflow_jax.sim.specs import DeviceSpec, ModelSpec


@dataclasses.dataclass(frozen=True)
class ClusterResult:
    """``overall``: all replicas' outputs together (rounds, bubbles and padding summed);
    ``replicas``: one result per replica; ``requests``: requests routed to each replica."""

    router: str
    overall: RunResult
    replicas: tuple[RunResult, ...]
    requests: tuple[int, ...]
    prefix_hits: int
    fallbacks: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "router": self.router,
            "overall": self.overall.as_dict(),
            "replicas": [r.as_dict() for r in self.replicas],
            "requests": list(self.requests),
            "prefix_hits": self.prefix_hits,
            "fallbacks": self.fallbacks,
        }


def drive_cluster(replicas: ReplicaSet, requests: Sequence[BenchRequest]) -> list[tuple[int, RequestOutput]]:
    """Runs ``requests`` (sorted by arrival) on virtual clocks; returns ``(replica, output)`` per
    request in input order."""
    if any(r.turn > 0 for r in requests):
        raise ValueError("simulated replicas run single-turn workloads (race, quality, gsp), not multiturn")
    clocks = [e.clock for e in replicas.engines]
    if not all(isinstance(c, VirtualClock) for c in clocks):
        raise ValueError("drive_cluster needs engines on virtual clocks (simulated executors)")
    pending = collections.deque(enumerate(requests))
    index: dict[tuple[int, int], int] = {}
    outputs: dict[int, tuple[int, RequestOutput]] = {}
    while pending or replicas.has_unfinished():
        busy = [i for i, e in enumerate(replicas.engines) if e.has_unfinished()]
        next_round = min((clocks[i].now for i in busy), default=float("inf"))
        if pending and pending[0][1].arrival_s <= next_round:
            k, r = pending.popleft()
            for i, e in enumerate(replicas.engines):  # idle replicas wait until the arrival
                if not e.has_unfinished():
                    clocks[i].now = max(clocks[i].now, r.arrival_s)
            params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=True)
            rid = replicas.add_request(r.prompt, params, arrival_time=r.arrival_s)
            index[rid] = k
            continue
        i = min(busy, key=lambda j: clocks[j].now)
        for out in replicas.engines[i].step():
            if out.finished:
                outputs[index[(i, out.request_id)]] = (i, out)
    return [outputs[k] for k in sorted(outputs)]


def run_cluster(
    spec: ModelSpec,
    device: DeviceSpec,
    requests: Sequence[BenchRequest],
    cfg: BenchConfig,
    policy: str,
    num_replicas: int,
    router: RouterConfig,
) -> ClusterResult:
    """``num_replicas`` simulated engines of ``spec`` on ``device`` (one device each), scheduling
    policy ``policy``, behind ``router``."""
    ec = cfg.engine.with_options(policy=policy)
    engines = [
        build_sim_engine(spec, device, ec, overhead_s=cfg.overhead_s, noise=cfg.sim_noise) for _ in range(num_replicas)
    ]
    replicas = ReplicaSet(engines, dataclasses.replace(router, block=ec.scheduler.page_size))
    done = drive_cluster(replicas, requests)
    per = [[o for j, o in done if j == i] for i in range(num_replicas)]
    results = tuple(summarize(policy, e, outs, len(outs)) for e, outs in zip(engines, per))
    everything = types.SimpleNamespace(records=[rec for e in engines for rec in e.records])
    outs = [o for _, o in done]
    overall = summarize(f"{policy}/{router.policy}", everything, outs, len(requests))  # type: ignore[arg-type]
    return ClusterResult(
        router=router.policy,
        overall=overall,
        replicas=results,
        requests=tuple(replicas.router.routed),
        prefix_hits=replicas.router.prefix_hits,
        fallbacks=replicas.router.fallbacks,
    )


def format_cluster(results: Sequence[ClusterResult]) -> str:
    lines = [
        f"{'run':<22} {'reuse':>7} {'mean lat s':>10} {'p99 s':>8} {'rounds':>7} {'max rounds':>10} "
        f"{'req/replica min-mean-max':>26} {'reuse/replica min-max':>22} {'prefix':>7} {'fallback':>8}"
    ]
    for c in results:
        reqs, reuse = c.requests, [r.reuse for r in c.replicas if r.num_requests]
        mean = sum(reqs) / len(reqs)
        lines.append(
            f"{c.overall.policy:<22} {c.overall.reuse:>7.1%} {c.overall.mean_latency_s:>10.3f} "
            f"{c.overall.p99_latency_s:>8.3f} {c.overall.rounds:>7d} {max(r.rounds for r in c.replicas):>10d} "
            f"{f'{min(reqs)}-{mean:.1f}-{max(reqs)}':>26} {f'{min(reuse):.1%}-{max(reuse):.1%}':>22} "
            f"{c.prefix_hits:>7d} {c.fallbacks:>8d}"
        )
    return "\n".join(lines)


def run_cluster_cli(args: Any, cfg: BenchConfig, requests: Sequence[BenchRequest], config: dict[str, Any]) -> int:
    """``radixflow bench --executor sim --replicas N --router R``: every policy behind the router."""
    from radixflow_jax.sim.specs import get_device_spec, get_model_spec

    router = RouterConfig(policy=args.router)
    spec, device = get_model_spec(args.model), get_device_spec(args.device)
    results = [run_cluster(spec, device, requests, cfg, p, args.replicas, router) for p in cfg.policies]
    print(format_cluster(results))
    if args.json_out:
        import json

        config = dict(config, replicas=args.replicas, router=args.router, num_requests=len(requests))
        with open(args.json_out, "w") as f:
            json.dump({"config": config, "clusters": [c.as_dict() for c in results]}, f, indent=2)
    return 0
