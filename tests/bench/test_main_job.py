"""`radixflow bench` with no arguments: untimed warm-up runs, interleaved timed repeats, each policy's
change as the median of per-repeat changes with its spread, compiles counted per timed run; and the
round-cost solver loaded when an engine is built, not on the serving clock of its first fit."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys

import pytest

from radixflow_jax.bench import cli as bench_cli
from radixflow_jax.bench.driver import RunResult
from radixflow_jax.bench.repeats import Change, paired_changes, run_repeated

_BASE = dict(rounds=10, p50_latency_s=0.0, p99_latency_s=1.0, mean_ttft_s=1.0, reuse=0.5, bubble_tokens=0,
             padding_tokens=0, completed=3, num_requests=3, throughput_tok_s=1.0, makespan_s=1.0, mean_tpot_s=0.0,
             consumers_blocked=0, consumers_waiting=0)  # fmt: skip


def _result(policy: str, latency: float) -> RunResult:
    return RunResult(policy=policy, mean_latency_s=latency, **_BASE)


def test_warmup_then_interleaved_repeats_and_paired_changes() -> None:
    latency = {"native": iter([9.0, 1.0, 2.0, 4.0]), "pair": iter([9.0, 0.9, 1.9, 4.2])}
    calls: list[str] = []

    def run_one(policy: str):
        calls.append(policy)
        return _result(policy, next(latency[policy])), []

    reps, _ = run_repeated(("native", "pair"), 3, run_one, warmup=1)
    assert calls == ["native", "pair"] * 4  # one untimed pass, then the policies interleaved per repeat
    native, pair = reps
    assert [r.mean_latency_s for r in native.runs] == [1.0, 2.0, 4.0]  # the warm-up's 9.0 is dropped
    change = paired_changes(native, pair)["mean_latency_s"]
    assert change.median == pytest.approx(-0.05) and change.lo == pytest.approx(-0.1)
    assert change.hi == pytest.approx(0.05) and not change.sign_stable
    assert change.q1 <= change.median <= change.q3
    assert Change.of([-0.2, -0.1]).sign_stable and Change.of([0.3]) == Change(0.3, 0.3, 0.3, 0.3, 0.3)
    table = bench_cli.format_table(reps)
    assert "pair vs native" in table and "-5.0% [-10.0,+5.0]" in table
    spreads = bench_cli.format_spreads(reps)
    assert "step programs compiled in timed runs 0" in spreads and "NOT the same in every repeat" in spreads
    with pytest.raises(ValueError, match="warmup must be >= 0"):
        run_repeated(("native",), 1, run_one, warmup=-1)


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_cli.add_arguments(p)
    return p.parse_args(list(argv))


def test_defaults_per_executor() -> None:
    model = _args()
    bench_cli._checked(model)
    assert (model.repeats, model.warmup_runs) == (bench_cli.MODEL_REPEATS, 1) and bench_cli.MODEL_REPEATS >= 3
    sim = _args("--model", "qwen3.5-4b")
    bench_cli._checked(sim)
    assert (sim.repeats, sim.warmup_runs) == (1, 0)  # deterministic: one run
    with pytest.raises(ValueError, match="--warmup-runs must be >= 0"):
        bench_cli._checked(_args("--warmup-runs", "-1"))


def test_compiles_counted_per_run_and_kept_out_by_the_warmup() -> None:
    """Model executor: a run that compiles a step program says so (``compiles``, and the clock's
    pause); after an untimed warm-up pass no timed run compiles."""
    from radixflow_jax.bench.run import BenchConfig, model_runner
    from radixflow_jax.bench.workloads import WorkloadSpec, generate
    from radixflow_jax.engine.config import EngineConfig
    from radixflow_jax.models.api import load

    reqs = generate(WorkloadSpec("race", num_requests=4, seed=0, article_len=40, question_len=8, arrival="all"))
    ec = EngineConfig.from_options(max_num_seqs=4, max_num_batched_tokens=128, page_size=16, max_model_len=1024,
                                   bucket_mode="fixed")  # fmt: skip
    cfg = BenchConfig(policies=("native", "pair"), engine=ec)
    runner = model_runner(load("tiny-qwen3.5"), reqs, cfg)
    cold, _ = run_repeated(cfg.policies, 2, runner)
    first, second = cold[0].runs
    assert first.compiles >= 1 and first.paused_s > 0 and second.compiles == 0
    warm, _ = run_repeated(cfg.policies, 1, runner, warmup=1)
    assert all(r.compiles == 0 and r.paused_s == 0.0 and r.completed == 4 for rep in warm for r in rep.runs)
    assert dataclasses.asdict(second)["compiles"] == 0


def test_round_cost_solver_loads_when_the_estimator_is_built() -> None:
    """The first fit's ``scipy.optimize`` import (about 0.5 s) fell on pair's serving clock: it
    loads when the estimator is built now."""
    code = (
        "import sys\n"
        "from radixflow_jax.engine.roundcost import FittedRoundCost\n"
        "from radixflow_jax.runner.shapes import ShapeConfig\n"
        "assert 'scipy.optimize' not in sys.modules\n"
        "FittedRoundCost(ShapeConfig(max_num_batched_tokens=64, max_num_seqs=4, max_pages_per_row=4, grid=64), [])\n"
        "assert 'scipy.optimize' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
