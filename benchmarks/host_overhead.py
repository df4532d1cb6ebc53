"""Host overhead of one engine round: planning (``Scheduler.schedule()``) and array building
(``build_arrays`` for the selected step variant), with no device step at all.

What is measured
  * A :class:`Scheduler` built directly with the configuration ``llm.py::build_engine``
    derives for a Qwen3.5-style hybrid (page size 16, checkpoint grid 64, hybrid, policy
    ``radixflow``), ``--max-num-seqs`` rows (64) and ``--max-batched-tokens`` tokens (2048) per round.
  * ``--running + --waiting`` requests (64 + 256) over ``--prefixes`` shared prefixes (prompts of
    ``--prefix-len + --suffix-len`` tokens) are added, and rounds are run (``schedule()``, then
    ``commit()`` with a made-up token for every sampling row) until ``--running`` requests decode
    and the rest still wait. The row budget equals ``--running``, so admissions stop there: every
    measured round plans ``--running`` decode rows and scans the waiting queue, which stays full.
  * Then ``--warmup`` untimed rounds and ``--rounds`` timed rounds: ``plan`` = ``schedule()``,
    ``build`` = ``ShapeConfig.select`` + ``build_arrays``, ``commit`` = ``commit()`` (reported
    apart; the engine's round records count plan and build). Median, p90 and max in microseconds,
    on the wall clock and on the thread's CPU clock (which leaves out time the OS gave to other
    processes, so it stays meaningful on a shared machine).
  * The target is plan + build under 1 ms per round (median and p90); the script prints whether it
    is met and asserts nothing. ``--profile`` prints a cProfile of the timed rounds.

Run (from the repository root, with the venv active; no JAX needed, seconds)::

    python benchmarks/host_overhead.py
    python benchmarks/host_overhead.py --rounds 2000 --profile --json host.json
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import datetime
import json
import math
import os
import platform
import pstats
import sys
import time
from typing import Sequence

import numpy as np

from radixflow_jax.runner.inputs import GREEDY, SamplingRow, StepArrays, build_arrays
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.runner.window import select_round
from radixflow_jax.scheduler.plan import RoundPlan
from radixflow_jax.scheduler.request import Request
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.scheduler import Scheduler

PAGE_SIZE = 16
GRID = 64  # lcm(page size 16, Gated DeltaNet chunk 64), as model_grid derives it
TARGET_US = 1000.0
PARTS = ("plan", "build", "commit", "plan+build")
CLOCKS = ("wall", "cpu")


@dataclasses.dataclass(frozen=True)
class Setup:
    running: int = 64
    waiting: int = 256
    prefixes: int = 16
    prefix_len: int = 256
    suffix_len: int = 64
    max_batched_tokens: int = 2048
    policy: str = "radixflow"
    warmup: int = 50
    rounds: int = 500
    vocab: int = 32000
    seed: int = 0

    @property
    def prompt_len(self) -> int:
        return self.prefix_len + self.suffix_len


@dataclasses.dataclass
class Bench:
    """The scheduler under test with the shapes and sampling table the executor would use."""

    scheduler: Scheduler
    shapes: ShapeConfig
    sampling: dict[int, SamplingRow]
    rng: np.random.Generator
    num_slots: int  # the device pool's, as the executor sizes it (the decode window must fit)


@dataclasses.dataclass(frozen=True)
class Stats:
    median_us: float
    p90_us: float
    max_us: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Stats:
        us = np.asarray(seconds) * 1e6
        return cls(float(np.median(us)), float(np.percentile(us, 90)), float(us.max()))


# ------------------------------------------------------------------------------------- setup
def max_model_len(s: Setup, ramp_rounds: int) -> int:
    """Room for the prompt plus every round the running requests may decode, in whole pages."""
    tokens = s.prompt_len + ramp_rounds + s.warmup + s.rounds + PAGE_SIZE
    return math.ceil(tokens / PAGE_SIZE) * PAGE_SIZE


def pools(s: Setup, model_len: int) -> tuple[int, int]:
    """``(num_kv_pages, num_state_slots)`` by ``llm.py::pool_sizes``'s defaults."""
    pages = 1 + max(2 * s.running * math.ceil(min(model_len, 2048) / PAGE_SIZE), math.ceil(model_len / PAGE_SIZE))
    slots = 1 + s.running + max(64, 8 * s.running)
    return pages, slots


def make_bench(s: Setup, ramp_rounds: int = 1000) -> Bench:
    model_len = max_model_len(s, ramp_rounds)
    config = SchedulerConfig(
        max_num_seqs=s.running, max_num_batched_tokens=s.max_batched_tokens, page_size=PAGE_SIZE, grid=GRID,
        hybrid=True, policy=s.policy,
    )  # fmt: skip
    pages, slots = pools(s, model_len)
    shapes = ShapeConfig(max_num_batched_tokens=s.max_batched_tokens, max_num_seqs=s.running,
                         max_pages_per_row=math.ceil(model_len / PAGE_SIZE), grid=GRID)  # fmt: skip
    rng = np.random.default_rng(s.seed)
    bench = Bench(Scheduler(config, num_pages=pages, num_slots=slots), shapes, {}, rng, max(slots, s.running + 1))
    add_requests(bench, s, max_tokens=model_len - s.prompt_len)
    return bench


def add_requests(bench: Bench, s: Setup, max_tokens: int) -> None:
    """Request ``i`` starts with prefix ``i % prefixes``; ids are random; EOS never stops them."""
    prefixes = bench.rng.integers(1, s.vocab, size=(s.prefixes, s.prefix_len))
    for i in range(s.running + s.waiting):
        suffix = bench.rng.integers(1, s.vocab, size=s.suffix_len)
        prompt = tuple(int(t) for t in np.concatenate([prefixes[i % s.prefixes], suffix]))
        bench.scheduler.add(Request(i, prompt, max_tokens))
        bench.sampling[i] = GREEDY


# ------------------------------------------------------------------------------------- rounds
def build(bench: Bench, plan: RoundPlan) -> StepArrays:
    variant, decode = select_round(plan, bench.shapes, bench.num_slots)
    return build_arrays(plan, variant, page_size=PAGE_SIZE, max_pages=bench.shapes.max_pages_per_row,
                        sampling=bench.sampling, decode=decode)  # fmt: skip


def commit(bench: Bench, plan: RoundPlan) -> None:
    sampled = {r.request_id: int(bench.rng.integers(1, 1000)) for r in plan.rows if r.sample}
    bench.scheduler.commit(plan, sampled)


def is_steady(bench: Bench, plan: RoundPlan, s: Setup) -> bool:
    sched = bench.scheduler
    return (len(sched.running) == s.running and len(sched.waiting) == s.waiting
            and len(plan.rows) == s.running and plan.num_decode == s.running)  # fmt: skip


def ramp_up(bench: Bench, s: Setup, limit: int = 1000) -> int:
    """Runs rounds until the steady state; returns how many it took."""
    for n in range(1, limit + 1):
        plan = bench.scheduler.schedule()
        build(bench, plan)
        commit(bench, plan)
        if is_steady(bench, plan, s):
            return n
    raise RuntimeError(
        f"no steady state after {limit} rounds: {len(bench.scheduler.running)} running, "
        f"{len(bench.scheduler.waiting)} waiting"
    )


def now() -> tuple[float, float]:
    """``(wall, thread CPU)`` seconds: CPU time leaves out time the OS gave to other processes."""
    return time.perf_counter(), time.thread_time()


def timed_round(bench: Bench) -> tuple[dict[str, tuple[float, float]], RoundPlan]:
    """One round; ``{part: (wall s, cpu s)}`` for plan, build and commit."""
    t0 = now()
    plan = bench.scheduler.schedule()
    t1 = now()
    build(bench, plan)
    t2 = now()
    commit(bench, plan)
    t3 = now()
    parts = {"plan": (t0, t1), "build": (t1, t2), "commit": (t2, t3), "plan+build": (t0, t2)}
    return {k: (b[0] - a[0], b[1] - a[1]) for k, (a, b) in parts.items()}, plan


def measure(bench: Bench, s: Setup, profiler: cProfile.Profile | None) -> dict[str, list[tuple[float, float]]]:
    for _ in range(s.warmup):
        timed_round(bench)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in PARTS}
    if profiler is not None:
        profiler.enable()
    for _ in range(s.rounds):
        parts, plan = timed_round(bench)
        if not is_steady(bench, plan, s):
            raise RuntimeError("left the steady state while measuring (a request finished or was admitted)")
        for k, v in parts.items():
            times[k].append(v)
    if profiler is not None:
        profiler.disable()
    return times


# ------------------------------------------------------------------------------------- report
def summarize(times: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, Stats]]:
    """``{clock: {part: Stats}}``."""
    return {clock: {part: Stats.of([t[i] for t in times[part]]) for part in PARTS} for i, clock in enumerate(CLOCKS)}


def target_met(st: Stats) -> bool:
    return st.median_us < TARGET_US and st.p90_us < TARGET_US


def print_report(stats: dict[str, dict[str, Stats]], s: Setup, ramp: int) -> None:
    print(f"{s.running} running (decode), {s.waiting} waiting, prompts {s.prompt_len} tokens over {s.prefixes} "
          f"prefixes, budgets {s.running} rows / {s.max_batched_tokens} tokens, policy {s.policy}; "
          f"steady after {ramp} rounds; {s.rounds} timed rounds")  # fmt: skip
    print(f"{'part':<12}" + "".join(f"{c + ' ' + q:>16}" for c in CLOCKS for q in ("median us", "p90 us", "max us")))
    for part in PARTS:
        row = "".join(f"{x:>16.1f}" for c in CLOCKS for x in dataclasses.astuple(stats[c][part]))
        print(f"{part:<12}{row}")
    for clock in CLOCKS:
        met = target_met(stats[clock]["plan+build"])
        print(f"target plan+build < {TARGET_US:.0f} us (median and p90, {clock} clock): {'met' if met else 'NOT met'}")


def print_profile(profiler: cProfile.Profile, top: int) -> None:
    print(f"\ncProfile of the timed rounds (top {top} by cumulative time):")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(top)


def parse_args(argv: Sequence[str] | None) -> tuple[Setup, argparse.Namespace]:
    d = Setup()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for field in dataclasses.fields(Setup):
        p.add_argument("--" + field.name.replace("_", "-"), type=type(getattr(d, field.name)),
                       default=getattr(d, field.name))  # fmt: skip
    p.add_argument("--profile", action="store_true", help="print a cProfile of the timed rounds")
    p.add_argument("--profile-top", type=int, default=25)
    p.add_argument("--json", default=None, help="write the results to this path")
    args = p.parse_args(argv)
    return Setup(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Setup)}), args


def main(argv: Sequence[str] | None = None) -> int:
    s, args = parse_args(argv)
    load_before = os.getloadavg()
    bench = make_bench(s)
    ramp = ramp_up(bench, s)
    profiler = cProfile.Profile() if args.profile else None
    stats = summarize(measure(bench, s, profiler))
    print_report(stats, s, ramp)
    load_after = os.getloadavg()
    print("load average (1/5/15 min) before " + "/".join(f"{x:.1f}" for x in load_before)
          + ", after " + "/".join(f"{x:.1f}" for x in load_after))  # fmt: skip
    if profiler is not None:
        print_profile(profiler, args.profile_top)
    if args.json:
        result = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "numpy": np.__version__, "platform": platform.platform(),
            "setup": dataclasses.asdict(s), "ramp_rounds": ramp, "target_us": TARGET_US,
            "stats_us": {c: {p: dataclasses.asdict(v) for p, v in by.items()} for c, by in stats.items()},
            "target_met": {c: target_met(by["plan+build"]) for c, by in stats.items()},
            "loadavg_1_5_15": {"before": load_before, "after": load_after},
        }  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
