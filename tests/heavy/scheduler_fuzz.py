"""Liveness fuzz of the scheduler, no model (the full-size companion of
``tests/scheduler/test_properties.py``, which CI runs at a reduced size). ``test_scheduler_fuzz.py``
runs it as a ``heavy`` test; it also runs alone, with its flags.

What is checked
  * Each seed draws a policy (native, radixflow, pair), overlap on or off, 1-8 rows, a token budget
    of 8-48 (8 is one grid), a pool of 12-64 pages of 4 tokens, 2-8 state slots, an abort rate, and
    2-10 requests over three shared prefixes (prompts up to 80 tokens, 1-12 output tokens) arriving
    in the first 10 rounds.
  * The requests go through ``Scheduler`` as the engine drives it: without overlap each plan commits
    before the next; with overlap each plan is launched at once and commits after the next one is
    planned (a plan that would plant on a token in flight commits it first). Aborts arrive after a
    launch, while the round runs.
  * Every plan: one row per request at most, no more than ``max_num_seqs`` rows or the token budget,
    every row's request running. Every seed: all accepted work done within ``--rounds`` rounds (else
    a livelock), pool and tree invariants at the end.
  * ``--draw stream`` (from a review of 2026-12-01): 10-60 requests arriving over 30-200 rounds,
    mostly short (prompts up to 24 tokens, 1-6 outputs) with 0-30 % long ones (20-48-token prompts,
    8-24 outputs), pools just big enough for the largest request (+0-4 pages), a budget of one grid
    in 70 % of seeds, overlap in 85 %, FCFS or longest-prefix-match order.
  * Prints each failing seed with its draw and the requests' state (id, tokens, computed,
    preemptions, status), then a count, and over the seeds that finished: non-empty plans,
    preemptions, and each seed's slowest request (rounds from arrival to finish; median, p99, max
    over seeds). Exit status 1 if any seed failed.

    python -m pytest -m heavy tests/heavy/test_scheduler_fuzz.py   # both draws, seeds 0-1999
    python -m tests.heavy.scheduler_fuzz                  # seeds 0-1999, a few seconds
    python -m tests.heavy.scheduler_fuzz --draw stream --seeds 0:3000
"""

from __future__ import annotations

import argparse
import random

from radixflow_jax.scheduler.plan import RoundPlan
from radixflow_jax.scheduler.request import Request
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.scheduler import Scheduler


def _check_plan(s: Scheduler, plan: RoundPlan) -> None:
    ids = [r.request_id for r in plan.rows]
    assert len(ids) == len(set(ids)), f"a request has two rows: {ids}"
    assert len(ids) <= s.config.max_num_seqs, f"{len(ids)} rows"
    assert plan.num_tokens <= s.config.max_num_batched_tokens, f"{plan.num_tokens} tokens"
    for rid in ids:
        assert s.requests[rid] in s.running, f"a row of request {rid}, which is not running"


def _draw(rng: random.Random) -> tuple[SchedulerConfig, int, int, bool, float, dict[int, list[Request]]]:
    rows = rng.choice([1, 2, 4, 4, 8])
    cfg = SchedulerConfig(
        max_num_seqs=rows, max_num_batched_tokens=max(rng.choice([8, 16, 16, 48]), rows), page_size=4, grid=8,
        hybrid=True, policy=rng.choice(["native", "radixflow", "pair"]),
    )  # fmt: skip
    pages, slots = rng.choice([12, 16, 16, 22, 32, 64]), rng.choice([2, 3, 4, 8])
    overlap, abort_p = rng.random() < 0.6, rng.choice([0.0, 0.0, 0.02, 0.1])
    prefixes = [tuple(rng.randrange(100, 200) for _ in range(rng.choice([8, 16, 24, 32, 40]))) for _ in range(3)]
    arrivals: dict[int, list[Request]] = {}
    for i in range(rng.randint(2, 10)):
        prompt = rng.choice(prefixes)[: rng.randrange(0, 41)] + tuple(rng.randrange(10, 60) for _ in range(rng.randint(1, 40)))
        arrivals.setdefault(rng.randrange(0, 10), []).append(Request(i, prompt, rng.randint(1, 12)))
    return cfg, pages, slots, overlap, abort_p, arrivals


def _draw_stream(rng: random.Random) -> tuple[SchedulerConfig, int, int, bool, float, dict[int, list[Request]]]:
    rows, budget = rng.choice([2, 4, 8, 8]), 8 if rng.random() < 0.7 else rng.choice([16, 24])
    cfg = SchedulerConfig(
        max_num_seqs=rows, max_num_batched_tokens=max(budget, rows), page_size=4, grid=8, hybrid=True,
        policy=rng.choice(["native", "radixflow", "pair"]), queue_order=rng.choice(["fcfs", "fcfs", "lpm"]),
    )  # fmt: skip
    slots, overlap, abort_p = rng.choice([2, 4, 8, 16]), rng.random() < 0.85, rng.choice([0.0, 0.0, 0.0, 0.03])
    span, num, long_p = rng.choice([30, 60, 120, 200]), rng.randint(10, 60), rng.choice([0.0, 0.1, 0.3])
    prefixes = [tuple(rng.randrange(100, 200) for _ in range(rng.choice([8, 16, 24]))) for _ in range(3)]
    reqs = []
    for i in range(num):
        if rng.random() < long_p:
            reqs.append(Request(i, tuple(rng.randrange(10, 60) for _ in range(rng.randint(20, 48))), rng.randint(8, 24)))
        else:
            own = tuple(rng.randrange(10, 60) for _ in range(rng.randint(1, 8)))
            reqs.append(Request(i, rng.choice(prefixes)[: rng.randrange(0, 17)] + own, rng.randint(1, 6)))
    pages = -(-max(len(r.prompt) + r.max_tokens for r in reqs) // 4) + rng.choice([0, 0, 1, 2, 4])
    arrivals: dict[int, list[Request]] = {}
    for r in reqs:
        arrivals.setdefault(rng.randrange(0, span), []).append(r)
    return cfg, pages, slots, overlap, abort_p, arrivals


def run_seed(seed: int, rounds: int, draw: str = "tiny", totals: dict[str, list[int]] | None = None) -> str | None:
    """None if the seed's run finished cleanly, else what went wrong. ``totals`` collects the plans,
    preemptions and slowest request (rounds from arrival to finish) of a clean run."""
    rng = random.Random(seed)
    cfg, pages, slots, overlap, abort_p, arrivals = (_draw if draw == "tiny" else _draw_stream)(rng)
    arrived: dict[int, int] = {}
    plans = 0
    s = Scheduler(cfg, num_pages=pages, num_slots=slots)
    desc = f"policy={cfg.policy} overlap={overlap} rows={cfg.max_num_seqs} budget={cfg.max_num_batched_tokens} "
    desc += f"pages={pages} slots={slots} abort_p={abort_p}"
    in_flight: RoundPlan | None = None
    finished: dict[int, int] = {}
    try:
        for rnd in range(rounds):
            for req in arrivals.get(rnd, ()):
                try:
                    s.add(req)
                    arrived[req.request_id] = rnd
                except ValueError:
                    pass  # can never fit: refused at add, as the engine refuses it
            if in_flight is not None and s.plants_on_unknown():
                s.commit(in_flight, {r.request_id: 7 for r in in_flight.rows if r.sample})
                in_flight = None
            if rnd >= max(arrivals) and not s.has_work() and in_flight is None:
                break
            plan = s.schedule()
            _check_plan(s, plan)
            plans += bool(plan.rows)
            if not overlap:
                if plan.rows:
                    s.commit(plan, {r.request_id: 7 for r in plan.rows if r.sample})
            else:
                if plan.rows:
                    s.launch(plan)
                if in_flight is not None:
                    s.commit(in_flight, {r.request_id: 7 for r in in_flight.rows if r.sample})
                in_flight = plan if plan.rows else None
            if rng.random() < abort_p and s.running:
                s.abort(rng.choice(s.running).request_id)
            for rid, start in list(arrived.items()):
                if s.requests[rid].is_finished:
                    finished[rid] = rnd - start
                    del arrived[rid]
        s.memory.pages.check_invariants()
        if s.memory.cache is not None:
            s.memory.cache.check_invariants()
    except (AssertionError, ValueError) as exc:
        return f"{desc}: {type(exc).__name__}: {exc}"
    if s.has_work():
        state = [(r.request_id, r.num_tokens, r.num_computed, r.num_preemptions, r.status.name) for r in s.requests.values()]
        return f"{desc}: livelock after {rounds} rounds: {state}"
    if totals is not None:
        totals["plans"].append(plans)
        totals["preemptions"].append(sum(r.num_preemptions for r in s.requests.values()))
        totals["slowest"].append(max(finished.values(), default=0))
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0:2000", help="first:end (end excluded)")
    ap.add_argument("--rounds", type=int, default=2000, help="rounds per seed before calling it a livelock")
    ap.add_argument("--draw", choices=("tiny", "stream"), default="tiny", help="the distribution of runs (above)")
    args = ap.parse_args(argv)
    lo, hi = (int(x) for x in args.seeds.split(":"))
    failed, totals = 0, {"plans": [], "preemptions": [], "slowest": []}
    for seed in range(lo, hi):
        why = run_seed(seed, args.rounds, args.draw, totals)
        if why is not None:
            failed += 1
            print(f"seed {seed}: {why}")
    slow = sorted(totals["slowest"])
    print(f"{failed} of {hi - lo} seeds failed; over the {len(slow)} that finished: {sum(totals['plans'])} plans, "
          f"{sum(totals['preemptions'])} preemptions, slowest request per seed (rounds from arrival to finish) "
          f"median {slow[len(slow) // 2]}, p99 {slow[int(0.99 * len(slow))]}, max {slow[-1]}" if slow else "")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
