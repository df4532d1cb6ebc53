"""The workloads of ``benchmarks/vs_llamacpp.py``'s head to head, in one place so the script and its
dry mode build the same requests.

Kinds (:data:`H2H_WORKLOADS`):
  * ``race``: RACE-like article bursts (``rate`` articles per second);
  * ``multiturn``: chat sessions of 4 turns arriving as a Poisson process at ``rate`` per second;
  * ``chat-many``: many concurrent chat sessions: the same turns, sessions arriving at
    ``MANY_RATE_FACTOR x rate`` per second, so several times more sessions are open at once than
    either server has slots;
  * ``agentic``: agent sessions (``bench/agentic.py``): one system prompt of
    ``AGENTIC_SYSTEM_TOKENS`` tokens of tool descriptions shared by every session, a task, then
    ``AGENTIC_TURNS - 1`` turns each appending a tool result of ``AGENTIC_RESULT_TOKENS`` tokens,
    tokenised by the served file's own tokenizer (``encode``);
  * ``code-edit``: ``requests`` standard-library functions to repeat or rename (``bench/codeedit.py``),
    one ChatML turn each, all at once: the workload for speculative decoding (run both servers with
    their n-gram drafts: the script's ``--ours-args`` / ``--llama-args``).

:func:`summary_table` and :func:`round_line` summarise the script's rows (one per timed run and
server: ``model``, ``workload``, ``run``, ``server``, the HTTP driver's summary and ``breakdown``).

Fairness (the script's rules, which these workloads keep): both servers get the same requests
(the seed moves with the run, not with the server), the same output lengths (``output_tokens``,
EOS ignored), greedy sampling; each server's real answers are appended to its own conversations by
the HTTP driver (``bench/http.run_requests``).
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

import numpy as np

from radixflow_jax.bench import codeedit
from radixflow_jax.bench.agentic import Encode
from radixflow_jax.bench.workloads import BenchRequest, WorkloadSpec, generate

H2H_WORKLOADS = ("race", "multiturn", "chat-many", "agentic", "code-edit")
DEFAULT_WORKLOADS = H2H_WORKLOADS[:4]  # code-edit is asked for by name (speculative decoding)
MANY_RATE_FACTOR = 4.0
AGENTIC_TURNS = 4
AGENTIC_SYSTEM_TOKENS = 1200
AGENTIC_RESULT_TOKENS = 96
_SEED_BASE = {"race": 1000, "multiturn": 2000, "chat-many": 3000, "agentic": 4000, "code-edit": 5000}


def h2h_workload(
    kind: str, run: int, *, requests: int, rate: float, output_tokens: int, vocab: int, encode: Encode | None = None
) -> list[BenchRequest]:
    """The requests of run ``run`` (``-1``: the untimed warm-up) of workload ``kind``; ids drawn
    from ``[3, vocab)`` except ``agentic``'s, which are ``encode``'s (required there)."""
    if kind not in _SEED_BASE:
        raise ValueError(f"unknown head-to-head workload {kind!r}; workloads: {', '.join(H2H_WORKLOADS)}")
    seed = _SEED_BASE[kind] + run
    if kind == "race":  # new articles every run: the seed moves with the run
        spec = WorkloadSpec("race", requests, seed=seed, arrival="burst", rate=rate, vocab=vocab,
                            max_tokens=output_tokens)  # fmt: skip
        return generate(spec)
    if kind in ("multiturn", "chat-many"):
        session_rate = rate * (MANY_RATE_FACTOR if kind == "chat-many" else 1.0)
        spec = WorkloadSpec("multiturn", requests, seed=seed, arrival="sessions", rate=session_rate, vocab=vocab,
                            max_tokens=output_tokens)  # fmt: skip
        return generate(spec)
    if encode is None:
        raise ValueError(f"the {kind} workload is text: it needs the served file's tokenizer (encode)")
    if kind == "code-edit":  # the same functions every run (a run of prompts cached by the warm-up)
        texts = codeedit.requests_text(requests)
        return [BenchRequest(prompt=tuple(encode(codeedit.chatml(t))), max_tokens=output_tokens, group=i)
                for i, t in enumerate(texts)]  # fmt: skip
    spec = WorkloadSpec("agentic", requests, seed=seed, arrival="sessions", rate=rate, vocab=vocab,
                        max_tokens=output_tokens, turns=AGENTIC_TURNS, article_len=AGENTIC_SYSTEM_TOKENS,
                        question_len=AGENTIC_RESULT_TOKENS)  # fmt: skip
    return generate(spec, encode)


def describe(kind: str, reqs: list[BenchRequest]) -> str:
    """One line on a workload's shape: sessions, turns, prompt tokens sent at least (histories
    without answers), the longest common prefix of the first turns, output tokens."""
    firsts = [r.prompt for r in reqs if r.turn == 0]
    shared = len(firsts[0]) if firsts else 0
    for p in firsts[1:]:
        shared = next((i for i, (a, b) in enumerate(zip(firsts[0][:shared], p)) if a != b), min(shared, len(p)))
    sessions = len({r.group for r in reqs})
    turns = max(r.turn for r in reqs) + 1
    prompt = sum(len(r.prompt) for r in reqs)
    return (f"{kind}: {len(reqs)} requests in {sessions} sessions/articles, up to {turns} turns, {prompt} new prompt "
            f"tokens, first turns share {shared} tokens, {sum(r.max_tokens for r in reqs)} output tokens")  # fmt: skip


SERVERS = ("ours", "llama.cpp")


def our_metrics(url: str) -> dict[str, float]:
    """The counters of ``/metrics`` that say where our time went (summed over labels; a counter the
    server does not export reads 0: ``attention_pairs_total``, the query-key pairs its rounds read,
    is not exported yet)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {"radixflow:rounds_total", "radixflow:round_tokens_total", "radixflow:padding_tokens_total",
              "radixflow:round_duration_seconds_sum", "radixflow:prefix_cache_hits_total",
              "radixflow:attention_pairs_total"}  # fmt: skip
    out = dict.fromkeys(wanted, 0.0)
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for s in fam.samples:
            if s.name in wanted:
                out[s.name] += s.value
    return out


def breakdown(server: str, results: list[Any], before: dict[str, float] | None, after: dict[str, float] | None,
              wall: float) -> dict[str, float]:  # fmt: skip
    """Where a timed run's time went: ours from the ``/metrics`` counters ``before`` and ``after``
    it (rounds, mean round time, real and padding tokens per round, busy share), llama-server's
    from its per-request ``timings`` (prompt tokens computed, ms per prompt and generated token)."""
    if server == "ours":
        assert before is not None and after is not None
        d = {k.split(":")[1]: after[k] - before[k] for k in after}
        rounds = max(d["rounds_total"], 1.0)
        return {"rounds": d["rounds_total"], "round_ms": 1000 * d["round_duration_seconds_sum"] / rounds,
                "tokens_per_round": d["round_tokens_total"] / rounds,
                "padding_per_round": d["padding_tokens_total"] / rounds,
                "context_per_round": d["attention_pairs_total"] / rounds,
                "busy_share": d["round_duration_seconds_sum"] / wall,
                "computed_tok_per_s": d["round_tokens_total"] / max(d["round_duration_seconds_sum"], 1e-9)}  # fmt: skip
    t = [r.timings for r in results if r.timings]
    prompt_n = sum(x.get("prompt_n", 0) for x in t)
    prompt_ms = sum(x.get("prompt_ms", 0.0) for x in t)
    gen_n = sum(x.get("predicted_n", 0) for x in t)
    gen_ms = sum(x.get("predicted_ms", 0.0) for x in t)
    return {"prompt_tokens_computed": prompt_n, "ms_per_prompt_token": prompt_ms / max(prompt_n, 1),
            "ms_per_generated_token": gen_ms / max(gen_n, 1), "slot_busy_share": (prompt_ms + gen_ms) / 1000 / wall}  # fmt: skip


class IncompleteRun(RuntimeError):
    """A server did not complete every request of a run with exactly its output tokens."""


def timed_run(server: str, url: str, reqs: list[Any]) -> dict[str, Any]:
    """One timed run of ``reqs`` against ``url`` (the HTTP driver), its summary and breakdown;
    raises :class:`IncompleteRun` unless every request completed with exactly its ``max_tokens``
    output tokens."""
    from radixflow_jax.bench.http import run_requests, summarize

    before = our_metrics(url) if server == "ours" else None
    results, wall = asyncio.run(run_requests(url, reqs))
    after = our_metrics(url) if server == "ours" else None
    s = summarize(results, wall)
    wanted = sum(r.max_tokens for r in reqs)
    if s["completed"] != len(reqs) or s["output_tokens"] != wanted:
        errors = [r.error for r in results if r.error][:3]
        raise IncompleteRun(f"{server}: {s['completed']}/{len(reqs)} completed, {s['output_tokens']} of {wanted} "
                           f"output tokens: {errors}")  # fmt: skip
    return {**s, "breakdown": breakdown(server, results, before, after, wall)}


def _medians(sel: list[dict[str, Any]]) -> dict[str, float]:
    return {"tok": statistics.median(r["output_throughput"] for r in sel),
            "mean": statistics.median(r["e2el_ms"]["mean"] for r in sel),
            "p99": statistics.median(r["e2el_ms"]["p99"] for r in sel),
            "ttft": statistics.median(r["ttft_ms"]["mean"] for r in sel),
            "cached": statistics.median(r["cache_hit_rate"] for r in sel)}  # fmt: skip


def summary_table(rows: list[dict[str, Any]]) -> str:
    """Medians over the repeats per (model, workload, server), and ours / llama.cpp ratios (the
    median of the per-run ratios and their range; none where only ours ran). A run either server
    did not complete (a row with ``incomplete``, its error) is left out for both. (``failed`` is
    a count every run's summary has, ``bench/http.summarize``.)"""
    out = [f"{'model':14s} {'workload':9s} {'server':9s} {'out tok/s':>10s} {'mean ms':>9s} {'p99 ms':>9s} "
           f"{'TTFT ms':>9s} {'cached':>7s}  ratio (ours/llama.cpp: tok/s, mean latency)"]  # fmt: skip
    incomplete = {(r["model"], r["workload"], r["run"]) for r in rows if r.get("incomplete")}
    rows = [r for r in rows if (r["model"], r["workload"], r["run"]) not in incomplete]
    for model, kind in sorted({(r["model"], r["workload"]) for r in rows}):
        by_run: dict[str, dict[int, dict[str, Any]]] = {w: {} for w in SERVERS}
        for r in rows:
            if (r["model"], r["workload"]) == (model, kind):
                by_run[r["server"]][r["run"]] = r
        runs = sorted(set(by_run["ours"]) & set(by_run["llama.cpp"]))
        tok = [by_run["ours"][i]["output_throughput"] / by_run["llama.cpp"][i]["output_throughput"] for i in runs]
        lat = [by_run["ours"][i]["e2el_ms"]["mean"] / by_run["llama.cpp"][i]["e2el_ms"]["mean"] for i in runs]
        for w in SERVERS:
            if not by_run[w]:
                continue
            m = _medians(list(by_run[w].values()))
            ratio = (f"{statistics.median(tok):.2f}x ({min(tok):.2f}-{max(tok):.2f}), "
                     f"{statistics.median(lat):.2f}x ({min(lat):.2f}-{max(lat):.2f})") if w == "ours" and runs else ""  # fmt: skip
            out.append(f"{model:14s} {kind:9s} {w:9s} {m['tok']:10.1f} {m['mean']:9.0f} {m['p99']:9.0f} "
                       f"{m['ttft']:9.0f} {m['cached']:7.1%}  {ratio}")  # fmt: skip
    out.append(round_line(rows))
    return "\n".join(out)


def round_line(rows: list[dict[str, Any]]) -> str:
    """Our time split into a per-round fixed cost, a per-token-slot cost and, when the server
    exports the query-key pairs its rounds read, a per-pair cost: a non-negative least-squares line
    ``round time = a * rounds + b * token slots (+ c * pairs)`` over every timed run of ours of each
    model (the workloads differ in tokens and context per round, which separates the terms)."""
    from scipy.optimize import nnls

    lines = []
    for model in sorted({r["model"] for r in rows}):
        b = [r["breakdown"] for r in rows if r["model"] == model and r["server"] == "ours"]
        if len(b) < 3:
            lines.append(f"{model}: {len(b)} timed runs of ours: too few for a per-round line (3 or more)")
            continue
        context = all(x.get("context_per_round", 0.0) > 0 for x in b)
        cols = [[x["rounds"], x["rounds"] * (x["tokens_per_round"] + x["padding_per_round"])]
                + ([x["rounds"] * x["context_per_round"]] if context else []) for x in b]  # fmt: skip
        y = np.array([x["rounds"] * x["round_ms"] for x in b])
        coef, _ = nnls(np.array(cols, dtype=float), y)
        padding = statistics.median(
            x["padding_per_round"] / max(x["tokens_per_round"] + x["padding_per_round"], 1e-9) for x in b
        )
        terms = f"{coef[0]:.2f} ms per round + {1000 * coef[1]:.1f} us per token slot"
        terms += f" + {1e6 * coef[2]:.2f} ns per query-key pair read" if context else " (no per-context term: the server exports no attention_pairs counter)"
        lines.append(f"{model}: our round time ~ {terms} (non-negative least squares over {len(b)} runs); "
                     f"padding is {padding:.0%} of the slots")  # fmt: skip
    return "\n".join(lines)
