"""The offline API: ``LLM(model, ...).generate(prompts, sampling_params) -> list[RequestOutput]``.

Builds the model, sizes the pools, and runs the engine loop until all given prompts finished;
outputs come back in prompt order. Step variants compile lazily by default (the first round that
needs one compiles and primes it, through the persistent XLA cache when ``compilation_cache_dir``
is set), so start-up costs only the variants a workload uses; ``warmup=True`` compiles and runs
every variant of the bucket set up front, with progress on stderr.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from radixflow_jax.engine.build import build_engine
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.params import RequestOutput, SamplingParams
from radixflow_jax.engine.siblings import choose, expand, is_group
from radixflow_jax.models.api import LoadedModel
from radixflow_jax.models.batch import state_bytes_per_slot
from radixflow_jax.replicas.placement import replica_models


class LLM:
    """Offline generation. ``model``: a preset name, a HF directory or a converted directory.
    ``tensor_parallel_size`` N > 1: parameters and pools sharded over N devices
    (``models/sharding.py``); a model whose heads N does not divide is refused naming the field.
    ``data_parallel_size`` M > 1: M engine replicas (each its own scheduler, cache and pools) behind
    a ``router`` (``replicas/router.py``); replica i runs on local devices ``[i*N, (i+1)*N)`` (its own
    copy of the parameters, sharded over its group) when the process has ``M*N`` devices; with fewer
    and N == 1, the replicas share the model's one device (one copy); otherwise it is refused."""

    def __init__(
        self,
        model: str | LoadedModel,
        *,
        dtype: str = "float32",
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        router: str = "prefix",
        **engine_options: object,
    ):
        from radixflow_jax.replicas.router import ReplicaSet, RouterConfig

        self.config = EngineConfig.from_options(**engine_options)
        router_config = RouterConfig(policy=router, block=self.config.scheduler.page_size)
        mtp = self.config.scheduler.mtp_drafts  # the model's MTP layers draft: load them
        self.replica_models = replica_models(model, dtype, tensor_parallel_size, data_parallel_size, mtp=mtp)
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
        """Runs every prompt to completion; a bad prompt raises before anything is queued. A prompt
        whose params ask for ``n > 1`` samples (or ``best_of`` candidates) runs them as siblings
        sharing the prompt's cache; its output is the first (best) sample, with all ``n`` of them in
        ``samples``."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            raise TypeError("prompts must be a list of strings or a list of token-id lists")
        params = sampling_params or SamplingParams()
        per = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(per) != len(prompts):
            raise ValueError(f"{len(per)} sampling params for {len(prompts)} prompts")
        encoded = [self._ids(p) for p in prompts]
        checked = [self.engine.check(ids, p) for ids, p in zip(encoded, per)]  # every one before queueing any
        groups = [self.replicas.add_group(c) for c in checked]
        while self.replicas.has_unfinished():
            self.replicas.step()
        outputs = []
        for c, rids in zip(checked, groups):
            samples = [self.replicas.output(r) for r in rids]
            if is_group(c.params):
                chosen = choose(expand(c.params), samples)
                samples = [dataclasses.replace(chosen[0], samples=chosen)]
            outputs.append(samples[0])
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
