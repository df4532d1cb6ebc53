"""Prompts behind decode rows under a small token budget: rounds to first token, scheduler only (no
model, seconds to run).

What is measured
  * A stream of arrivals through ``Scheduler`` for ``--rounds`` rounds (radixflow policy, grid 64,
    page 16, pools large enough that memory never binds): a short request (20-token prompt,
    ``--short-output`` output tokens) every ``--short-every`` rounds and a long one (``--long-len``
    tokens, 8 output tokens) every ``--long-every`` rounds; random token ids (no shared prefixes).
  * Per kind: how many arrived, how many got their first token, and the rounds from arrival to the
    first token (median, p90, max), for each ``--budgets`` value and ``--rows`` rows per round.
  * Two schedulers side by side on the same arrivals: ``prefill-first`` (the engine's: a round that
    gives a prompt no tokens while all its rows compute one token is followed by a round that plans
    prompts before decode rows) and ``decode-first`` (the same scheduler with that rule removed:
    decode rows always take their tokens first, so with ``budget - rows < grid`` a prompt gets no
    grid span until the decoders finish, and FCFS admission stops behind it).

    python tools/perf/small_budget.py
    python tools/perf/small_budget.py --budgets 64,128,512 --rows 4,8
"""

from __future__ import annotations

import argparse
import contextlib
from unittest import mock

import numpy as np

from radixflow_jax.scheduler.builder import RoundBuilder
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.request import Request
from radixflow_jax.scheduler.scheduler import Scheduler


def decode_first() -> contextlib.AbstractContextManager:
    """The scheduler without its prefill-first rule (``RoundBuilder.note_starved`` never marks a
    round as starving a prompt). The rest of the scheduler is kept (decode rows before running
    prompts, admission capped at ``max_num_seqs`` running requests), so the comparison isolates the
    rule."""
    return mock.patch.object(RoundBuilder, "note_starved", lambda self, wanted: None)


def simulate(args: argparse.Namespace, budget: int, rows: int) -> dict[str, list[int]]:
    cfg = SchedulerConfig(max_num_seqs=rows, max_num_batched_tokens=budget, page_size=16, grid=64, hybrid=True,
                          policy="radixflow")  # fmt: skip
    s = Scheduler(cfg, num_pages=1 << 14, num_slots=1 << 10)
    rng = np.random.default_rng(args.seed)
    arrived: dict[int, tuple[str, int]] = {}
    waits: dict[str, list[int]] = {"short": [], "long": []}
    for rnd in range(args.rounds):
        for kind, every, length, out in (("short", args.short_every, 20, args.short_output),
                                         ("long", args.long_every, args.long_len, 8)):  # fmt: skip
            if rnd % every == (0 if kind == "short" else 5 % every):
                rid = len(arrived)
                s.add(Request(rid, tuple(rng.integers(10, 30000, length).tolist()), max_tokens=out))
                arrived[rid] = (kind, rnd)
        plan = s.schedule()
        s.commit(plan, {r.request_id: 1 for r in plan.rows if r.sample})
        for r in plan.rows:
            req = s.requests.get(r.request_id)
            if r.sample and req is not None and len(req.output) == 1:
                kind, at = arrived[r.request_id]
                waits[kind].append(rnd - at)
    counts = {k: sum(1 for kind, _ in arrived.values() if kind == k) for k in waits}
    return {"arrived": counts, **waits}  # type: ignore[dict-item]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budgets", default="64,128,512", help="comma-separated max_num_batched_tokens values")
    p.add_argument("--rows", default="4,8", help="comma-separated max_num_seqs values")
    p.add_argument("--rounds", type=int, default=800)
    p.add_argument("--short-every", type=int, default=16)
    p.add_argument("--short-output", type=int, default=48)
    p.add_argument("--long-every", type=int, default=60)
    p.add_argument("--long-len", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(f"{'budget':>6s} {'rows':>4s} {'scheduler':>13s} {'kind':>5s} {'arrived':>7s} {'served':>6s} "
          f"{'median':>6s} {'p90':>5s} {'max':>5s}   (rounds from arrival to first token)")  # fmt: skip
    for budget in map(int, args.budgets.split(",")):
        for rows in map(int, args.rows.split(",")):
            for name, rule in (("prefill-first", contextlib.nullcontext()), ("decode-first", decode_first())):
                with rule:
                    res = simulate(args, budget, rows)
                for kind in ("short", "long"):
                    w = res[kind]
                    empty = f"{'-':>6s} {'-':>5s} {'-':>5s}"
                    stats = f"{np.median(w):6.0f} {np.percentile(w, 90):5.0f} {max(w):5d}" if w else empty
                    print(f"{budget:6d} {rows:4d} {name:>13s} {kind:>5s} {res['arrived'][kind]:7d} {len(w):6d} {stats}")


if __name__ == "__main__":
    main()
