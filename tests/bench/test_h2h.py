"""The head to head's workloads (``bench/h2h.py``): seeded per run, the new agentic and many-session
chat rows shaped as stated, the summary with and without llama.cpp rows; and the script's ``--help``
and ``--dry-run`` (no llama.cpp needed)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from radixflow_jax.bench.agentic import WordIds
from radixflow_jax.bench.h2h import AGENTIC_SYSTEM_TOKENS, AGENTIC_TURNS, describe, h2h_workload, summary_table

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "vs_llamacpp.py"


def _make(kind: str, run: int, requests: int = 48):
    return h2h_workload(kind, run, requests=requests, rate=2.0, output_tokens=16, vocab=512, encode=WordIds(512))


def test_workloads_are_seeded_per_run_and_shaped() -> None:
    for kind in ("race", "multiturn", "chat-many", "agentic"):
        assert _make(kind, 0) == _make(kind, 0) and _make(kind, 0) != _make(kind, 1)
        assert all(r.max_tokens == 16 for r in _make(kind, 0))
    agentic = _make("agentic", 0, requests=64)
    firsts = [r.prompt for r in agentic if r.turn == 0]
    assert len(firsts) == 64 // AGENTIC_TURNS
    assert all(p[:AGENTIC_SYSTEM_TOKENS] == firsts[0][:AGENTIC_SYSTEM_TOKENS] for p in firsts)
    shared = int(describe("agentic", agentic).split("first turns share ")[1].split()[0])
    assert AGENTIC_SYSTEM_TOKENS <= shared < len(firsts[0])  # the system prompt, not the tasks
    # many sessions: the same turns as multiturn, sessions arriving 4x as fast
    many, chat = _make("chat-many", 0, requests=128), _make("multiturn", 0, requests=128)
    last = lambda reqs: max(r.arrival_s for r in reqs if r.turn == 0)  # noqa: E731
    assert len({r.group for r in many}) == 32 and last(many) < last(chat) / 2
    with pytest.raises(ValueError, match="needs the served file's tokenizer"):
        h2h_workload("agentic", 0, requests=8, rate=2.0, output_tokens=4, vocab=512)
    with pytest.raises(ValueError, match="unknown head-to-head workload"):
        h2h_workload("chat", 0, requests=8, rate=2.0, output_tokens=4, vocab=512)


def _row(server: str, run: int, tok: float, mean: float, context: float = 0.0) -> dict:
    stats = {"mean": mean, "median": mean, "p99": 2 * mean}
    slots = 40.0 + 10 * run  # round time 2 ms + 0.1 ms per slot (+ 1e-4 ms per query-key pair)
    br = {"rounds": 10.0, "round_ms": 2.0 + 0.1 * slots + 1e-4 * context, "tokens_per_round": slots - 10.0,
          "padding_per_round": 10.0, "context_per_round": context}  # fmt: skip
    return {"model": "m", "workload": "agentic", "run": run, "server": server, "output_throughput": tok,
            "e2el_ms": stats, "ttft_ms": stats, "cache_hit_rate": 0.9, "breakdown": br, "failed": 0}  # fmt: skip


def test_summary_with_and_without_llamacpp() -> None:
    rows = [_row("ours", 0, 20.0, 100.0), _row("llama.cpp", 0, 10.0, 200.0), _row("ours", 1, 30.0, 100.0),
            _row("llama.cpp", 1, 10.0, 100.0), _row("ours", 2, 25.0, 100.0), _row("llama.cpp", 2, 10.0, 100.0)]  # fmt: skip
    table = summary_table(rows)
    assert "2.50x (2.00-3.00), 1.00x (0.50-1.00)" in table
    assert "2.00 ms per round + 100.0 us per token slot (no per-context term" in table
    incomplete = {"model": "m", "workload": "agentic", "run": 3, "server": "llama.cpp", "load": 0.0,
                  "incomplete": "1/2 completed"}  # fmt: skip
    assert summary_table(rows + [_row("ours", 3, 99.0, 1.0), incomplete]) == table  # an incomplete run is left out
    ours = summary_table([r for r in rows if r["server"] == "ours"][:2])
    assert "llama.cpp" not in ours.splitlines()[1] and "x (" not in ours and "too few" in ours
    # with the context the rounds read (a counter the server may export), a third term is fitted
    ctx = [_row("ours", i, 20.0, 100.0, context=c) for i, c in enumerate((1e3, 5e4, 2e4, 8e4))]
    assert "+ 100.00 ns per query-key pair read" in summary_table(ctx)


def test_script_help_and_dry_run() -> None:
    env = dict(os.environ, PYTHONPATH=str(SCRIPT.parents[1]))
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, env=env, check=True)
    assert "--ours-only" in out.stdout and "agentic" in out.stdout
    out = subprocess.run([sys.executable, str(SCRIPT), "--what", "h2h", "--dry-run", "--models", "tiny-qwen3.5",
                          "--workloads", "agentic,chat-many"], capture_output=True, text=True, env=env, check=True)  # fmt: skip
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2 and "agentic: 64 requests in 16 sessions" in lines[0] and "chat-many: 128" in lines[1]
