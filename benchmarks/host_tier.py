"""The host tier on the simulator: many conversations that come back after the others pushed their
states out of the device pool, with and without a host tier for checkpoints, under every policy,
side by side in one process (the simulator is deterministic: one run each).

Workload: ``multiturn`` conversations (``--sessions`` of ``--turns`` turns; a first turn of 300
tokens, later turns of 40 new tokens after the real answer of 32), arriving as a Poisson process
(``--rate`` conversations/s), each later turn ``--think-time`` seconds (mean, exponential) after
the answer before it. The device's state pool holds ``--checkpoint-slots`` checkpoints beyond the
running requests' ``max_num_seqs`` (by default a tenth of the sessions); the host tier holds
``--host-cache-gb`` GiB, of which ``--host-kv-fraction`` for KV pages (by default none: the device's
KV pool, sized from its memory, is never short on this workload, so the whole tier holds
checkpoints; ``--kv-pages`` makes it short); copies go over the device's host link
(``sim/hostlink.py``). ``--model qwen3-8b --kv-pages 2800 --host-kv-fraction 1``: the same for KV
pages on an attention-only model.

Reports per tier and policy: mean latency, TTFT, p99, reuse (prompt tokens served from the cache),
restores and spills, consumer waits and the bubble tokens a stop left (``native`` only; radixflow
and pair fill the round while a consumer waits for its restore).

``python benchmarks/host_tier.py`` (Qwen3.5-9B on an H200, the acceptance setting of issue #46).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

from radixflow_jax.bench.run import BenchConfig, sim_runner
from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.sim.specs import get_device_spec, get_model_spec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3.5-9b")
    p.add_argument("--device", default="h200")
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--rate", type=float, default=50.0, help="conversations per second (Poisson)")
    p.add_argument("--think-time", type=float, default=2.0, help="mean seconds from an answer to the next turn")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--checkpoint-slots", type=int, default=None, help="default: a tenth of the sessions")
    p.add_argument("--host-cache-gb", type=float, default=64.0)
    p.add_argument("--host-kv-fraction", type=float, default=0.0)
    p.add_argument("--kv-pages", type=int, default=None, help="the device's KV pages (default: from its memory)")
    p.add_argument("--policies", default="native,radixflow,pair")
    args = p.parse_args()
    spec, device = get_model_spec(args.model), get_device_spec(args.device)
    ckpts = args.checkpoint_slots if args.checkpoint_slots is not None else max(1, args.sessions // 10)
    workload = WorkloadSpec(
        "multiturn", num_requests=args.sessions * args.turns, turns=args.turns, arrival="sessions", rate=args.rate,
        think_time=args.think_time,
    )
    requests = generate(workload)
    policies = tuple(args.policies.split(","))
    base = EngineConfig.from_options(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=8192, num_state_slots=1 + args.max_num_seqs + ckpts,
        host_kv_fraction=args.host_kv_fraction, num_kv_pages=args.kv_pages,
    )
    print(f"# {args.model} on {args.device}: {args.sessions} conversations x {args.turns} turns, think time "
          f"{args.think_time} s, {args.rate}/s; state pool {ckpts} checkpoints + {args.max_num_seqs} running "
          f"({spec.state_bytes / 2**20:.1f} MiB each); host link {device.host_link_bandwidth / 1e9:.0f} GB/s per "
          f"direction, {device.host_link_latency_s * 1e6:.0f} us a copy; load {os.getloadavg()[0]:.2f}")  # fmt: skip
    print("| host tier | policy | mean latency s | TTFT s | p99 s | reuse | restores | spills | KV pages back "
          "| KV pages spilled | consumer waits | bubble tokens | rounds |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for gb in (0.0, args.host_cache_gb):
        cfg = BenchConfig(policies=policies, engine=dataclasses.replace(base, host_cache_gb=gb))
        run = sim_runner(spec, device, requests, cfg)
        for policy in policies:
            t = time.perf_counter()
            r, _ = run(policy)
            tier = f"{gb:g} GiB" if gb else "none"
            waits = r.consumers_waiting + r.consumers_blocked
            print(f"| {tier} | {policy} | {r.mean_latency_s:.3f} | {r.mean_ttft_s:.3f} | {r.p99_latency_s:.3f} "
                  f"| {r.reuse:.1%} | {r.host_restores} | {r.host_spills} | {r.host_kv_restores} | {r.host_kv_spills} "
                  f"| {waits} | {r.bubble_tokens} "
                  f"| {r.rounds} |")  # fmt: skip
            print(f"<!-- {policy}, {tier}: simulated in {time.perf_counter() - t:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
