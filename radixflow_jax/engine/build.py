"""The one place engines are assembled and their pools sized.

An engine is built from an :class:`~radixflow_jax.engine.spec.EngineSpec` (the engine config, the
model's facts and the pool sizes; it derives the cache geometry, the step shapes and the scheduler
config completed with the model) and an executor factory. Every kind goes through
:func:`assemble_engine`: the model engine (:func:`build_engine`), the simulated engine and the
simulated mirror of a model engine (``sim/engines.py``) and the shadow engine
(``reliability/harness.py``), so they make the same scheduling decisions from the same spec.

Pool sizes come from configurations alone, never from loaded weights, so a memory plan can use the
same sizers: :func:`pool_sizes` (the engine's defaults for a model config), :func:`memory_pools`
(``radixflow serve --memory-fraction``) and :func:`device_pools` (the simulator's device memory).

No JAX at import time: the executor is built by the caller's factory from the step shapes.
"""

from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.engine.protocol import Executor
from radixflow_jax.engine.roundcost import FittedRoundCost
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.runner.window import variant_for
from radixflow_jax.scheduler.drafts import Drafter, MtpDrafts

if TYPE_CHECKING:
    from radixflow_jax.models.api import LoadedModel
    from radixflow_jax.models.config import ModelConfig


def assemble_engine(
    spec: EngineSpec,
    make_executor: Callable[[ShapeConfig], Executor],
    *,
    clock: Callable[[], float] = time.perf_counter,
    drafter: Drafter | None = None,
) -> EngineCore:
    """An engine over ``make_executor(spec.shapes())``; ``engine.spec`` keeps ``spec``. ``drafter``:
    the model drafter that speculative method ``draft`` needs (``engine/drafter.py``)."""
    speculative = spec.config.scheduler.speculative
    method = speculative.method if speculative is not None else None
    if (method == "draft") != (drafter is not None and not isinstance(drafter, MtpDrafts)):
        raise ValueError("speculative method 'draft' needs a draft model's engine (build_engine's), and only it")
    if (method == "mtp") != isinstance(drafter, MtpDrafts):
        raise ValueError("speculative method 'mtp' needs an MtpDrafts drafter (build_engine's), and only it")
    engine = EngineCore(make_executor(spec.shapes()), spec, clock=clock)
    engine.scheduler.drafter = drafter
    # pairing and the fill rule judge by the round-cost estimator fitted to this engine's own rounds
    if spec.config.scheduler.speculative is not None:  # drafts fill the padding of the variant a round runs in
        shapes = spec.shapes()
        engine.scheduler.pad_tokens = lambda plan: variant_for(plan, shapes)[0].num_tokens
    if engine.scheduler.policy.uses_round_cost:
        engine.scheduler.round_cost = FittedRoundCost(spec.shapes(), engine.records)
    return engine


def recurrent_chunks(cfg: ModelConfig) -> list[int]:
    chunks = []
    if cfg.gdn is not None:
        chunks.append(cfg.gdn.chunk_size)
    if cfg.mamba is not None:
        chunks.append(cfg.mamba.chunk_size)
    return chunks


def pool_sizes(cfg: ModelConfig, ec: EngineConfig, max_model_len: int) -> tuple[int, int]:
    """``(num_kv_pages, num_state_slots)`` including the reserved id 0 of each pool; checks minimums."""
    page_size, seqs = ec.scheduler.page_size, ec.scheduler.max_num_seqs
    pages_per_seq = math.ceil(max_model_len / page_size)
    min_pages, min_slots = pages_per_seq + 1, 2 if cfg.is_hybrid else 1
    pages = ec.num_kv_pages if ec.num_kv_pages is not None else 1 + max(
        2 * seqs * math.ceil(min(max_model_len, 2048) / page_size), pages_per_seq
    )
    slots = ec.num_state_slots if ec.num_state_slots is not None else 1 + seqs + max(64, 8 * seqs)
    if not cfg.is_hybrid:
        slots = 1
    if pages < min_pages:
        raise ValueError(
            f"num_kv_pages={pages} cannot hold one request of max_model_len={max_model_len} tokens: "
            f"the minimum is {min_pages} ({pages_per_seq} pages of {page_size} tokens + the reserved page 0)"
        )
    if slots < min_slots:
        raise ValueError(f"num_state_slots={slots}: the minimum is {min_slots} (one request + the reserved slot 0)")
    return pages, slots


DEFAULT_HOST_CACHE_GB = 4.0  # the host tier's default ceiling (cache/tiers.py)


def default_host_cache_gb(ram_bytes: int | None = None) -> float:
    """The model engine's default host tier: an eighth of the host's RAM (``ram_bytes``, read from
    the OS when None), at most ``DEFAULT_HOST_CACHE_GB``. Host rows are mapped lazily: an unused
    tier costs no RAM."""
    ram = ram_bytes if ram_bytes is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(DEFAULT_HOST_CACHE_GB, ram / 8 / 2**30)


def host_tier_sizes(
    *, slot_bytes: int, page_bytes: int, device_state_bytes: int, device_kv_bytes: int, ec: EngineConfig,
    default_gb: float,
) -> tuple[int, int]:
    """The host tier's ``(checkpoints, KV pages)`` (``cache/tiers.py``, ``cache/hostkv.py``; 0:
    none, and always 0 checkpoints for a model without recurrent state, whose ``slot_bytes`` is 0,
    and 0 pages without attention layers). ``ec.num_host_slots`` / ``ec.num_host_pages`` when either
    is given (the other is then 0); else ``ec.host_cache_gb`` GiB (``default_gb`` when None), of
    which ``ec.host_kv_fraction`` goes to KV pages, by default the share KV has in the device pools
    (``device_kv_bytes`` against ``device_state_bytes``), so the host tier keeps the device's
    proportions. ``EngineConfig`` refuses negative sizes and fractions outside [0, 1]."""
    if ec.num_host_slots is not None or ec.num_host_pages is not None:
        slots = ec.num_host_slots or 0 if slot_bytes else 0
        return slots, (ec.num_host_pages or 0 if page_bytes else 0)
    total = (ec.host_cache_gb if ec.host_cache_gb is not None else default_gb) * 2**30
    kv_share = ec.host_kv_fraction
    if kv_share is None:
        device = device_kv_bytes + device_state_bytes
        kv_share = device_kv_bytes / device if device else 0.0
    slots = int(total * (1.0 - kv_share) // slot_bytes) if slot_bytes else 0
    pages = int(total * kv_share // page_bytes) if page_bytes else 0
    return slots, pages


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


def packed_rows_free(model: LoadedModel, kernels: str) -> bool:
    """Whether ``model``'s step prices a one-token row in the prefill region at one token: the
    native CPU kernels serve every prefill-region call of it (backend ``auto`` on the CPU, one
    device, native kernels enabled, float32 weights and pages, a Gated DeltaNet value head within
    the native scan's scratch), whose scans go token by token and whose attention goes query by
    query. The Pallas and XLA forms pad each row to a chunk or a query block instead
    (``runner/shapes.py``, ``mixed_layout``)."""
    import jax
    import jax.numpy as jnp

    from radixflow_jax.kernels import native

    cfg = model.config
    one_device = getattr(model, "tensor_parallel_size", 1) == 1 and jax.device_count() == 1
    scan_fits = cfg.gdn is None or cfg.gdn.head_v_dim <= native.MAX_VALUE_DIM
    served = kernels == "auto" and jax.default_backend() == "cpu" and one_device and scan_fits
    return served and jnp.dtype(model.dtype) == jnp.float32 and native.enabled()


def build_engine(model: LoadedModel, ec: EngineConfig) -> EngineCore:
    """The model engine of ``model`` under ``ec``: pools sized by :func:`pool_sizes`, a
    :class:`~radixflow_jax.engine.executor.ModelExecutor` over the wired step shapes."""
    from radixflow_jax.engine.executor import ModelExecutor, stderr_progress
    cfg = model.config
    if ec.compilation_cache_dir:
        enable_compilation_cache(ec.compilation_cache_dir)
    max_model_len = ec.max_model_len or min(cfg.max_position_embeddings, 8192)
    num_pages, num_slots = pool_sizes(cfg, ec, max_model_len)
    page_bytes, slot_bytes = pool_units(cfg, model.dtype, ec)
    num_host, num_host_pages = host_tier_sizes(
        slot_bytes=slot_bytes, page_bytes=page_bytes, device_state_bytes=num_slots * slot_bytes,
        device_kv_bytes=num_pages * page_bytes, ec=ec, default_gb=default_host_cache_gb(),
    )
    kernels = step_kernels(model, ec.kernels)
    spec = EngineSpec(
        config=ec,
        hybrid=cfg.is_hybrid,
        chunk_sizes=tuple(recurrent_chunks(cfg)),
        num_pages=num_pages,
        num_slots=num_slots,
        num_host_slots=num_host,
        num_host_pages=num_host_pages,
        state_bytes=slot_bytes,
        page_bytes=page_bytes,
        max_model_len=max_model_len,
        eos_token_ids=tuple(cfg.eos_token_ids) + (model.tokenizer.eos_token_ids if model.tokenizer else ()),
        tokenizer=model.tokenizer,
        vocab_size=cfg.vocab_size,
        packed_rows_free=packed_rows_free(model, kernels),
    )

    def executor(shapes: ShapeConfig) -> Executor:
        return ModelExecutor(
            model,
            shapes,
            page_size=spec.cache_config.page_size,
            num_pages=num_pages,
            num_slots=num_slots,
            kernels=kernels,
            warmup=ec.warmup_all,
            progress=stderr_progress if ec.warmup_progress else None,
            penalty_window=min(max_model_len, 4096) if ec.penalty_window is None else ec.penalty_window,
            num_host_slots=num_host,
            num_host_pages=num_host_pages,
        )

    drafter: Drafter | None = None
    method = ec.scheduler.speculative.method if ec.scheduler.speculative is not None else None
    if method == "draft":
        from radixflow_jax.engine.drafter import model_drafter

        drafter = model_drafter(model, ec, max_model_len)
    elif method == "mtp":
        if not cfg.mtp_layers:
            raise ValueError(
                "speculative method 'mtp' needs the model's MTP layers: pass a path or preset (LLM and "
                "radixflow serve load them), or a model loaded with load(path, mtp=True)"
            )
        drafter = MtpDrafts(keep=4 * ec.scheduler.max_num_seqs)
    return assemble_engine(spec, executor, drafter=drafter)


def pool_units(cfg: ModelConfig, dtype: str, ec: EngineConfig) -> tuple[int, int]:
    """``(page_bytes, slot_bytes)`` of the pools ``ec`` builds for ``cfg``: the MTP layers' KV only
    where the engine drafts with them (``SchedulerConfig.mtp_drafts``). The one place the engine's
    pool sizing and the memory plan read a pool unit from."""
    from radixflow_jax.models.batch import pool_config, pool_unit_bytes

    sc = ec.scheduler
    return pool_unit_bytes(pool_config(cfg, mtp=sc.mtp_drafts), dtype, sc.page_size)


def memory_pools(
    cfg: ModelConfig, dtype: str, ec: EngineConfig, fraction: float, total_bytes: int, param_bytes: int
) -> tuple[int, int]:
    """``(num_kv_pages, num_state_slots)`` (reserved ids included) filling ``fraction`` of
    ``total_bytes`` after ``param_bytes`` of parameters and an activation reserve
    (``radixflow serve --memory-fraction``). From the configuration alone: no weights are read."""
    if not 0 < fraction <= 1:
        raise ValueError(f"--memory-fraction must be in (0, 1], got {fraction}")
    params = param_bytes
    sc = ec.scheduler
    reserve = sc.max_num_batched_tokens * (cfg.hidden_size * 64 + cfg.vocab_size) * 4  # activations and logits
    budget = int(fraction * total_bytes) - params - reserve
    page_bytes, slot_bytes = pool_units(cfg, dtype, ec)
    slots = 1
    if slot_bytes:
        wanted = sc.max_num_seqs + max(64, 8 * sc.max_num_seqs)
        slots = 1 + max(0, min(wanted, (budget // 2) // slot_bytes))
    left = budget - (slots - 1) * slot_bytes
    pages = 1 + (left // page_bytes if page_bytes else 0)
    if budget <= 0 or pages < 2 or (slot_bytes and slots < 2):
        raise ValueError(
            f"--memory-fraction {fraction} of {total_bytes / 2**30:.1f} GiB leaves no room for KV pages and state "
            f"slots after {params / 2**30:.2f} GiB of parameters and {reserve / 2**30:.2f} GiB of activations"
        )
    return int(pages), int(slots)


def device_pools(spec: Any, device: Any, page_size: int, state_fraction: float = 0.3) -> tuple[int, int]:
    """``(num_kv_pages, num_state_slots)`` from the device memory left after the weights (90 % usable):
    the simulator's pools. ``spec`` / ``device``: a ``sim.specs.ModelSpec`` / ``DeviceSpec`` (read by
    field, so this layer does not import the simulator)."""
    free = 0.9 * device.memory_bytes - spec.total_params * spec.dtype_bytes
    if free <= 0:
        raise ValueError(f"{spec.name} ({spec.total_params / 1e9:.1f}B parameters) does not fit on {device.name}")
    slots = int(free * state_fraction // spec.state_bytes) if spec.is_hybrid else 1
    kv_bytes = free - (slots * spec.state_bytes if spec.is_hybrid else 0)
    pages = int(kv_bytes // spec.page_bytes(page_size))
    return pages, max(slots, 1)
