"""Load check of ``radixflow serve``: N concurrent streaming clients on loopback (default 200), every
k-th disconnecting mid-stream. Passes when no response is a 5xx, every client that stayed got a
complete, well-formed stream, and after the requests end (and a prefix-cache reset) every KV page
and state slot is free again. Prints ``vllm bench serve``-style numbers; exits 1 on a failed check.

    python benchmarks/serve_load.py [--clients 200] [--drop-every 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
import time

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


def main() -> int:
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
    p.add_argument("--json", dest="json_out", default=None)
    p.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds for loading and compiling")
    args = p.parse_args()

    requests = generate(WorkloadSpec(
        args.workload, num_requests=args.clients, arrival="all", max_tokens=args.max_tokens,
        article_len=args.article_len, question_len=args.question_len,
    ))  # fmt: skip
    server = ServerProcess(
        ["--model", args.model, "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens",
         str(args.max_num_batched_tokens), "--max-waiting", str(10 * args.clients)],
        startup_timeout=args.startup_timeout,
    )  # fmt: skip
    try:
        started = time.perf_counter()
        results, wall = asyncio.run(
            run_requests(server.url, requests, drop_every=args.drop_every, timeout=args.timeout)
        )
        summary = summarize(results, wall)
        print(format_report(summary))
        deadline = time.monotonic() + 120
        while (g := gauges(server.url))["radixflow:num_requests_running"] + g["radixflow:num_requests_waiting"] > 0:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        pools = httpx.post(server.url + "/reset_prefix_cache").json()
        aborted = sum(
            v for k, v in gauges_full(server.url).items()
            if k.startswith("radixflow:request_success_total{") and "finished_reason=abort" in k
        )
        checks = {
            "no_5xx": summary["status_5xx"] == 0,
            "every_kept_stream_complete": summary["failed"] == 0
            and summary["completed"] + summary["dropped"] == len(requests),
            "gauges_back_to_zero": g["radixflow:num_requests_running"] == 0 and g["radixflow:num_requests_waiting"] == 0,
            "no_leaked_pages": pools["kv_pages_free"] == pools["kv_pages_total"],
            "no_leaked_slots": pools["state_slots_free"] == pools["state_slots_total"],
            "disconnects_abort_requests": aborted >= 1 if summary["dropped"] else True,
        }
        print(f"aborted by disconnect: {aborted:.0f} of {summary['dropped']} dropped clients; pools {pools}")
        for name, ok in checks.items():
            print(f"{'PASS' if ok else 'FAIL'} {name}")
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump({"date": datetime.date.today().isoformat(), "clients": args.clients, "checks": checks,
                           "aborted": aborted, "total_s": time.perf_counter() - started, **summary}, f, indent=2)  # fmt: skip
        return 0 if all(checks.values()) else 1
    finally:
        server.stop()


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
