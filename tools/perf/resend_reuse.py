"""Prompt tokens served from the cache when clients resend the model's answers exactly or altered.

The head to head's workloads (``bench/h2h.h2h_workload``: ``race``, ``multiturn``, ``chat-many``,
``agentic``; the script's request counts, 2 sessions/s, 16 output tokens, vocabulary 512) run in its
order, a warm-up and ``--runs`` runs each, through *one* engine at the server shape of the head to head
(``radixflow serve --max-num-seqs 16``: 512 batched tokens, page 16, grid 64, its default pools of
4097 KV pages and 145 state slots, policy pair, overlap) over the simulated executor on a virtual
clock (``5 ms + 0.8 ms`` per token slot, as ``chat_padding.py``). Like ``bench/http.run_requests``,
turn k+1 goes after turn k finished with turn k's prompt and answer in front; ``altered`` resends
each answer as other ids, half again as many (re-tokenised text does this: on hybrid-81m's
512-token vocabulary 16 generated ids came back as 20-28 ids, 2026-12-05), ``exact`` as generated.

Prints the cached share of prompt tokens per run (warm-up first). No model, no timing.

    python tools/perf/resend_reuse.py [--runs 3] [--resend exact,altered]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math

from radixflow_jax.bench.agentic import WordIds
from radixflow_jax.bench.h2h import h2h_workload
from radixflow_jax.bench.workloads import BenchRequest
from radixflow_jax.engine.build import assemble_engine
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.engine.roundcost import LinearRoundCost
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.sim.executor import SimExecutor, VirtualClock

COUNTS = {"race": 48, "multiturn": 48, "chat-many": 128, "agentic": 64}  # benchmarks/vs_llamacpp.py
SEQS, TOKENS, PAGE, GRID, VOCAB = 16, 512, 16, 64, 512


def altered(answer: tuple[int, ...], session: int) -> tuple[int, ...]:
    longer = answer + answer[: len(answer) // 2]
    return tuple((7 * t + 11 * session + i) % (VOCAB - 3) + 3 for i, t in enumerate(longer))


def run(engine: EngineCore, clock: VirtualClock, reqs: list[BenchRequest], alter: bool) -> float:
    """One run; the cached share of its prompt tokens."""
    t0 = clock()
    pending = collections.deque(r for r in reqs if r.turn == 0)
    follow: dict[int, collections.deque[BenchRequest]] = collections.defaultdict(collections.deque)
    for r in sorted((r for r in reqs if r.turn > 0), key=lambda r: r.turn):
        follow[r.group].append(r)
    history: dict[int, tuple[int, ...]] = {}
    live: dict[int, BenchRequest] = {}
    prompt = cached = 0

    def submit(r: BenchRequest) -> None:
        params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=True)
        live[engine.add_request(history.get(r.group, ()) + r.prompt, params, arrival_time=clock())] = r

    while pending or engine.has_unfinished():
        while pending and pending[0].arrival_s <= clock() - t0:
            submit(pending.popleft())
        if not engine.has_unfinished():
            if pending:  # idle: wait for the head, then submit it (floats may read a hair early)
                clock.advance(max(pending[0].arrival_s - (clock() - t0), 0.0))
                submit(pending.popleft())
            continue
        for out in engine.step():
            if not out.finished:
                continue
            r = live.pop(out.request_id)
            prompt, cached = prompt + len(out.prompt_token_ids), cached + out.cached_tokens
            if follow[r.group]:
                answer = tuple(out.token_ids)
                history[r.group] = tuple(out.prompt_token_ids) + (altered(answer, r.group) if alter else answer)
                nxt = follow[r.group].popleft()
                pending.appendleft(dataclasses.replace(nxt, arrival_s=clock() - t0))
    return cached / max(prompt, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--resend", default="exact,altered")
    args = p.parse_args()
    for mode in args.resend.split(","):
        config = EngineConfig.from_options(max_num_seqs=SEQS, max_num_batched_tokens=TOKENS, page_size=PAGE,
                                           policy="pair")  # fmt: skip
        spec = EngineSpec(config=config, hybrid=True, chunk_sizes=(GRID,), num_pages=1 + 2 * SEQS * math.ceil(2048 / PAGE),
                          num_slots=1 + SEQS + max(64, 8 * SEQS), max_model_len=4096)  # fmt: skip
        clock = VirtualClock()

        def make(shapes: ShapeConfig) -> SimExecutor:
            return SimExecutor(LinearRoundCost((5e-3, 0.8e-3, 0.0, 0.0, 0.0)), clock, shapes, overlap=True)

        engine = assemble_engine(spec, make, clock=clock)
        for kind, count in COUNTS.items():
            shares = [
                run(engine, clock, h2h_workload(kind, i, requests=count, rate=2.0, output_tokens=16, vocab=VOCAB,
                                                encode=WordIds(VOCAB)), mode == "altered")  # fmt: skip
                for i in range(-1, args.runs)
            ]
            print(f"{mode:8s} {kind:10s} cached " + " ".join(f"{100 * s:5.1f}%" for s in shares), flush=True)


if __name__ == "__main__":
    main()
