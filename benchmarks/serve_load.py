"""Load check of ``radixflow serve``: N concurrent streaming clients on loopback (default 200), every
k-th disconnecting mid-stream. Passes when no response is a 5xx, every client that stayed got a
complete, well-formed stream, and after the requests end (and a prefix-cache reset) every KV page
and state slot is free again. Prints ``vllm bench serve``-style numbers; exits 1 on a failed check.

Slow readers (``--slow-readers K``): the same clients run twice, first alone, then beside K raw
connections that each open a long stream (``n = --slow-n`` samples) and never read a byte. Both
runs report the server's peak resident memory (``VmRSS`` of ``/proc/<pid>/status``, sampled every
0.1 s) and the other clients' latencies side by side; the slow readers must not grow the server's
memory by more than ``--rss-bound-mb`` (their requests are aborted after ``--stream-timeout``).

    python benchmarks/serve_load.py [--clients 200] [--drop-every 4] [--slow-readers 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
import threading
import time
from typing import Any

import httpx

from radixflow_jax.bench.http import format_report, run_requests, summarize
from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.serve.launch import ServerProcess


def gauges(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            out[s.name] = s.value
    return out


def rss_kib(pid: int) -> int:
    """Resident memory of a process (``VmRSS``, KiB; 0 where /proc has none)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0


class PeakRss:
    """Samples a process's ``VmRSS`` every ``period`` seconds on a thread while the block runs."""

    def __init__(self, pid: int, period: float = 0.1):
        self.pid, self.period, self.peak, self.start = pid, period, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, rss_kib(self.pid))

    def __enter__(self) -> PeakRss:
        self.start = self.peak = rss_kib(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


async def open_slow_readers(url: str, count: int, n: int, max_tokens: int) -> list[asyncio.StreamWriter]:
    """``count`` connections that each send a streamed completion (``n`` samples) and never read."""
    host, port = url.removeprefix("http://").split(":")
    request = {"prompt": "a slow reader " * 8, "max_tokens": max_tokens, "n": n, "stream": True, "ignore_eos": True}
    body = json.dumps(request).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    writers = []
    for _ in range(count):
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(head + body)
        await writer.drain()
        writers.append(writer)
    return writers


async def phase(url: str, requests: list[Any], args: argparse.Namespace, slow: int) -> tuple[list[Any], float]:
    """The clients' run, beside ``slow`` slow readers (closed when the clients are done)."""
    writers = await open_slow_readers(url, slow, args.slow_n, args.slow_max_tokens) if slow else []
    try:
        return await run_requests(url, requests, drop_every=args.drop_every, timeout=args.timeout)
    finally:
        for w in writers:
            w.close()


def run_phase(server: ServerProcess, requests: list[Any], args: argparse.Namespace, slow: int) -> dict[str, Any]:
    """One run: the clients' summary, the server's peak and starting RSS (MiB), and the idle checks."""
    with PeakRss(server.proc.pid) as rss:
        results, wall = asyncio.run(phase(server.url, requests, args, slow))
    summary = summarize(results, wall)
    print(f"--- {slow} slow readers ---\n{format_report(summary)}")
    print(f"server RSS: {rss.start / 1024:.1f} MiB at start, peak {rss.peak / 1024:.1f} MiB")
    deadline = time.monotonic() + 120 + (args.stream_timeout if slow else 0)
    while (g := gauges(server.url))["radixflow:num_requests_running"] + g["radixflow:num_requests_waiting"] > 0:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {"summary": summary, "gauges": g, "rss_start_mib": rss.start / 1024, "rss_peak_mib": rss.peak / 1024}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-qwen3.5")
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--drop-every", type=int, default=4, help="every k-th client disconnects after 2 chunks")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--article-len", type=int, default=48, help="shared article tokens (race-shaped prompts)")
    p.add_argument("--question-len", type=int, default=16)
    p.add_argument("--timeout", type=float, default=1800.0, help="per-request client timeout (s)")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-num-batched-tokens", type=int, default=128)
    p.add_argument("--workload", default="race")
    p.add_argument("--slow-readers", type=int, default=0, help="connections that open a stream and never read")
    p.add_argument("--slow-n", type=int, default=16, help="samples (n) per slow reader's stream")
    p.add_argument("--slow-max-tokens", type=int, default=256)
    p.add_argument("--stream-timeout", type=float, default=60.0, help="the server's --stream-timeout (s)")
    p.add_argument("--rss-bound-mb", type=float, default=512.0,
                   help="slow readers may grow the server's peak RSS by at most this much (MiB)")
    p.add_argument("--no-warmup", action="store_true", help="start the server with --no-warmup (smoke runs)")
    p.add_argument("--compilation-cache-dir", default=None)
    p.add_argument("--json", dest="json_out", default=None)
    p.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds for loading and compiling")
    return p.parse_args()


def start_server(args: argparse.Namespace) -> ServerProcess:
    waiting = 10 * args.clients + args.slow_readers * args.slow_n
    extra = ["--no-warmup"] if args.no_warmup else []
    server_args = [
        "--model", args.model,
        "--max-num-seqs", str(args.max_num_seqs),
        "--max-num-batched-tokens", str(args.max_num_batched_tokens),
        "--max-waiting", str(waiting),
        "--max-n", str(max(16, args.slow_n)),
        "--stream-timeout", str(args.stream_timeout),
        "--enable-reset-prefix-cache",
        *extra,
    ]  # fmt: skip
    return ServerProcess(
        server_args, startup_timeout=args.startup_timeout, compilation_cache_dir=args.compilation_cache_dir
    )


def main() -> int:
    args = parse_args()
    spec = WorkloadSpec(
        args.workload,
        num_requests=args.clients,
        arrival="all",
        max_tokens=args.max_tokens,
        article_len=args.article_len,
        question_len=args.question_len,
    )
    requests = generate(spec)
    server = start_server(args)
    try:
        started = time.perf_counter()
        runs = [run_phase(server, requests, args, 0)]
        if args.slow_readers:
            runs.append(run_phase(server, requests, args, args.slow_readers))
        pools = httpx.post(server.url + "/reset_prefix_cache").json()
        aborted = sum(
            v for k, v in gauges_full(server.url).items()
            if k.startswith("radixflow:request_success_total{") and "finished_reason=abort" in k
        )
        checks = phase_checks(runs, len(requests), pools, aborted, args)
        print(f"aborted: {aborted:.0f} (dropped clients and slow readers); pools {pools}")
        for name, ok in checks.items():
            print(f"{'PASS' if ok else 'FAIL'} {name}")
        if args.json_out:
            report = {
                "date": datetime.date.today().isoformat(),
                "clients": args.clients,
                "checks": checks,
                "slow_readers": args.slow_readers,
                "aborted": aborted,
                "total_s": time.perf_counter() - started,
                "runs": runs,
            }
            with open(args.json_out, "w") as f:
                json.dump(report, f, indent=2)
        return 0 if all(checks.values()) else 1
    finally:
        server.stop()


def phase_checks(
    runs: list[dict[str, Any]], num_requests: int, pools: dict[str, int], aborted: float, args: argparse.Namespace
) -> dict[str, bool]:
    """The pass/fail checks over every run (and the slow readers' memory bound)."""
    checks: dict[str, bool] = {}
    for i, run in enumerate(runs):
        s, g = run["summary"], run["gauges"]
        tag = "" if i == 0 else "_beside_slow_readers"
        checks["no_5xx" + tag] = s["status_5xx"] == 0
        checks["every_kept_stream_complete" + tag] = s["failed"] == 0 and s["completed"] + s["dropped"] == num_requests
        open_requests = g["radixflow:num_requests_running"] + g["radixflow:num_requests_waiting"]
        checks["gauges_back_to_zero" + tag] = open_requests == 0
    checks["no_leaked_pages"] = pools["kv_pages_free"] == pools["kv_pages_total"]
    checks["no_leaked_slots"] = pools["state_slots_free"] == pools["state_slots_total"]
    checks["disconnects_abort_requests"] = aborted >= 1 if runs[0]["summary"]["dropped"] or len(runs) > 1 else True
    if len(runs) > 1:
        growth = runs[1]["rss_peak_mib"] - runs[0]["rss_peak_mib"]
        print(f"slow readers grew the server's peak RSS by {growth:.1f} MiB (bound {args.rss_bound_mb:g} MiB)")
        checks["slow_readers_memory_bounded"] = growth <= args.rss_bound_mb
    return checks


def gauges_full(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


if __name__ == "__main__":
    sys.exit(main())
