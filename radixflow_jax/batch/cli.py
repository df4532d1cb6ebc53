"""Arguments and entry point of ``radixflow batch``."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from radixflow_jax.engine.config import ENGINE_SCHEDULER
from radixflow_jax.paths import xla_cache_dir


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="preset name, model directory or .gguf file")
    p.add_argument("--input", required=True, help="JSONL: OpenAI batch lines or {id, prompt|prompt_token_ids|messages}")
    p.add_argument("--output", required=True, help="JSONL written in input order (a state file sits beside it)")
    p.add_argument("--resume", action="store_true", help="continue a killed job from its output and state file")
    p.add_argument(
        "--on-error",
        choices=("skip", "fail"),
        default="skip",
        help="a bad line becomes an error record (skip) or stops the job (fail)",
    )
    p.add_argument("--window", type=int, default=256, help="input lines grouped by shared prefix at a time")
    p.add_argument("--no-group", action="store_true", help="submit in input order (no prefix grouping)")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--policy", default=ENGINE_SCHEDULER.policy)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--seed", type=int, default=0, help="engine seed (sampled requests without a seed)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--warmup", action="store_true",
                   help="compile every step variant at start-up (default: each on first use, so records start at once)")
    p.add_argument("--no-warmup", action="store_true", help="the default (variants compile on first use)")
    p.add_argument(
        "--compile-cache", default=None, help="persistent XLA cache directory (default under RADIXFLOW_CACHE)"
    )
    p.add_argument("--no-compile-cache", action="store_true")
    p.add_argument("--num-processes", type=int, default=1,
                   help="processes of the job (one engine each); each answers a contiguous share of the requests")
    p.add_argument("--process-id", type=int, default=0, help="this process's index in [0, --num-processes)")
    p.add_argument(
        "--coordinator",
        default=None,
        help="host:port of process 0's jax.distributed coordinator (same on every process)",
    )


def run(args: argparse.Namespace) -> int:
    from radixflow_jax.batch.runner import BatchJob, JobConfig, JobStopped, check_start
    from radixflow_jax.replicas import distributed
    from radixflow_jax.llm import LLM

    cfg = JobConfig(
        input=args.input, output=args.output, resume=args.resume, on_error=args.on_error, window=args.window,
        group=not args.no_group, model_name=args.model, progress=not args.no_progress,
    )
    if not os.path.isfile(args.input):
        raise FileNotFoundError(f"--input {args.input}: no such file")
    many = args.num_processes > 1
    if many:
        from radixflow_jax.batch import parts

        if args.coordinator is None:
            raise ValueError("--num-processes > 1 needs --coordinator host:port (the same on every process)")
        dist = distributed.DistributedConfig(args.coordinator, args.num_processes, args.process_id)
        if parts.finished_before(cfg):  # before the model loads: a refused start costs nothing
            print(f"radixflow batch: {args.output} is complete already", file=sys.stderr)
            return 0
        distributed.initialize(dist)  # before anything else starts a JAX backend
    else:
        # before the model loads: a refused start costs nothing; a --resume of a job that wrote
        # nothing yet is a fresh start (said once, here)
        if check_start(cfg) is None and cfg.resume:
            cfg = dataclasses.replace(cfg, resume=False)
    cache_dir = None if args.no_compile_cache else args.compile_cache or xla_cache_dir()
    llm = LLM(
        args.model, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len, policy=args.policy,
        seed=args.seed, compilation_cache_dir=cache_dir, warmup=args.warmup and not args.no_warmup,
    )
    if many:
        return _report_share(parts.run_share(llm.engine, llm.model, cfg, args.process_id, args.num_processes), args)
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


def _report_share(result: object, args: argparse.Namespace) -> int:
    from radixflow_jax.batch.parts import ShareResult

    assert isinstance(result, ShareResult)
    me = f"radixflow batch [process {args.process_id}/{args.num_processes}]"
    if result.stats is None:
        print(f"{me}: {args.output} is complete already", file=sys.stderr)
        return 0
    s = result.stats
    print(
        f"{me}: {s.requests} requests, {s.errors} errors, {s.generated_tokens} tokens in {s.elapsed_s:.1f} s; "
        f"cache hit rate {100 * s.hit_rate:.1f}%",
        file=sys.stderr,
    )
    if result.stopped:
        print(f"{me}: {result.stopped}", file=sys.stderr)
    if result.merged is not None:
        print(f"{me}: merged {result.merged} records into {args.output}", file=sys.stderr)
        if result.merge_stopped:
            print(f"{me}: {result.merge_stopped}", file=sys.stderr)
    return 1 if result.stopped or result.merge_stopped else 0
