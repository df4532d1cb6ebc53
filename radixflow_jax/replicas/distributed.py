"""Several processes on JAX's own runtime: start-up through ``jax.distributed``, a share of the
work per process, and exchanges through JAX collectives (gloo on CPU; no home-made transport).

The unit of scale-out across processes is a *data-parallel replica*: every process builds its own
engine (one scheduler, one radix cache, its pools) on its **local** devices, tensor-parallel over
them when asked (``models/sharding.py`` meshes span ``jax.local_devices()``), so a tensor-parallel
engine keeps one host-side scheduler. A job is split by :func:`process_share` (contiguous ranges in
input order), each process runs its share, and :func:`allgather_objects` / :func:`barrier` join the
results.

Invariants: the shares of ``n`` items over ``k`` processes are disjoint, contiguous, in process
order, and their union is ``range(n)``; :func:`generate_across_processes` returns on every process
the outputs of all prompts in prompt order, each equal to what one process computes for it (a
replica never changes what a request computes).
"""

from __future__ import annotations

import dataclasses
import json
import socket
from typing import Any, Sequence

from radixflow_jax.engine.params import RequestOutput, SamplingParams


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """``coordinator``: ``host:port`` of process 0's coordination service (every process passes the
    same); ``num_processes`` and this process's ``process_id`` in ``[0, num_processes)``."""

    coordinator: str
    num_processes: int
    process_id: int
    timeout_s: int = 120

    def __post_init__(self) -> None:
        if self.num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {self.num_processes}")
        if not 0 <= self.process_id < self.num_processes:
            raise ValueError(f"process_id must be in [0, {self.num_processes}), got {self.process_id}")
        host, sep, port = self.coordinator.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"coordinator must be host:port, got {self.coordinator!r}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (for a loopback coordinator)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def initialize(cfg: DistributedConfig) -> None:
    """Joins the job: ``jax.distributed.initialize`` with CPU collectives over gloo (the CPU
    backend has none by default; GPU/TPU backends bring their own). Must run before any other JAX
    call of the process creates a backend. One process (``num_processes == 1``) starts nothing."""
    import jax

    if cfg.num_processes == 1:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=cfg.coordinator,
        num_processes=cfg.num_processes,
        process_id=cfg.process_id,
        initialization_timeout=cfg.timeout_s,
    )
    if jax.process_count() != cfg.num_processes:
        raise RuntimeError(f"jax.distributed started {jax.process_count()} processes, expected {cfg.num_processes}")


def shutdown() -> None:
    import jax

    if jax.process_count() > 1:
        jax.distributed.shutdown()


def process_share(n: int, process_id: int, num_processes: int) -> range:
    """Items ``[n * p // k, n * (p + 1) // k)`` for process ``p`` of ``k``: contiguous, in order,
    sizes differing by at most one."""
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id}")
    return range(n * process_id // num_processes, n * (process_id + 1) // num_processes)


def barrier(name: str, timeout_s: float = 3600.0) -> None:
    """Waits until every process reached the barrier of this ``name`` (a no-op in one process).

    A barrier of the ``jax.distributed`` coordination service, not a collective: a gloo collective
    gives up after about 30 s, and processes that ran uneven shares (or compiled different step
    variants) arrive minutes apart. Every collective of this module runs right after one."""
    import jax

    if jax.process_count() > 1:
        from jax._src import distributed as _distributed  # the coordination client jax.distributed started

        client = _distributed.global_state.client
        if client is None:
            raise RuntimeError("jax.distributed is not initialized")
        client.wait_at_barrier(f"radixflow:{name}", int(timeout_s * 1000))


def allgather_objects(obj: Any, name: str) -> list[Any]:
    """Every process's JSON-serialisable ``obj``, in process order, on every process: the JSON bytes
    travel as a padded uint8 array through ``process_allgather`` (a JAX collective over gloo on CPU).
    ``name`` identifies the exchange (each call of a job a different one)."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
    if jax.process_count() == 1:
        return [obj]
    barrier(f"allgather:{name}")
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], dtype=np.int64))).reshape(-1)
    padded = np.zeros(int(sizes.max()), dtype=np.uint8)
    padded[: data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(bytes(rows[i, : int(sizes[i])]).decode()) for i in range(len(sizes))]


def generate_across_processes(
    llm: Any, prompts: Sequence[Any], sampling_params: SamplingParams | Sequence[SamplingParams] | None = None
) -> list[RequestOutput]:
    """Data parallelism across processes: every process calls this with the same ``prompts``; each
    runs its :func:`process_share` on its own ``llm`` (an :class:`~radixflow_jax.llm.LLM`),
    and all outputs come back on every process in prompt order. ``request_id`` is the prompt's index."""
    import jax

    share = process_share(len(prompts), jax.process_index(), jax.process_count())
    params = sampling_params or SamplingParams()
    per = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
    if len(per) != len(prompts):
        raise ValueError(f"{len(per)} sampling params for {len(prompts)} prompts")
    mine = llm.generate([prompts[i] for i in share], [per[i] for i in share]) if len(share) else []
    records = [dataclasses.asdict(dataclasses.replace(o, request_id=i)) for i, o in zip(share, mine)]
    gathered = [RequestOutput(**r) for part in allgather_objects(records, f"generate:{len(prompts)}") for r in part]
    for o in gathered:  # JSON turned tuples into lists
        if o.logprobs is not None:
            o.logprobs = [tuple(x) for x in o.logprobs]  # type: ignore[misc]
    if len(gathered) != len(prompts):
        raise RuntimeError(f"gathered {len(gathered)} outputs for {len(prompts)} prompts")
    return gathered
