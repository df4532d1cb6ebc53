"""Question: how many prompt tokens, and how much wall time, does the host tier (cache/tiers.py,
cache/hostkv.py) save on the CPU model executor when conversations need several times the device
state pool (and, with ``--kv-pages``, several times the device KV page pool too)?

Many sessions, several turns each; every turn of all sessions is sent together (so the others push a
session's checkpoints out of the device pool before it returns), each turn resending the history
with the real answer. Three engines over one loaded model, runs interleaved: the cache off (the
cold oracle), the cache without a host tier, the cache with one. Prints per run the prompt tokens
computed, restores, spills, wall time of the whole conversation set, and whether outputs equal the
cold run's; then medians. Usage: ``python tools/perf/host_tier.py [--sessions 16 --turns 4
--slots 8 --repeats 3 --policy pair --model tiny-qwen3.5 --kv-pages 24]``; ``--kv-pages``: the
device page pool (default: room for every conversation), the host tier then holding KV pages too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.llm import LLM
from radixflow_jax.models.api import load


def conversations(llm: LLM, sessions: int, turns: int) -> tuple[list[tuple[int, ...]], int, float]:
    # each session's first token tells it apart; ids stay inside a tiny preset's 512-token vocabulary
    history = {s: (3 + s,) + tuple((7 * s + 13 * i) % 480 + 20 for i in range(36)) for s in range(sessions)}
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    outputs, computed = [], 0
    start = time.perf_counter()
    for turn in range(turns):
        prompts = [history[s] + (300 + turn, 301 + s) for s in range(sessions)]
        for s, out in enumerate(llm.generate(prompts, [params] * sessions)):
            outputs.append(tuple(out.token_ids))
            computed += out.prompt_tokens - out.cached_tokens
            history[s] = prompts[s] + tuple(out.token_ids)
    return outputs, computed, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-qwen3.5")
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--slots", type=int, default=8, help="checkpoint slots of the device pool (beyond max_num_seqs)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--policy", default="pair")
    p.add_argument("--kv-pages", type=int, default=None, help="device KV pages (default: every conversation's)")
    args = p.parse_args()
    model = load(args.model)
    seqs = 4
    # KV pages for every conversation unless --kv-pages, state slots for a few of them
    needed = 1 + 2 * args.sessions * (40 + args.turns * 12) // 16 + 64
    pages = args.kv_pages if args.kv_pages is not None else needed
    options = dict(max_num_seqs=seqs, max_num_batched_tokens=128, num_state_slots=1 + seqs + args.slots,
                   num_kv_pages=pages, max_model_len=128 if args.kv_pages is not None else 512)  # fmt: skip
    host_pages = 2 * needed if args.kv_pages is not None else 0
    engines = {
        "cold": dict(policy="no-cache"),
        "no tier": dict(policy=args.policy, num_host_slots=0),
        "host tier": dict(policy=args.policy, num_host_slots=4 * args.sessions, num_host_pages=host_pages),
    }
    print(f"load before: {os.getloadavg()[0]:.2f}; {args.sessions} sessions x {args.turns} turns, "
          f"{args.slots} checkpoint slots, {pages} KV pages ({host_pages} host pages), policy {args.policy}")  # fmt: skip
    rows: dict[str, list[tuple[int, float]]] = {k: [] for k in engines}
    cold_out = None
    for rep in range(args.repeats + 1):  # the first pass compiles: not kept
        for name, kw in engines.items():
            llm = LLM(model, **kw, **options)
            out, computed, wall = conversations(llm, args.sessions, args.turns)
            cache = llm.replicas.engines[0].scheduler.memory.cache
            if name == "cold":
                cold_out = out
            same = out == cold_out
            restored = cache.restored if cache is not None else 0
            spilled = cache.demoted if cache is not None else 0
            kv = f"KV pages spilled {cache.kv_demoted:4d}, back {cache.kv_restored:4d}, " if cache is not None else ""
            if rep:
                rows[name].append((computed, wall))
            print(f"run {rep}{' (warm-up)' if not rep else ''} {name:9s}: computed {computed:6d} prompt tokens, "
                  f"restores {restored:4d}, spills {spilled:4d}, {kv}{wall:6.2f} s, outputs equal cold: {same}")  # fmt: skip
    print("medians:")
    for name, vals in rows.items():
        print(f"  {name:9s}: computed {statistics.median(v[0] for v in vals):8.0f}, "
              f"wall {statistics.median(v[1] for v in vals):6.2f} s (range {min(v[1] for v in vals):.2f}-"
              f"{max(v[1] for v in vals):.2f})")  # fmt: skip
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
