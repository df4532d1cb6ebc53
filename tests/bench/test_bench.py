"""Workload statistics, the JSONL format, the bench CLI's JSON schema and its argument errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from radixflow_jax import cli
from radixflow_jax.bench.jsonl import WorkloadFileError, read_jsonl, write_jsonl
from radixflow_jax.bench.workloads import WorkloadSpec, generate


def _groups(reqs):
    out: dict[int, list] = {}
    for r in reqs:
        out.setdefault(r.group, []).append(r)
    return out


def _shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_race_statistics() -> None:
    reqs = generate(WorkloadSpec("race", num_requests=400, seed=1))
    assert len(reqs) == 400 and reqs == generate(WorkloadSpec("race", num_requests=400, seed=1))
    groups = _groups(reqs)
    sizes = [len(g) for g in list(groups.values())[:-1]]  # the last article may be cut by num_requests
    assert set(sizes) <= {3, 4, 5} and 3.5 <= np.mean(sizes) <= 4.5
    article = [_shared(g[0].prompt, g[1].prompt) for g in groups.values() if len(g) > 1]
    assert 380 <= np.mean(article) - 12 <= 460  # ~420-token passages after a 12-token header
    question = [len(r.prompt) - _shared(r.prompt, groups[r.group][0].prompt if r is not groups[r.group][0]
                else groups[r.group][1].prompt) for r in reqs if len(groups[r.group]) > 1]  # fmt: skip
    assert 38 <= np.mean(question) <= 52
    assert all(r.max_tokens == 1 for r in reqs)
    arrivals = [r.arrival_s for r in reqs]
    assert arrivals == sorted(arrivals)
    assert all(len({r.arrival_s for r in g}) == 1 for g in groups.values())  # per-article bursts


def test_quality_gsp_multiturn_statistics() -> None:
    q = generate(WorkloadSpec("quality", num_requests=120, seed=2))
    sizes = [len(g) for g in list(_groups(q).values())[:-1]]
    assert all(12 <= s <= 20 for s in sizes)
    assert 6300 <= np.mean([len(r.prompt) for r in q]) <= 7300
    g = generate(WorkloadSpec("gsp", num_requests=40, seed=0))
    assert all(len(r.prompt) == 2048 + 128 and r.max_tokens == 256 for r in g)
    assert [len(v) for v in _groups(g).values()] == [16, 16, 8]
    m = generate(WorkloadSpec("multiturn", num_requests=8, seed=0, arrival="all"))
    assert sorted((r.group, r.turn) for r in m) == [(0, t) for t in range(4)] + [(1, t) for t in range(4)]
    p = generate(WorkloadSpec("race", num_requests=50, arrival="poisson", rate=10.0, seed=0))
    gaps = np.diff([r.arrival_s for r in p])
    assert (gaps >= 0).all() and 0.05 <= gaps.mean() <= 0.2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="nope"), "unknown workload 'nope'"),
        (dict(arrival="later"), "unknown arrival"),
        (dict(rate=-1.0), "rate must be > 0"),
        (dict(num_requests=0), "num_requests must be >= 1"),
    ],
)
def test_bad_workload_specs(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadSpec(**kwargs)


def test_jsonl_round_trip_and_errors(tmp_path) -> None:
    reqs = generate(WorkloadSpec("race", num_requests=10, seed=4))
    path = str(tmp_path / "w.jsonl")
    write_jsonl(path, reqs)
    assert read_jsonl(path) == reqs
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_token_ids": [1, 2], "max_tokens": 2}\n\n{"prompt_token_ids": [1, 2], "max_tokens": 0}\n')
    with pytest.raises(WorkloadFileError, match=r"bad.jsonl:3: max_tokens must be an integer >= 1"):
        read_jsonl(str(bad))
    bad.write_text('{"prompt_token_ids": [1]}\nnot json\n')
    with pytest.raises(WorkloadFileError, match=r"bad.jsonl:2: not valid JSON"):
        read_jsonl(str(bad))
    bad.write_text('{"prompt": "hello"}\n')
    with pytest.raises(WorkloadFileError, match="no tokenizer"):
        read_jsonl(str(bad))
    assert read_jsonl(str(bad), encode=lambda s: [len(s)])[0].prompt == (5,)


def test_cli_json_schema_sim(tmp_path, capsys) -> None:
    out = str(tmp_path / "r.json")
    plot = str(tmp_path / "r.png")
    rc = cli.main(["bench", "--model", "qwen3.5-4b", "--num-requests", "200", "--rate", "400", "--json", out,
                   "--plot", plot, "--no-progress"])  # fmt: skip
    assert rc == 0
    table = capsys.readouterr().out
    assert "radixflow vs native" in table and "pair vs native" in table
    data = json.load(open(out))
    assert data["config"]["executor"] == "sim" and data["config"]["model"] == "qwen3.5-4b"
    keys = {"policy", "rounds", "mean_latency_s", "p50_latency_s", "p99_latency_s", "mean_ttft_s", "reuse",
            "bubble_tokens", "padding_tokens", "completed", "num_requests", "throughput_tok_s"}  # fmt: skip
    assert [r["policy"] for r in data["runs"]] == ["native", "radixflow", "pair"]  # the default policies
    for run in data["runs"]:
        assert keys <= set(run) and run["completed"] == run["num_requests"] == 200
    assert data["runs"][1]["rounds"] < data["runs"][0]["rounds"]
    for run in data["runs"]:  # per-round metrics are there too
        recs = data["round_records"][run["policy"]]
        assert len(recs) == run["rounds"] and sum(r["bubble_tokens"] for r in recs) == run["bubble_tokens"]
    assert abs(data["runs"][1]["reuse"] - data["runs"][0]["reuse"]) <= 0.01
    import os

    assert os.path.getsize(plot) > 10_000


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workload", "nope"], "unknown workload 'nope'"),
        (["--model", "no-such-model"], "neither a directory nor a preset"),
        (["--model", "qwen3.5-4b", "--rate", "-2"], "--rate must be > 0"),
        (["--model", "qwen3.5-4b", "--policies", "native,fast"], "unknown policy 'fast'"),
        (["--model", "qwen3.5-4b", "--device", "abacus"], "unknown device 'abacus'"),
        (["--model", "tiny-qwen3.5", "--executor", "sim"], "needs a model spec"),
    ],
)
def test_cli_bad_arguments(args, message, capsys) -> None:
    assert cli.main(["bench", "--no-progress", *args]) == 2
    assert message in capsys.readouterr().err


def test_cli_malformed_jsonl_names_the_line(tmp_path, capsys) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt_token_ids": [1, 2, 3]}\n{"prompt_token_ids": "x"}\n')
    assert cli.main(["bench", "--model", "qwen3.5-4b", "--workload", str(path), "--no-progress"]) == 2
    assert "w.jsonl:2: prompt_token_ids must be" in capsys.readouterr().err


def test_cli_host_tier_on_the_simulator(tmp_path, capsys) -> None:
    out = str(tmp_path / "h.json")
    args = ["bench", "--model", "qwen3.5-4b", "--workload", "multiturn", "--num-requests", "96", "--turns", "3",
            "--arrival", "all", "--think-time", "0.5", "--max-num-seqs", "8", "--num-state-slots", "12",
            "--policies", "radixflow", "--no-progress", "--json", out]  # fmt: skip
    assert cli.main([*args, "--host-cache-gb", "4", "--host-kv-fraction", "0"]) == 0  # all of it for checkpoints
    tiered = json.load(open(out))
    assert cli.main(args) == 0  # the simulator has no host tier unless asked
    plain = json.load(open(out))
    capsys.readouterr()
    assert tiered["config"]["host_cache_gb"] == 4.0 and tiered["config"]["think_time"] == 0.5
    assert tiered["config"]["host_kv_fraction"] == 0.0
    assert tiered["config"]["host_link_bytes_s"] == 64e9
    on, off = tiered["runs"][0], plain["runs"][0]
    assert on["host_restores"] > 0 and off["host_restores"] == off["host_spills"] == 0
    assert on["reuse"] > off["reuse"]
    assert cli.main(["bench", "--model", "qwen3.5-4b", "--think-time", "-1", "--no-progress"]) == 2
    assert "--think-time must be >= 0" in capsys.readouterr().err
