"""Padding of the head-to-head chat and agent workloads per bucket scheme, without running a model.

The workloads ``multiturn``, ``chat-many`` and ``agentic`` (``bench/h2h.h2h_workload``, run 0, the
script's defaults: 48 / 128 / 64 requests, 2 sessions/s, 16 output tokens, vocabulary 512; the
agentic text tokenised by ``WordIds``, one id per word, as runs without a tokenizer do) go through
the real engine and scheduler at the server shape of the head to head (``radixflow serve
--max-num-seqs 16``: 512 batched tokens, page 16, grid 64, policy pair, prefix cache on, overlap)
over the simulated executor (``sim/executor.SimExecutor``), which selects each round's variant as
the model executor does (``runner/window.variant_for``), in the ``packed`` mixed layout the CPU
model executor runs (``--layout window``: the accelerators' layout).

Arrivals: the driver of the benchmarks (``bench/driver.drive``) on a virtual clock. Each round
advances it by a line fitted to hybrid-81m's rounds, ``5 ms + 0.8 ms per token slot`` of the
variant (the h2h chat runs' rounds), so a finer scheme also makes rounds shorter and the arrivals
fall into rounds as they would; idle gaps are skipped. Turn k+1 follows turn k's answer, with the
answer (a fixed id: EOS ignored) in front.

Per scheme and workload it prints: rounds; the padding share of token slots over the rounds with
fewer than ``--lean`` (128) real tokens and over all rounds; the distinct variants the run used;
and ``ShapeConfig.variants()`` at the server shape and at the tests' shape GUARDED (4 rows, 64
tokens: ``tests/engine/test_compile_guard.py`` compiles all of those); with ``--by-bucket``, each
token bucket's rounds, real tokens and padding.

    python tools/perf/chat_padding.py [--lean 128] [--modes fine,pow2] [--layout packed] [--by-bucket]
"""

from __future__ import annotations

import argparse
import math
from typing import Mapping

from radixflow_jax.bench.agentic import WordIds
from radixflow_jax.bench.driver import drive
from radixflow_jax.bench.h2h import h2h_workload
from radixflow_jax.engine.build import assemble_engine
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.protocol import DeferredRound, StepResult
from radixflow_jax.engine.roundcost import LinearRoundCost
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.runner.inputs import SamplingRow
from radixflow_jax.runner.shapes import ShapeConfig, Variant
from radixflow_jax.runner.window import variant_for
from radixflow_jax.scheduler.plan import RoundPlan
from radixflow_jax.sim.executor import SimExecutor, VirtualClock

WORKLOADS = {"multiturn": 48, "chat-many": 128, "agentic": 64}  # requests per run (benchmarks/vs_llamacpp.py)
SEQS, TOKENS, PAGE, GRID, MAX_LEN, VOCAB = 16, 512, 16, 64, 4096, 512
ROUND_S, SLOT_S = 5e-3, 0.8e-3  # hybrid-81m: a round is about 5 ms + 0.8 ms per token slot
GUARDED = dict(max_num_seqs=4, max_num_batched_tokens=64)  # tests/engine/workloads.py


class Counting(SimExecutor):
    """The simulated executor, counting per round its real tokens, token slots and variant."""

    def __init__(self, shapes: ShapeConfig, clock: VirtualClock):
        cost = LinearRoundCost((ROUND_S, SLOT_S, 0.0, 0.0, 0.0))
        super().__init__(cost, clock, shapes, overlap=True)
        self.rounds: list[tuple[int, int, Variant]] = []

    def execute(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow]) -> StepResult:
        variant, _ = variant_for(plan, self.shapes)  # type: ignore[arg-type]
        self.rounds.append((plan.num_tokens, variant.num_tokens, variant))
        return super().execute(plan, sampling)

    def collect(self, handle: DeferredRound) -> StepResult:
        return self.execute(handle.plan, handle.sampling)


def run(kind: str, mode: str, layout: str = "packed") -> Counting:
    """One run of workload ``kind`` in bucket mode ``mode`` and mixed layout ``layout``; the executor
    holds its rounds."""
    config = EngineConfig.from_options(
        max_num_seqs=SEQS, max_num_batched_tokens=TOKENS, page_size=PAGE, policy="pair", bucket_mode=mode,
        mixed_layout=layout,
    )
    spec = EngineSpec(
        config=config,
        hybrid=True,
        chunk_sizes=(GRID,),
        num_pages=1 + 2 * SEQS * math.ceil(2048 / PAGE),
        num_slots=1 + SEQS + max(64, 8 * SEQS),
        max_model_len=MAX_LEN,
    )
    clock = VirtualClock()
    executors: list[Counting] = []

    def make(shapes: ShapeConfig) -> Counting:
        executors.append(Counting(shapes, clock))
        return executors[0]

    engine = assemble_engine(spec, make, clock=clock)
    reqs = h2h_workload(kind, 0, requests=WORKLOADS[kind], rate=2.0, output_tokens=16, vocab=VOCAB,
                        encode=WordIds(VOCAB))  # fmt: skip
    outs = drive(engine, reqs, wait=clock.advance)
    assert len(outs) == len(reqs), f"{kind}: {len(outs)} of {len(reqs)} requests finished"
    return executors[0]


def padding(rounds: list[tuple[int, int, Variant]]) -> str:
    real, slots = sum(r for r, _, _ in rounds), sum(s for _, s, _ in rounds)
    return f"{100 * (1 - real / slots):5.1f}%" if slots else "    -"


def by_bucket(rounds: list[tuple[int, int, Variant]]) -> None:
    """Per token bucket (and variant kind): rounds, real tokens, slots, and its padding as a share
    of all the run's slots."""
    total = sum(s for _, s, _ in rounds)
    for key in sorted({(v.num_tokens, v.kind) for _, _, v in rounds}):
        mine = [(r, s) for r, s, v in rounds if (v.num_tokens, v.kind) == key]
        real, slots = sum(r for r, _ in mine), sum(s for _, s in mine)
        print(f"    T={key[0]:4d} {key[1]:8s} rounds {len(mine):4d}  real {real:6d}  slots {slots:6d}  "
              f"padding {slots - real:5d} ({100 * (slots - real) / total:4.1f} % of the run's slots)")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lean", type=int, default=128, help="a lean round carries fewer real tokens than this")
    p.add_argument("--modes", default="fine,pow2")
    p.add_argument("--layout", default="packed", choices=("packed", "window"))
    p.add_argument("--by-bucket", action="store_true", help="each token bucket's rounds and padding")
    args = p.parse_args()
    head = f"{'scheme':6s} {'workload':10s} {'rounds':>6s} {'lean':>5s} {'pad<' + str(args.lean):>7s} {'pad all':>7s}"
    print(head + f" {'used':>4s} {'variants':>8s} {'GUARDED':>7s}   mean real tokens per lean round")
    for mode in args.modes.split(","):
        server = len(ShapeConfig(TOKENS, SEQS, MAX_LEN // PAGE, GRID, mode=mode, mixed_layout=args.layout).variants())
        small = ShapeConfig(GUARDED["max_num_batched_tokens"], GUARDED["max_num_seqs"], 16, 16, mode=mode,
                            mixed_layout=args.layout)  # fmt: skip
        guarded = len(small.variants())
        for kind in WORKLOADS:
            rounds = run(kind, mode, args.layout).rounds
            lean = [r for r in rounds if r[0] < args.lean]
            used = len({v for _, _, v in rounds})
            mean = sum(r for r, _, _ in lean) / max(len(lean), 1)
            print(f"{mode:6s} {kind:10s} {len(rounds):6d} {len(lean):5d} {padding(lean):>7s} {padding(rounds):>7s} "
                  f"{used:4d} {server:8d} {guarded:7d}   {mean:.1f}")  # fmt: skip
            if args.by_bucket:
                by_bucket(rounds)


if __name__ == "__main__":
    main()
