"""Arguments and entry point of ``radixflow batch``."""

from __future__ import annotations

import argparse
import os
import sys

from radixflow_jax.paths import xla_cache_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="preset name, model directory or .gguf file")
    p.add_argument("--input", required=True, help="JSONL: OpenAI batch lines or {id, prompt|prompt_token_ids|messages}")
    p.add_argument("--output", required=True, help="JSONL written in input order (a state file sits beside it)")
    p.add_argument("--resume", action="store_true", help="continue a killed job from its output and state file")
    p.add_argument("--on-error", choices=("skip", "fail"), default="skip",
                   help="a bad line becomes an error record (skip) or stops the job (fail)")  # fmt: skip
    p.add_argument("--window", type=int, default=256, help="input lines grouped by shared prefix at a time")
    p.add_argument("--no-group", action="store_true", help="submit in input order (no prefix grouping)")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--policy", default="radixflow")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--seed", type=int, default=0, help="engine seed (sampled requests without a seed)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-warmup", action="store_true", help="compile step variants on first use, not at start-up")
    p.add_argument("--compile-cache", default=None, help="persistent XLA cache directory (default under RADIXFLOW_CACHE)")
    p.add_argument("--no-compile-cache", action="store_true")


def run(args: argparse.Namespace) -> int:
    from radixflow_jax.batch.runner import BatchJob, JobConfig, JobStopped, check_start
    from radixflow_jax.engine.llm import LLM

    cfg = JobConfig(
        input=args.input, output=args.output, resume=args.resume, on_error=args.on_error, window=args.window,
        group=not args.no_group, model_name=args.model, progress=not args.no_progress,
    )  # fmt: skip
    if not os.path.isfile(args.input):
        raise FileNotFoundError(f"--input {args.input}: no such file")
    check_start(cfg)  # before the model loads: a refused start costs nothing
    cache_dir = None if args.no_compile_cache else args.compile_cache or xla_cache_dir()
    llm = LLM(
        args.model, dtype=args.dtype, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, policy=args.policy, seed=args.seed, compilation_cache_dir=cache_dir,
        warmup=not args.no_warmup,
    )  # fmt: skip
    job = BatchJob(llm.engine, llm.model, cfg)
    try:
        stats = job.run()
    except JobStopped as exc:
        print(f"radixflow batch: {exc}", file=sys.stderr)
        return 1
    print(
        f"radixflow batch: {stats.requests} requests, {stats.errors} errors, {stats.generated_tokens} tokens in "
        f"{stats.elapsed_s:.1f} s (resumed at {stats.started}); cache hit rate {100 * stats.hit_rate:.1f}%",
        file=sys.stderr,
    )
    return 0
