"""Session arrivals, utilization, --repeats, --sweep-rates and the simulator's bucket sets / round cost."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from radixflow_jax import cli
from radixflow_jax.bench.driver import RunResult
from radixflow_jax.bench.repeats import summarize_repeats
from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.sim.executor import RooflineCost
from radixflow_jax.sim.specs import get_device_spec, get_model_spec
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan


def test_session_arrivals() -> None:
    reqs = generate(WorkloadSpec("race", num_requests=400, arrival="sessions", rate=5.0, seed=3))
    starts: dict[int, set[float]] = {}
    for r in reqs:
        starts.setdefault(r.group, set()).add(r.arrival_s)
    assert all(len(t) == 1 for t in starts.values())  # window 0: an article's questions together
    firsts = sorted(min(t) for t in starts.values())
    gaps = np.diff(firsts)
    assert firsts[0] == 0.0 and 0.12 <= gaps.mean() <= 0.3  # Poisson articles at 5/s
    spread = generate(WorkloadSpec("race", num_requests=400, arrival="sessions", rate=5.0, seed=3, session_window=2.0))
    by_group: dict[int, list[float]] = {}
    for r in spread:
        by_group.setdefault(r.group, []).append(r.arrival_s)
    widths = [max(v) - min(v) for v in by_group.values() if len(v) > 1]
    assert 0 < max(widths) <= 2.0 and np.mean(widths) > 0.3
    assert [r.arrival_s for r in spread] == sorted(r.arrival_s for r in spread)
    with pytest.raises(ValueError, match="session_window must be >= 0"):
        WorkloadSpec(session_window=-1.0)


def test_simulator_pads_to_the_runners_variants() -> None:
    """One source of step shapes: a simulated round runs in the variant the model executor selects
    for the engine's bucket mode (fine by default), and the simulated engine is wired with it."""
    from radixflow_jax.engine.config import EngineConfig
    from radixflow_jax.runner.shapes import ShapeConfig
    from radixflow_jax.sim.engines import build_sim_engine
    from radixflow_jax.sim.executor import SimExecutor, VirtualClock

    spec, dev = get_model_spec("qwen3.5-9b"), get_device_spec("h200")
    plan = _plan([(0, 2100)] + [(0, 10)] * 9)
    for mode in ("fine", "pow2", "fixed"):
        shapes = ShapeConfig(
            max_num_batched_tokens=8192, max_num_seqs=64, max_pages_per_row=512, grid=64, mode=mode
        )
        result = SimExecutor(RooflineCost(spec, dev), VirtualClock(), shapes).execute(plan, {})
        v = shapes.select(plan.num_tokens, len(plan.rows), num_decode=0)
        assert (result.token_slots, result.row_slots) == (v.num_tokens, v.num_rows)
    engine = build_sim_engine(spec, dev, EngineConfig.from_options(max_num_seqs=64, max_num_batched_tokens=8192))
    assert engine.executor.shapes.mode == "fine" == EngineConfig().bucket_mode


def test_simulated_noise_is_seeded_and_sized() -> None:
    from radixflow_jax.sim.executor import SimExecutor, VirtualClock

    spec, dev = get_model_spec("qwen3.5-9b"), get_device_spec("h200")
    plan = _plan([(0, 512)])
    exact = SimExecutor(RooflineCost(spec, dev), VirtualClock()).execute(plan, {}).step_s

    def times(seed: int) -> list[float]:
        ex = SimExecutor(RooflineCost(spec, dev), VirtualClock(), noise=0.1, seed=seed)
        return [ex.execute(plan, {}).step_s for _ in range(400)]

    a, b = times(1), times(1)
    assert a == b and times(2) != a  # seeded
    spread = np.std(np.log(np.array(a) / exact))
    assert 0.08 < spread < 0.12  # the stated relative size
    with pytest.raises(ValueError, match="noise must be >= 0"):
        SimExecutor(RooflineCost(spec, dev), VirtualClock(), noise=-0.1)


def _plan(spans: list[tuple[int, int]]) -> RoundPlan:
    rows = tuple(
        RowPlan(
            request_id=i,
            tokens=tuple(range(n)),
            start=start,
            pages=(),
            slot=i + 1,
            copy_from=None,
            emits=(),
            sample=True,
        )
        for i, (start, n) in enumerate(spans)
    )
    return RoundPlan(rows, sum(1 for _, n in spans if n == 1), RoundStats())


def test_roofline_charges_slots_not_tokens() -> None:
    spec, dev = get_model_spec("qwen3.5-9b"), get_device_spec("h200")
    cost = RooflineCost(spec, dev)
    one = _plan([(0, 2100)])
    # padding costs: the same real work in a larger variant takes longer
    assert cost.round_time(one, 4096, 1) > cost.round_time(one, 2176, 1) * 1.5
    # a filled bubble is (nearly) free: another short prefill in the same variant adds only its
    # attention and state traffic, not dense work
    two = _plan([(0, 2100), (0, 64)])
    assert cost.round_time(two, 4096, 2) - cost.round_time(one, 4096, 1) < 0.01 * cost.round_time(one, 4096, 1)
    # the per-round cost is the device spec's unless overridden
    assert dev.round_overhead_s > 0 and dev.overhead_source
    small = _plan([(0, 1)])
    fast, slow = RooflineCost(spec, dev, overhead_s=0.0), RooflineCost(spec, dev, overhead_s=0.01)
    assert slow.round_time(small, 1, 1) - fast.round_time(small, 1, 1) == pytest.approx(0.01)


def test_repeats_medians_and_spread() -> None:
    base = dict(policy="native", p50_latency_s=0.0, p99_latency_s=0.0, mean_ttft_s=0.0, reuse=0.5,
                bubble_tokens=0, padding_tokens=0, completed=3, num_requests=3, throughput_tok_s=1.0,
                makespan_s=1.0, mean_tpot_s=0.0, consumers_blocked=0, consumers_waiting=0)  # fmt: skip
    runs = [RunResult(rounds=r, mean_latency_s=lat, **base) for r, lat in ((10, 1.0), (12, 3.0), (11, 2.5))]
    rep = summarize_repeats(runs)
    assert rep.median.rounds == 11 and rep.median.mean_latency_s == 2.5
    assert rep.spread["mean_latency_s"] == (1.0, 3.0) and len(rep.runs) == 3


def test_cli_repeats_utilization_and_sweep(tmp_path, capsys) -> None:
    out = str(tmp_path / "r.json")
    common = ["bench", "--model", "qwen3.5-4b", "--num-requests", "120", "--arrival", "sessions", "--no-progress"]
    assert cli.main([*common, "--rate", "20", "--repeats", "2", "--json", out]) == 0
    text = capsys.readouterr().out
    assert "util" in text and "2 repeats" in text
    data = json.load(open(out))
    assert [r["policy"] for r in data["runs"]] == ["native", "radixflow", "pair"]  # the default policies
    for run in data["runs"]:
        assert 0 < run["utilization"] <= 1 and run["spread"]["rounds"][0] <= run["rounds"]
        reps = data["repeats"][run["policy"]]
        assert len(reps) == 2 and reps[0]["rounds"] == reps[1]["rounds"] == run["rounds"]  # the sim is deterministic
    assert data["config"]["round_overhead_s"] > 0 and data["config"]["buckets"] == "fine"
    sweep_json, plot = str(tmp_path / "s.json"), str(tmp_path / "s.png")
    assert cli.main([*common, "--sweep-rates", "5,40", "--json", sweep_json, "--plot", plot]) == 0
    table = capsys.readouterr().out
    assert "rate" in table and "radixflow" in table
    points = json.load(open(sweep_json))["sweep"]
    assert [p["rate"] for p in points] == [5.0, 40.0]
    u = [p["runs"][0]["utilization"] for p in points]
    assert u[0] < u[1]  # more offered load keeps the executor busier
    assert os.path.getsize(plot) > 10_000


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sweep-rates", "1,x"], "comma-separated numbers"),
        (["--sweep-rates", "1,-1"], "positive rates"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--session-window", "-1"], "--session-window must be >= 0"),
        (["--round-overhead-ms", "-1"], "--round-overhead-ms must be >= 0"),
    ],
)
def test_cli_bad_new_arguments(args, message, capsys) -> None:
    assert cli.main(["bench", "--model", "qwen3.5-4b", "--no-progress", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--sim-noise", "0.1"], ["--round-overhead-ms", "1"]])
def test_cli_sim_only_options_refused_on_the_model_executor(flag, capsys) -> None:
    assert cli.main(["bench", "--model", "tiny-qwen3.5", *flag, "--no-progress"]) == 2
    assert "simulated executor only" in capsys.readouterr().err
