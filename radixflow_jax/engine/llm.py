"""The offline API: ``LLM(model, ...).generate(prompts, sampling_params) -> list[RequestOutput]``.

Builds the model, sizes the pools, and runs the engine loop until all given prompts finished;
outputs come back in prompt order. Step variants compile lazily by default (the first round that
needs one compiles and primes it, through the persistent XLA cache when ``compilation_cache_dir``
is set), so start-up costs only the variants a workload uses; ``warmup=True`` compiles and runs
every variant of the bucket set up front, with progress on stderr.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

from radixflow_jax.engine.core import EngineConfig, EngineCore
from radixflow_jax.engine.executor import ModelExecutor, stderr_progress
from radixflow_jax.engine.params import RequestOutput, SamplingParams
from radixflow_jax.models.api import LoadedModel, load
from radixflow_jax.models.batch import state_bytes_per_slot
from radixflow_jax.models.config import ModelConfig
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.engine.wiring import Wiring, wire_engine


def recurrent_chunks(cfg: ModelConfig) -> list[int]:
    chunks = []
    if cfg.gdn is not None:
        chunks.append(cfg.gdn.chunk_size)
    if cfg.mamba is not None:
        chunks.append(cfg.mamba.chunk_size)
    return chunks


def pool_sizes(cfg: ModelConfig, ec: EngineConfig, max_model_len: int) -> tuple[int, int]:
    """``(num_kv_pages, num_state_slots)`` including the reserved id 0 of each pool; checks minimums."""
    pages_per_seq = math.ceil(max_model_len / ec.page_size)
    min_pages, min_slots = pages_per_seq + 1, 2 if cfg.is_hybrid else 1
    pages = ec.num_kv_pages if ec.num_kv_pages is not None else 1 + max(
        2 * ec.max_num_seqs * math.ceil(min(max_model_len, 2048) / ec.page_size), pages_per_seq
    )
    slots = ec.num_state_slots if ec.num_state_slots is not None else 1 + ec.max_num_seqs + max(64, 8 * ec.max_num_seqs)
    if not cfg.is_hybrid:
        slots = 1
    if pages < min_pages:
        raise ValueError(
            f"num_kv_pages={pages} cannot hold one request of max_model_len={max_model_len} tokens: "
            f"the minimum is {min_pages} ({pages_per_seq} pages of {ec.page_size} tokens + the reserved page 0)"
        )
    if slots < min_slots:
        raise ValueError(f"num_state_slots={slots}: the minimum is {min_slots} (one request + the reserved slot 0)")
    return pages, slots


def enable_compilation_cache(directory: str) -> None:
    """Turns on JAX's persistent compilation cache (a process-wide JAX setting)."""
    import jax

    os.makedirs(directory, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def step_kernels(model: LoadedModel, kernels: str) -> str:
    """The kernel backend of ``model``'s step. A tensor-parallel model runs Pallas kernels per shard
    only where its heads are self-contained (``models/sharding.check_pallas_shards``): elsewhere a
    forced ``pallas`` is refused naming the field, and ``auto`` (which means the best backend that
    can run) takes the XLA forms."""
    from radixflow_jax.models.config import ConfigError
    from radixflow_jax.models.sharding import check_pallas_shards

    tp = getattr(model, "tensor_parallel_size", 1)
    if tp > 1 and kernels in ("auto", "pallas"):
        try:
            check_pallas_shards(model.config, tp)
        except ConfigError:
            if kernels == "pallas":
                raise
            return "xla"
    return kernels


def build_engine(model: LoadedModel, ec: EngineConfig) -> EngineCore:
    cfg = model.config
    if ec.compilation_cache_dir:
        enable_compilation_cache(ec.compilation_cache_dir)
    max_model_len = ec.max_model_len or min(cfg.max_position_embeddings, 8192)
    num_pages, num_slots = pool_sizes(cfg, ec, max_model_len)
    kernels = step_kernels(model, ec.kernels)
    wiring = Wiring(ec, cfg.is_hybrid, tuple(recurrent_chunks(cfg)), num_pages, num_slots, max_model_len)

    def executor(shapes: ShapeConfig) -> ModelExecutor:
        return ModelExecutor(
            model, shapes, page_size=ec.page_size, num_pages=num_pages, num_slots=num_slots,
            kernels=kernels, warmup=ec.warmup_all, progress=stderr_progress if ec.warmup_progress else None,
            penalty_window=min(max_model_len, 4096) if ec.penalty_window is None else ec.penalty_window,
        )  # fmt: skip

    eos = tuple(cfg.eos_token_ids) + (model.tokenizer.eos_token_ids if model.tokenizer else ())
    return wire_engine(wiring, executor, eos_token_ids=eos, tokenizer=model.tokenizer, vocab_size=cfg.vocab_size)


def replica_groups(data_parallel_size: int, tensor_parallel_size: int) -> list[int] | None:
    """First local device of each replica's group, or ``None`` when the replicas share one model
    (one replica, or N == 1 replicas on a process with fewer than M devices)."""
    import jax

    m, n = data_parallel_size, tensor_parallel_size
    if m < 1 or n < 1:
        raise ValueError(f"data_parallel_size={m} and tensor_parallel_size={n} must be >= 1")
    if m == 1:
        return None
    have = len(jax.local_devices())
    if m * n <= have:
        return [i * n for i in range(m)]
    if n == 1:
        return None
    raise ValueError(
        f"data_parallel_size={m} x tensor_parallel_size={n} needs {m * n} local devices, {have} are available"
    )


def replica_models(
    model: str | LoadedModel, dtype: str, tensor_parallel_size: int, data_parallel_size: int
) -> list[LoadedModel]:
    """The model of each data-parallel replica, placed as ``replica_groups`` says: one copy per
    device group (an orbax directory restores straight into the shards), or one copy shared by
    every replica when they share a device."""
    from radixflow_jax.models.sharding import load_sharded, shard_model

    groups = replica_groups(data_parallel_size, tensor_parallel_size)
    if isinstance(model, str) and (tensor_parallel_size > 1 or groups is not None):
        models = [load_sharded(model, dtype, tensor_parallel_size, first_device=g) for g in groups or [0]]
        return models if groups is not None else models * data_parallel_size
    loaded = model if isinstance(model, LoadedModel) else load(model, dtype=dtype)
    if groups is None:  # one model (on device 0, or a tp group from device 0) shared by the replicas
        return [shard_model(loaded, tensor_parallel_size)] * data_parallel_size
    return [shard_model(loaded, tensor_parallel_size, first_device=g) for g in groups]


class LLM:
    """Offline generation. ``model``: a preset name, a HF directory or a converted directory.
    ``tensor_parallel_size`` N > 1: parameters and pools sharded over N devices
    (``models/sharding.py``); a model whose heads N does not divide is refused naming the field.
    ``data_parallel_size`` M > 1: M engine replicas (each its own scheduler, cache and pools) behind
    a ``router`` (``engine/router.py``); replica i runs on local devices ``[i*N, (i+1)*N)`` (its own
    copy of the parameters, sharded over its group) when the process has ``M*N`` devices; with fewer
    and N == 1, the replicas share the model's one device (one copy); otherwise it is refused."""

    def __init__(
        self, model: str | LoadedModel, *, dtype: str = "float32", tensor_parallel_size: int = 1,
        data_parallel_size: int = 1, router: str = "prefix", **engine_options: object,
    ):  # fmt: skip
        from radixflow_jax.engine.router import ReplicaSet, RouterConfig

        self.config = EngineConfig(**engine_options)  # type: ignore[arg-type]
        router_config = RouterConfig(policy=router, block=self.config.page_size)
        self.replica_models = replica_models(model, dtype, tensor_parallel_size, data_parallel_size)
        self.model = self.replica_models[0]
        engines = [build_engine(m, self.config) for m in self.replica_models]
        self.engine = engines[0]
        self.replicas = ReplicaSet(engines, router_config)
        self.state_bytes_per_slot = state_bytes_per_slot(self.model.config, self.model.dtype)

    def _ids(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.model.encode(prompt)
        return [int(t) for t in prompt]

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Runs every prompt to completion; a bad prompt raises before anything is queued."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            raise TypeError("prompts must be a list of strings or a list of token-id lists")
        params = sampling_params or SamplingParams()
        per = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(per) != len(prompts):
            raise ValueError(f"{len(per)} sampling params for {len(prompts)} prompts")
        encoded = [self._ids(p) for p in prompts]
        for ids, p in zip(encoded, per):  # validate everything before queueing anything
            self.engine.validate(ids, p)
        rids = [self.replicas.add_request(ids, p) for ids, p in zip(encoded, per)]
        while self.replicas.has_unfinished():
            self.replicas.step()
        outputs = [self.replicas.output(r) for r in rids]
        for replica, r in rids:
            self.replicas.engines[replica].forget(r)
        return outputs

    def reset_prefix_cache(self) -> bool:
        """Drops every cached prefix (KV pages and checkpoints) of every replica, so the next
        ``generate`` computes from scratch (for benchmarks that repeat a workload). Between
        ``generate`` calls nothing is running, so the caches end empty; returns True then."""
        empty = True
        for engine in self.replicas.engines:
            memory = engine.scheduler.memory
            memory.flush()
            empty &= memory.pages.num_used == 0 and (memory.slots is None or memory.slots.num_used == 0)
        return empty
