"""What prefix grouping inside the batch window buys: the same job with and without grouping.

The input interleaves the questions of many articles (question 1 of every article, then question 2,
...), the worst order for a prefix cache; the KV pool holds only a few articles at a time. Both runs
use the same window, engine and pool, each on a fresh engine (cold cache), side by side:

    python tools/perf/batch_grouping.py [--articles 16 --questions 4 --article-tokens 256 --window 64]

Prints per run: reuse (cached / prompt tokens), tokens the step computed, rounds, step time (device,
compiles excluded), wall time, requests/s; then the ratios grouped / not grouped.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from radixflow_jax.batch import BatchJob, JobConfig
from radixflow_jax.llm import LLM
from radixflow_jax.paths import xla_cache_dir


def write_input(path: str, args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    articles = [rng.integers(20, 500, args.article_tokens).tolist() for _ in range(args.articles)]
    with open(path, "w") as f:
        for q in range(args.questions):
            for a, article in enumerate(articles):
                question = rng.integers(20, 500, args.question_tokens).tolist()
                f.write(json.dumps({"id": f"a{a}q{q}", "prompt_token_ids": article + question,
                                    "max_tokens": args.max_tokens}) + "\n")  # fmt: skip


def run(args: argparse.Namespace, src: str, group: bool, workdir: str, rep: int = 0) -> dict[str, float]:
    pages_per_article = -(-(args.article_tokens + args.question_tokens + args.max_tokens) // 16)
    llm = LLM(
        args.model, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.article_tokens + args.question_tokens + args.max_tokens + 16,
        num_kv_pages=1 + args.pool_articles * pages_per_article, seed=0,
        compilation_cache_dir=xla_cache_dir(),
    )  # fmt: skip
    out = os.path.join(workdir, f"out-{'group' if group else 'nogroup'}-{rep}.jsonl")
    cfg = JobConfig(src, out, window=args.window, group=group, model_name=args.model, progress=False)
    t0 = time.perf_counter()
    stats = BatchJob(llm.engine, llm.model, cfg).run()
    wall = time.perf_counter() - t0
    records = llm.engine.records
    return {"reuse": stats.hit_rate, "wall_s": wall, "req_per_s": stats.requests / wall, "rounds": len(records),
            "computed_tokens": sum(r.num_tokens for r in records), "step_s": sum(r.step_s for r in records)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-qwen3.5")
    p.add_argument("--articles", type=int, default=16)
    p.add_argument("--questions", type=int, default=4)
    p.add_argument("--article-tokens", type=int, default=256)
    p.add_argument("--question-tokens", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--pool-articles", type=int, default=6, help="KV pool size in articles (forces eviction)")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs of each order (medians reported)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        src = os.path.join(workdir, "in.jsonl")
        write_input(src, args)
        print(f"load average before: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        runs: dict[str, list[dict[str, float]]] = {"no grouping": [], "grouped": []}
        for rep in range(args.repeats):  # interleaved, alternating which goes first
            order = (("no grouping", False), ("grouped", True))
            for name, group in order if rep % 2 == 0 else order[::-1]:
                runs[name].append(run(args, src, group, workdir, rep))
        print(f"load average after: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    # counts are identical across repeats; times are medians (spread = max - min)
    rows = {name: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for name, rs in runs.items()}
    spread = {name: max(r["step_s"] for r in rs) - min(r["step_s"] for r in rs) for name, rs in runs.items()}
    print(f"pool: {args.pool_articles} articles; {args.articles} articles x {args.questions} questions, window {args.window}; "
          f"medians of {args.repeats} interleaved runs (step-time spread: "
          + ", ".join(f"{n} {v:.1f}s" for n, v in spread.items()) + ")")
    print(f"{'run':<12} {'reuse':>7} {'computed tok':>13} {'rounds':>7} {'step s':>7} {'wall s':>7} {'req/s':>7}")
    for name, r in rows.items():
        print(f"{name:<12} {100 * r['reuse']:>6.1f}% {r['computed_tokens']:>13.0f} {r['rounds']:>7.0f} {r['step_s']:>7.1f} "
              f"{r['wall_s']:>7.1f} {r['req_per_s']:>7.2f}")  # fmt: skip
    a, b = rows["no grouping"], rows["grouped"]
    print(f"grouped / no grouping: computed tokens {b['computed_tokens'] / a['computed_tokens']:.2f}x, "
          f"rounds {b['rounds'] / a['rounds']:.2f}x, step time {b['step_s'] / a['step_s']:.2f}x, "
          f"wall {b['wall_s'] / a['wall_s']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
