"""How far apart the running requests' state slots drift on a warm engine, with and without the
request band of the slot pool (``cache/pools.SlotPool``), without running a model.

One engine per arm at the head to head's server shape (16 rows / 512 tokens, page 16, grid 64,
policy pair, overlap, the server's default pools: 145 state slots) over the simulated executor on
a virtual clock (``chat_padding.py``'s: a round costs ``--round-ms`` plus ``--slot-ms`` per token
slot of its variant) runs the head to head's workloads one after another as a server does: a
warm-up and three runs of ``multiturn``, then ``chat-many``, ``agentic`` and ``multiturn`` again
(``bench/h2h.h2h_workload``, the script's request counts, 2 sessions/s, 16 output tokens).
``band off`` sets the pool's ``request_slots`` to 0 (the pool as it was before the band: a kept
end stays in its request's slot and later requests take whatever slot is free).

Per arm and run it prints rounds, the padding share of token slots, the rounds whose decode region
took 16 rows beside prefill rows, and the mean decode span (the window of slots its decode rows
cover, ``runner/window.py``) against the mean number of decode rows.

    python tools/perf/slot_spread.py [--round-ms 20] [--slot-ms 0.9]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from radixflow_jax.bench.agentic import WordIds
from radixflow_jax.bench.driver import drive
from radixflow_jax.bench.h2h import h2h_workload
from radixflow_jax.engine.build import assemble_engine
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.runner.window import place_decode
from radixflow_jax.sim.executor import VirtualClock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_padding  # noqa: E402  (the counting executor and the workloads' request counts)

SEQUENCE = [("multiturn", -1), ("multiturn", 0), ("multiturn", 1), ("multiturn", 2), ("chat-many", 0),
            ("agentic", 0), ("multiturn", 3)]  # fmt: skip


class Spread(chat_padding.Counting):
    """The counting executor, also noting each round's decode rows and the span they cover."""

    def __init__(self, shapes: ShapeConfig, clock: VirtualClock):
        super().__init__(shapes, clock)
        self.spans: list[tuple[int, int]] = []

    def execute(self, plan, sampling):  # type: ignore[no-untyped-def]
        placed = place_decode(plan, self.shapes.max_num_seqs)
        if placed.rows:
            self.spans.append((len(placed.rows), placed.span))
        return super().execute(plan, sampling)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--round-ms", type=float, default=20.0)
    p.add_argument("--slot-ms", type=float, default=0.9)
    args = p.parse_args()
    chat_padding.ROUND_S, chat_padding.SLOT_S = args.round_ms / 1e3, args.slot_ms / 1e3
    seqs = chat_padding.SEQS
    print(f"{'arm':8s} {'workload':10s} {'run':>3s} {'rounds':>6s} {'pad':>6s} {'mixed D=16':>10s} {'decode rows':>11s} {'span':>5s}")
    for arm in ("band off", "band on"):
        config = EngineConfig.from_options(max_num_seqs=seqs, max_num_batched_tokens=chat_padding.TOKENS,
                                           page_size=chat_padding.PAGE, policy="pair")  # fmt: skip
        spec = EngineSpec(config=config, hybrid=True, chunk_sizes=(chat_padding.GRID,),
                          num_pages=1 + 2 * seqs * math.ceil(2048 / chat_padding.PAGE),
                          num_slots=1 + seqs + max(64, 8 * seqs), max_model_len=chat_padding.MAX_LEN)  # fmt: skip
        clock, made = VirtualClock(), []

        def make(shapes: ShapeConfig) -> Spread:
            made.append(Spread(shapes, clock))
            return made[0]

        engine = assemble_engine(spec, make, clock=clock)
        if arm == "band off":
            engine.scheduler.memory.slots.request_slots = 0
        ex = made[0]
        for kind, run in SEQUENCE:
            n0, s0 = len(ex.rounds), len(ex.spans)
            reqs = h2h_workload(kind, run, requests=chat_padding.WORKLOADS[kind], rate=2.0, output_tokens=16,
                                vocab=chat_padding.VOCAB, encode=WordIds(chat_padding.VOCAB))  # fmt: skip
            drive(engine, reqs, wait=clock.advance)
            rounds, spans = ex.rounds[n0:], ex.spans[s0:]
            d16 = sum(1 for _, _, v in rounds if v.num_decode == seqs and v.prefill_rows)
            rows = sum(r for r, _ in spans) / max(len(spans), 1)
            span = sum(s for _, s in spans) / max(len(spans), 1)
            print(f"{arm:8s} {kind:10s} {run:3d} {len(rounds):6d} {chat_padding.padding(rounds):>6s} {d16:10d} "
                  f"{rows:11.1f} {span:5.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
