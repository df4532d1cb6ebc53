"""Shared pieces of the reliability scenarios: small engines over the shadow executor (every read
checked), seeded prompts, the cold reference and the checks every scenario ends with."""

from __future__ import annotations

import random

from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.reliability.faults import Fault
from radixflow_jax.reliability.harness import Harness, HarnessReport, shadow_engine, shadow_of
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.reliability.soak import cold_tokens
from radixflow_jax.scheduler.admission import POLICIES

# every policy that caches, `pair` included (the shadow device runs a paired consumer after the
# unpaired rows of its round and checks it starts from its producer's in-round emit)
CACHING_POLICIES = [name for name, policy in POLICIES.items() if policy.use_cache]
BASE = EngineConfig.from_options(
    max_num_seqs=4, max_num_batched_tokens=32, page_size=8, max_model_len=256, warmup=False
)
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


def engine(policy: str, *, num_pages: int = 80, num_slots: int = 16, faults: tuple[Fault, ...] = (),
           fail_reset: bool = False, **options: object) -> EngineCore:  # fmt: skip
    config = BASE.with_options(policy=policy, **options)
    return shadow_engine(config, num_pages=num_pages, num_slots=num_slots, max_model_len=BASE.max_model_len,
                         faults=faults, fail_reset=fail_reset)  # fmt: skip


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 900) for _ in range(n)]


def cold_outputs(prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    """The same prompts through an engine without a prefix cache and with roomy pools."""
    core = engine("no-cache", num_pages=400, num_slots=40)
    h = Harness(core)
    for p, sp in zip(prompts, params):
        h.submit(p, sp)
    report = h.run()
    assert report.by_reason()["length"] + report.by_reason()["stop"] == len(prompts)
    outputs = [report.outputs[i].token_ids for i in range(len(prompts))]
    # the soak's reference (the shadow model applied to the prompt) is what a cache-off run computes
    assert outputs == [cold_tokens(p, sp.max_tokens, 1000) for p, sp in zip(prompts, params)]
    return outputs


def check_run(h: Harness, report: HarnessReport, cold: list[list[int]]) -> None:
    """Every accepted request ended (stop/length/abort/error with a message: the harness checks
    that), nothing leaked (``Harness.run`` drained and flushed), no read went wrong, and every
    completed greedy output equals the cold run."""
    assert not report.refused, report.refused
    assert set(report.outputs) == set(range(len(h.subs)))
    assert shadow_of(h.core).violations == [] and h.violations == []
    for key, out in report.completed().items():
        assert out == cold[key], f"request {key}: {out} != cold {cold[key]}"
        assert len(out) == h.subs[key].params.max_tokens
    mem = h.core.scheduler.memory
    assert mem.pages.num_used == 0 and (mem.slots is None or mem.slots.num_used == 0)
