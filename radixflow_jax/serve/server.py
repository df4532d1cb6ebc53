"""``radixflow serve``: build the engine from command-line options and run the app on uvicorn.

SIGTERM / SIGINT drain: the listening socket closes, new requests on open connections get 503,
running requests finish (bounded by ``--drain-timeout``), then the engine shuts down and the
process exits 0.

``--memory-fraction F`` sizes the KV page pool and the state-slot pool from device memory (as
vLLM's ``--gpu-memory-utilization``): ``F x device memory`` minus the parameters and an activation
reserve, split so that the state pool gets the slots the fixed sizing would give, at most half.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Any

from radixflow_jax.engine.build import memory_pools
from radixflow_jax.engine.config import ENGINE_SCHEDULER, EngineConfig
from radixflow_jax.engine.params import DEFAULT_MAX_N
from radixflow_jax.paths import xla_cache_dir
from radixflow_jax.serve.caps import (
    DEFAULT_MAX_WAITING,
    DEFAULT_PREPARE_TIMEOUT_S,
    DEFAULT_PREPARE_WORKERS,
    DEFAULT_STEP_STALL_S,
    DEFAULT_STREAM_TIMEOUT_S,
)

DEFAULT_CACHE = xla_cache_dir()
DEFAULT_MAX_CONNECTIONS = 1024


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-qwen3.5", help="preset name or model directory")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="the model id clients use (default: --model)")
    p.add_argument("--api-key", default=os.environ.get("RADIXFLOW_API_KEY"), help="require 'Authorization: Bearer KEY'")
    p.add_argument("--max-waiting", type=int, default=DEFAULT_MAX_WAITING,
                   help="answer 429 when a request would make more than this many requests wait (n siblings count n; "
                        f"requests in preparation count; default {DEFAULT_MAX_WAITING})")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--memory-fraction", type=float, default=None, help="size KV and state pools from device memory")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20)
    p.add_argument("--max-n", type=int, default=DEFAULT_MAX_N,
                   help="the most samples (n, best_of) one request may ask for (larger: 400)")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="seconds running requests get after SIGTERM")
    add_safety_arguments(p)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--policy", default=ENGINE_SCHEDULER.policy)
    p.add_argument("--queue-order", default=ENGINE_SCHEDULER.queue_order)
    p.add_argument("--max-num-seqs", type=int, default=ENGINE_SCHEDULER.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=ENGINE_SCHEDULER.max_num_batched_tokens)
    p.add_argument("--page-size", type=int, default=ENGINE_SCHEDULER.page_size)
    p.add_argument("--num-kv-pages", type=int, default=None)
    p.add_argument("--num-state-slots", type=int, default=None)
    p.add_argument("--host-cache-gb", type=float, default=None,
                   help="host memory for checkpoints and KV pages evicted from the device pools (the host tier); "
                        "default: an eighth of the host's RAM, at most 4 GiB; 0: none")
    p.add_argument("--host-kv-fraction", type=float, default=None,
                   help="the host tier's share for KV pages, 0-1 (default: the device pools' split by bytes)")
    p.add_argument("--no-prefix-cache", action="store_true", help="the same as --policy no-cache")
    p.add_argument("--speculative", default=None, choices=("ngram", "draft", "mtp"),
                   help="speculative decoding: drafts verified in one row, from each request's own tokens (ngram), "
                        "from --draft-model (draft) or from the model's own MTP layer (mtp: Qwen3.5, Qwen3-Next)")
    p.add_argument("--draft-model", default=None,
                   help="the draft model of --speculative draft: a path or preset with the model's tokenizer")
    p.add_argument("--num-draft", type=int, default=None,
                   help="the most drafted tokens a verify row carries (default 4; mtp drafts 1)")
    p.add_argument("--penalty-window", type=int, default=None,
                   help="longest context (tokens) a request with penalties may have (default min(max-model-len, 4096))")
    p.add_argument("--kernels", default="auto", choices=("auto", "reference", "pallas"))
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size: shard the model over this many devices")
    p.add_argument("--dp", type=int, default=1,
                   help="data-parallel replicas (each its own scheduler, cache and pools; replica i on devices [i*tp, (i+1)*tp))")
    p.add_argument("--router", default="prefix", help="how requests pick a replica with --dp > 1: prefix | round-robin | least-loaded")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", choices=("background", "all", "lazy"), default="background",
                   help="background: listen at once and compile the step variants while idle (the compile guard "
                        "starts when done); all: compile every variant before listening; lazy: on first use")
    p.add_argument("--no-warmup", action="store_true", help="the same as --warmup lazy")
    p.add_argument("--compilation-cache-dir", default=DEFAULT_CACHE)
    p.add_argument("--log-level", default="warning")


# the numeric bounds on what clients can make the server do: flag, type, default, what it bounds
_BOUNDS: tuple[tuple[str, type, float, str], ...] = (
    ("--max-connections", int, DEFAULT_MAX_CONNECTIONS,
     "open connections beyond this get 503 (uvicorn's limit_concurrency)"),
    ("--stream-timeout", float, DEFAULT_STREAM_TIMEOUT_S,
     "abort a stream whose client takes no data for this many seconds (0: never)"),
    ("--prepare-workers", int, DEFAULT_PREPARE_WORKERS, "threads that tokenise and convert requests"),
    ("--prepare-timeout", float, DEFAULT_PREPARE_TIMEOUT_S,
     "400 for a request whose preparation takes longer (seconds)"),
    ("--step-stall-timeout", float, DEFAULT_STEP_STALL_S,
     "/health answers 503 while a step has run this long (seconds, 0: never)"),
)


def add_safety_arguments(p: argparse.ArgumentParser) -> None:
    """The options that bound what clients can make the server do (docs/serving.md, "Security")."""
    for flag, kind, default, what in _BOUNDS:
        p.add_argument(flag, type=kind, default=default, help=f"{what} (default {default:g})")
    p.add_argument("--enable-reset-prefix-cache", action="store_true",
                   help="serve POST /reset_prefix_cache (off: 403); for test and benchmark servers")
    p.add_argument("--private-cache-stats", action="store_true",
                   help="hide usage.prompt_tokens_details.cached_tokens and require the API key for /metrics "
                        "(they reveal whether other tenants sent a prefix); needs --api-key")


def server_config(args: argparse.Namespace, name: str) -> Any:
    """The :class:`ServerConfig` of the options (their checks raise ``ValueError``)."""
    from radixflow_jax.serve.state import ServerConfig

    if args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be >= 1, got {args.max_waiting}")
    if args.private_cache_stats and not args.api_key:
        raise ValueError("--private-cache-stats needs --api-key (it puts /metrics behind the key)")
    return ServerConfig(
        name,
        api_key=args.api_key or None,
        max_waiting=args.max_waiting,
        max_body_bytes=args.max_body_bytes,
        stream_timeout_s=args.stream_timeout or None,
        prepare_workers=args.prepare_workers,
        prepare_timeout_s=args.prepare_timeout or None,
        step_stall_s=args.step_stall_timeout or None,
        allow_cache_reset=args.enable_reset_prefix_cache,
        private_cache_stats=args.private_cache_stats,
    )


def warn_if_exposed(host: str, api_key: str | None) -> None:
    """A warning on stderr when the server listens beyond loopback without an API key."""
    if api_key or host in ("localhost", "::1") or host.startswith("127."):
        return
    print(
        f"radixflow serve: WARNING: listening on {host} without --api-key: anyone who can reach this address "
        "can use the model and see its metrics",
        file=sys.stderr,
        flush=True,
    )


def device_memory_bytes() -> int:
    """Memory of the first JAX device (its allocator limit), or the host's RAM for a CPU device."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def param_bytes(model: Any) -> int:
    """Bytes of a loaded model's parameters (what ``memory_pools`` subtracts)."""
    import jax

    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model.params))


def warmup_mode(args: argparse.Namespace) -> str:
    """``background`` | ``all`` | ``lazy`` (``--no-warmup`` is ``lazy``)."""
    return "lazy" if args.no_warmup else args.warmup


def speculative_option(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--speculative`` / ``--num-draft`` / ``--draft-model`` as the engine's ``speculative`` option
    (``scheduler/drafts.SpeculativeConfig`` checks them: a draft model needs ``draft``)."""
    if not args.speculative:
        if args.draft_model:
            raise SystemExit("--draft-model needs --speculative draft")
        return None
    option: dict[str, Any] = {"method": args.speculative, "num_draft": args.num_draft}
    if args.draft_model:
        option["draft_model"] = args.draft_model
    return option


def build_state(args: argparse.Namespace) -> Any:
    import functools

    from radixflow_jax.replicas.background import BackgroundEngine
    from radixflow_jax.replicas.warmup import BackgroundWarmup
    from radixflow_jax.engine.build import build_engine
    from radixflow_jax.replicas.placement import replica_models
    from radixflow_jax.replicas.replicated import ReplicatedEngine
    from radixflow_jax.replicas.router import RouterConfig
    from radixflow_jax.serve.app import ServerState
    from radixflow_jax.serve.metrics import ServerMetrics

    router = RouterConfig(policy=args.router, block=args.page_size)  # refuses an unknown router before loading
    models = replica_models(args.model, args.dtype, args.tp, args.dp, mtp=args.speculative == "mtp")
    model = models[0]
    ec = EngineConfig.from_options(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens, page_size=args.page_size,
        num_kv_pages=args.num_kv_pages, num_state_slots=args.num_state_slots, max_model_len=args.max_model_len,
        host_cache_gb=args.host_cache_gb, host_kv_fraction=args.host_kv_fraction,
        policy="no-cache" if args.no_prefix_cache else args.policy, queue_order=args.queue_order,
        kernels=args.kernels, seed=args.seed, warmup=warmup_mode(args) == "all",
        compilation_cache_dir=args.compilation_cache_dir or None, penalty_window=args.penalty_window, max_n=args.max_n,
        speculative=speculative_option(args),
    )
    if args.memory_fraction is not None:
        if args.num_kv_pages is not None or args.num_state_slots is not None:
            raise ValueError("--memory-fraction sizes the pools: do not also give --num-kv-pages/--num-state-slots")
        sharing = sum(m is model for m in models)  # replicas on one device split its memory
        pages, slots = memory_pools(
            model.config, model.dtype, ec, args.memory_fraction / sharing, device_memory_bytes(), param_bytes(model)
        )
        ec = dataclasses.replace(ec, num_kv_pages=pages, num_state_slots=slots)
    name = args.served_model_name or args.model
    config = server_config(args, name)
    metrics = ServerMetrics(name, hybrid=model.config.is_hybrid)
    cores = [build_engine(m, ec) for m in models]
    warmups = tuple(BackgroundWarmup(c.executor) for c in cores) if warmup_mode(args) == "background" else ()
    replicas = [
        BackgroundEngine(
            core,
            observer=functools.partial(metrics.observe, replica=i),
            trim_records=True,
            idle=warmups[i] if warmups else None,
        )
        for i, core in enumerate(cores)
    ]
    engine = replicas[0] if len(replicas) == 1 else ReplicatedEngine(replicas, router)
    metrics.attach(engine)
    return ServerState(
        engine=engine,
        tokenizer=model.tokenizer,
        metrics=metrics,
        config=config,
        max_model_len=engine.core.max_model_len,
        vocab_size=model.config.vocab_size,
        warmups=warmups,
    )


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from radixflow_jax.serve.app import create_app

    warn_if_exposed(args.host, args.api_key)
    state = build_state(args)
    pools = state.engine.core.scheduler.memory
    replicas = f", {len(state.replicas)} replicas (router {args.router})" if len(state.replicas) > 1 else ""
    print(
        f"radixflow serve: {state.config.model_name} on http://{args.host}:{args.port} "
        f"(max_model_len {state.max_model_len}, {pools.pages.capacity} KV pages, "
        f"{pools.slots.capacity if pools.slots else 0} state slots per replica, policy {args.policy}{replicas})",
        file=sys.stderr,
        flush=True,
    )

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            state.draining = True  # new requests get 503 while running ones finish
            super().handle_exit(sig, frame)
            self._captured_signals.clear()  # a drained shutdown exits 0 instead of re-raising the signal

    config = uvicorn.Config(
        create_app(state),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=max(1, math.ceil(args.drain_timeout)),
        limit_concurrency=args.max_connections,
        access_log=False,
    )
    try:
        DrainingServer(config).run()
    finally:
        state.preparer.shutdown()
        state.engine.shutdown()
    return 0
