"""End-to-end engine tests: the cache never changes greedy outputs (docs/design.md, "Lessons from other engines", last line).

The cache-off oracle runs in the fixed bucket mode (one step variant per engine shape, see
``tests/engine/workloads.py``) and one engine of it per preset serves every test of the module.
Cache-on engines run fixed buckets too. Fine buckets against a cache-off run are covered where
they cost no compile of their own: on the warm variants of tiny-qwen3.5 in
``tests/engine/test_compile_guard.py`` (also the grid checkpoints decode rows write in mixed and
decode-only rounds), mixed rounds of tiny-qwen3.5 and tiny-bamba against fixed-bucket runs in
``tests/runner/test_mixed_rounds.py``. Engines built on one loaded model share its compiled
variants, so an engine of a shape another built takes them."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from radixflow_jax import LLM, SamplingParams
from tests.engine.workloads import SMALL_FIXED, shared_prefix_prompts


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return shared_prefix_prompts(num_prefixes=2, per_prefix=4, prefix_len=150, suffix_len=10, vocab=500)


@pytest.fixture(scope="module")
def cold_llm(tiny_model) -> Callable[[str], LLM]:
    """``cold_llm(preset)``: the module's cache-off oracle engine of a preset (fixed buckets), built once."""
    engines: dict[str, LLM] = {}

    def get(model: str) -> LLM:
        if model not in engines:
            engines[model] = LLM(tiny_model(model), policy="no-cache", **SMALL_FIXED)
        return engines[model]

    return get


def _generate(model, prompts, **options) -> tuple[list[list[int]], list[int], LLM]:
    llm = LLM(model, **{**SMALL_FIXED, **options})
    outs = llm.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    return [o.token_ids for o in outs], [o.cached_tokens for o in outs], llm


def _cold(cold_llm, model: str, prompts) -> list[list[int]]:
    outs = cold_llm(model).generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    assert sum(o.cached_tokens for o in outs) == 0
    return [o.token_ids for o in outs]


@pytest.mark.parametrize("model", ["tiny-qwen3.5", "tiny-qwen3-next", "tiny-bamba", "tiny-nemotron-h", "tiny-qwen3"])
def test_cache_on_equals_cache_off(model: str, prompts, cold_llm) -> None:
    cold = _cold(cold_llm, model, prompts)
    warm, warm_cached, llm = _generate(cold_llm(model).model, prompts)
    assert warm == cold
    assert sum(warm_cached) > 0
    assert all(len(t) == 6 for t in warm)
    sched = llm.engine.scheduler
    sched.memory.flush()
    assert sched.memory.pages.num_used == 0
    assert sched.memory.slots is None or sched.memory.slots.num_used == 0


@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny-bamba"])
def test_riders_sample_what_cold_runs_sample(model: str, cold_llm) -> None:
    """Identical prompts ride the round that completes the first (``scheduler/riders.py``): each
    computes none of the prompt (a partial last page included) and its samples equal a cold run's
    with the same seed, on an attention-only model and a Mamba2 hybrid."""
    prompt = [int(t) for t in np.random.default_rng(5).integers(3, 500, 2 * 64 + 21)]
    params = [SamplingParams(max_tokens=6, ignore_eos=True, temperature=1.0, seed=seed) for seed in (11, 12, 13)]
    cold = [cold_llm(model).generate([prompt], p)[0].token_ids for p in params]
    llm = LLM(cold_llm(model).model, **SMALL_FIXED)
    before = len(llm.engine.records)
    outs = llm.generate([prompt] * 3, params)
    assert [o.token_ids for o in outs] == cold and len(set(map(tuple, cold))) >= 2  # seeds differ
    assert [o.cached_tokens for o in outs] == [0, len(prompt), len(prompt)]
    assert sum(r.num_tokens for r in llm.engine.records[before:]) == len(prompt) + 3 * 5


@pytest.mark.parametrize("policy", ["native", "radixflow"])
def test_waves_and_policies_agree(policy: str, prompts, cold_llm) -> None:
    reference = _cold(cold_llm, "tiny-qwen3.5", prompts)
    llm = LLM(cold_llm("tiny-qwen3.5").model, policy=policy, **SMALL_FIXED)
    first = llm.generate(prompts[:3], SamplingParams(max_tokens=6, ignore_eos=True))
    second = llm.generate(prompts[3:], SamplingParams(max_tokens=6, ignore_eos=True))
    assert [o.token_ids for o in first + second] == reference
    assert sum(o.cached_tokens for o in second) > 0


def test_engines_on_one_model_share_its_compiled_variants(prompts, cold_llm) -> None:
    """A second engine of the same shape on a loaded model takes the step variants the first one
    compiled (``LoadedModel.compiled_variants``) instead of tracing and compiling them again, with
    the same outputs; an engine of another shape (fewer rows) or another kernel backend (the
    pure-jnp references) runs its own executable."""
    cold = cold_llm("tiny-qwen3.5")
    reference = _cold(cold_llm, "tiny-qwen3.5", prompts)
    (variant, first), = cold.engine.executor.step._compiled.items()  # fixed buckets: one variant
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    again = LLM(cold.model, policy="no-cache", **SMALL_FIXED)
    assert [o.token_ids for o in again.generate(prompts, params)] == reference
    assert again.engine.executor.step.num_compiles == 0
    assert again.engine.executor.step._compiled[variant] is first
    narrow = LLM(cold.model, policy="no-cache", **{**SMALL_FIXED, "max_num_seqs": 2})
    assert [o.token_ids for o in narrow.generate(prompts, params)] == reference
    assert first not in narrow.engine.executor.step._compiled.values()
    oracle = LLM(cold.model, policy="no-cache", kernels="reference", **SMALL_FIXED)
    assert [o.token_ids for o in oracle.generate(prompts[:2], params)] == reference[:2]
    assert oracle.engine.executor.step._compiled[variant] is not first


def test_outputs_independent_of_budget_and_page_size(prompts, cold_llm) -> None:
    model = cold_llm("tiny-qwen3.5").model
    base, _, _ = _generate(model, prompts[:4])
    for options in (dict(max_num_batched_tokens=64), dict(page_size=32), dict(max_num_seqs=2)):
        got, _, _ = _generate(model, prompts[:4], **options)  # fixed buckets: one variant per shape
        assert got == base, options


CONVERSATIONS = [("tiny-qwen3.5", p) for p in ("native", "radixflow", "pair")] + [
    (m, "pair") for m in ("tiny-qwen3-next", "tiny-bamba", "tiny-nemotron-h", "tiny-qwen3")
]


@pytest.mark.parametrize(("model", "policy"), CONVERSATIONS)
def test_conversations_resume_at_the_exact_end_of_each_turn(model: str, policy: str, cold_llm) -> None:
    """Two conversations, three turns each, every turn resending the history (prompt, answer, a new
    message): outputs equal cold runs, and each later turn starts at the exact end of the turn
    before (docs/design.md, "Exact depth"): every token its state consumed, the prompt and the
    answer but its last token, or that one too when the round in flight fed it (overlap) before
    the stop token ended the request. On hybrids the ends leave the request band of the slot pool
    by state copies on the device (``runner/pagecopy.StateCopier``) before the next turns read them."""
    cold = cold_llm(model)
    llm = LLM(cold.model, policy=policy, **SMALL_FIXED)
    copies: list[tuple[int, int]] = []
    executor = llm.engine.executor
    copier = executor.state_copier
    executor.state_copier = lambda cache, pairs: (copies.extend(pairs), copier(cache, pairs))[1]
    rng = np.random.default_rng(7)
    histories = [[int(t) for t in rng.integers(3, 500, n)] for n in (141, 77)]
    stop = [int(cold.generate([h], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids[-1]) for h in histories]
    ends: list[tuple[int, int] | None] = [None, None]
    for turn in range(3):
        params = [SamplingParams(max_tokens=8, stop_token_ids=[s] if turn == 0 else []) for s in stop]
        outs = llm.generate(histories, params)
        refs = cold.generate(histories, params)
        assert [o.token_ids for o in outs] == [r.token_ids for r in refs]
        for i, out in enumerate(outs):
            if ends[i] is not None:
                assert ends[i][0] <= out.cached_tokens <= ends[i][1], (turn, i, out.cached_tokens, ends[i])
            fed = len(histories[i]) + len(out.token_ids)
            ends[i] = (fed - 1, fed if out.finish_reason == "stop" else fed - 1)
            histories[i] = histories[i] + out.token_ids + [int(t) for t in rng.integers(3, 500, 5 + 17 * turn)]
    sched = llm.engine.scheduler
    assert (len(copies) >= 2) == (sched.memory.slots is not None)  # every turn but the last moved its end
    sched.memory.flush()
    assert sched.memory.pages.num_used == 0
    assert sched.memory.slots is None or sched.memory.slots.num_used == 0


def test_reused_state_slot_starts_from_zero(cold_llm) -> None:
    """A cold prefill must not inherit the state an earlier request left in its slot."""
    llm = LLM(cold_llm("tiny-qwen3-next").model, policy="no-cache", **{**SMALL_FIXED, "max_num_seqs": 1})
    prompt = list(range(40, 200))
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    first = llm.generate([prompt], params)[0].token_ids
    second = llm.generate([prompt], params)[0].token_ids
    assert first == second


def test_preemption_recomputes_to_the_same_outputs(cold_llm) -> None:
    prompts = [list(range(10 + 50 * i, 130 + 50 * i)) for i in range(4)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    roomy = cold_llm("tiny-qwen3.5").generate(prompts, params)  # room for all four (and no cache)
    tight_llm = LLM(cold_llm("tiny-qwen3.5").model, num_kv_pages=18, **{**SMALL_FIXED, "max_model_len": 256})
    tight = tight_llm.generate(prompts, params)
    assert sum(r.preempted for r in tight_llm.engine.records) > 0
    assert [o.token_ids for o in tight] == [o.token_ids for o in roomy]
