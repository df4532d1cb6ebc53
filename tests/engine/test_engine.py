"""End-to-end engine tests: the cache never changes greedy outputs (DESIGN.md section 9's last line)."""

from __future__ import annotations

import pytest

from radixflow_jax import LLM, SamplingParams
from tests.engine.workloads import shared_prefix_prompts

SMALL = dict(max_num_seqs=4, max_num_batched_tokens=128, page_size=16, max_model_len=1024, warmup=False)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return shared_prefix_prompts(num_prefixes=2, per_prefix=4, prefix_len=150, suffix_len=10, vocab=500)


def _generate(model: str, prompts, **options) -> tuple[list[list[int]], list[int], LLM]:
    llm = LLM(model, **{**SMALL, **options})
    outs = llm.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    return [o.token_ids for o in outs], [o.cached_tokens for o in outs], llm


@pytest.mark.parametrize("model", ["tiny-qwen3.5", "tiny-qwen3-next", "tiny-bamba", "tiny-nemotron-h", "tiny-qwen3"])
def test_cache_on_equals_cache_off(model: str, prompts) -> None:
    cold, cold_cached, _ = _generate(model, prompts, enable_prefix_cache=False)
    warm, warm_cached, llm = _generate(model, prompts)
    assert warm == cold
    assert sum(cold_cached) == 0
    assert sum(warm_cached) > 0
    assert all(len(t) == 6 for t in warm)
    sched = llm.engine.scheduler
    sched.memory.flush()
    assert sched.memory.pages.num_used == 0
    assert sched.memory.slots is None or sched.memory.slots.num_used == 0


@pytest.mark.parametrize("policy", ["native", "radixflow"])
def test_waves_and_policies_agree(policy: str, prompts) -> None:
    llm = LLM("tiny-qwen3.5", policy=policy, **SMALL)
    reference, _, _ = _generate("tiny-qwen3.5", prompts, enable_prefix_cache=False)
    first = llm.generate(prompts[:3], SamplingParams(max_tokens=6, ignore_eos=True))
    second = llm.generate(prompts[3:], SamplingParams(max_tokens=6, ignore_eos=True))
    assert [o.token_ids for o in first + second] == reference
    assert sum(o.cached_tokens for o in second) > 0


def test_outputs_independent_of_budget_and_page_size(prompts) -> None:
    base, _, _ = _generate("tiny-qwen3.5", prompts[:4])
    for options in (dict(max_num_batched_tokens=64), dict(page_size=32), dict(max_num_seqs=2)):
        got, _, _ = _generate("tiny-qwen3.5", prompts[:4], **options)
        assert got == base, options


def test_multi_turn_reuses_previous_turn() -> None:
    llm = LLM("tiny-qwen3.5", **SMALL)
    cold = LLM("tiny-qwen3.5", enable_prefix_cache=False, **SMALL)
    history = list(range(10, 150))
    for turn in range(3):
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        out = llm.generate([history], params)[0]
        ref = cold.generate([history], params)[0]
        assert out.token_ids == ref.token_ids
        if turn:
            assert out.cached_tokens >= 128
        history = history + out.token_ids + list(range(200, 220))


def test_reused_state_slot_starts_from_zero() -> None:
    """A cold prefill must not inherit the state an earlier request left in its slot."""
    llm = LLM("tiny-qwen3-next", enable_prefix_cache=False, **{**SMALL, "max_num_seqs": 1})
    prompt = list(range(40, 200))
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    first = llm.generate([prompt], params)[0].token_ids
    second = llm.generate([prompt], params)[0].token_ids
    assert first == second


def test_preemption_recomputes_to_the_same_outputs() -> None:
    prompts = [list(range(10 + 50 * i, 130 + 50 * i)) for i in range(4)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    small = {**SMALL, "max_model_len": 256}
    roomy = LLM("tiny-qwen3.5", **small).generate(prompts, params)
    tight_llm = LLM("tiny-qwen3.5", num_kv_pages=18, **small)
    tight = tight_llm.generate(prompts, params)
    assert sum(r.preempted for r in tight_llm.engine.records) > 0
    assert [o.token_ids for o in tight] == [o.token_ids for o in roomy]


def test_final_token_checkpoint_is_the_cold_state() -> None:
    """A final-token checkpoint (written by a decode row, in a mixed round and in a decode-only
    round) is the state a cold run computes at its depth: the next turn reads it and its greedy
    output equals the cache-off run."""
    warm = LLM("tiny-qwen3.5", **SMALL)  # grid 64: prompt end 64, final-token checkpoint at 128
    cold = LLM("tiny-qwen3.5", enable_prefix_cache=False, **SMALL)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    first, alone = list(range(20, 140)), list(range(220, 340))
    long_prefill = [3 + (7 * i) % 500 for i in range(900)]  # still prefilling (64-token spans) while `first` decodes
    outs = warm.generate([first, long_prefill], params)
    out_alone = warm.generate([alone], params)[0]
    for turn1, out in ((first, outs[0]), (alone, out_alone)):
        nxt = turn1 + out.token_ids + [7, 8, 9, 10, 11]
        got = warm.generate([nxt], SamplingParams(max_tokens=4, ignore_eos=True))[0]
        ref = cold.generate([nxt], SamplingParams(max_tokens=4, ignore_eos=True))[0]
        assert got.cached_tokens == 128  # the final-token checkpoint, beyond the prompt-end one
        assert got.token_ids == ref.token_ids
