"""``n`` / ``best_of`` siblings, ``logit_bias``, ``min_tokens`` and prompt logprobs through the engine
(``LLM.generate`` on tiny-qwen3.5, one fixed-bucket step variant), and the sibling helpers alone."""

from __future__ import annotations

import numpy as np
import pytest

from radixflow_jax import LLM, SamplingParams
from radixflow_jax.engine.params import RequestOutput
from radixflow_jax.engine.siblings import choose, expand
from tests.engine.workloads import SMALL_FIXED


@pytest.fixture(scope="module")
def llm(tiny_model) -> LLM:
    return LLM(tiny_model("tiny-qwen3.5"), **SMALL_FIXED)


def _prompt(llm: LLM, grids: int, extra: int = 1) -> list[int]:
    """``grids * G + extra`` tokens (``extra`` not a page multiple: the last page is partial)."""
    grid = llm.engine.spec.grid
    return [int(t) for t in np.random.default_rng(grids).integers(3, 500, grids * grid + extra)]


def _sampled(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, ignore_eos=True, **kw)


# ------------------------------------------------------------------------------ helpers alone
def _out(rid: int, lps: list[float]) -> RequestOutput:
    return RequestOutput(rid, (1,), [5] * len(lps), None, "length", 1, 0, 0.0, logprobs=[(lp, [5], [lp]) for lp in lps])


def test_expand_gives_seed_streams_and_choose_ranks():
    group = expand(SamplingParams(n=2, best_of=4, seed=10, temperature=1.0))
    assert [p.seed for p in group.members] == [10, 11, 12, 13]
    assert all(p.n == 1 and p.best_of is None and p.logprobs == 0 for p in group.members)  # for the ranking
    outs = [_out(0, [-1.0, -1.0]), _out(1, [-0.5]), _out(2, [-3.0]), _out(3, [-0.1, -0.3])]
    best = choose(group, outs)
    assert [o.request_id for o in best] == [3, 1] and [o.index for o in best] == [0, 1]
    assert all(o.logprobs is None for o in best)  # the caller did not ask for them
    plain = expand(SamplingParams(n=3))
    assert [p.seed for p in plain.members] == [None] * 3 and not plain.ranked
    assert [o.request_id for o in choose(plain, outs[:3])] == [0, 1, 2]
    assert SamplingParams(best_of=1) == SamplingParams()
    with pytest.raises(ValueError, match="best_of"):
        SamplingParams(n=3, best_of=2)


# ------------------------------------------------------------------------------ n and best_of
@pytest.mark.parametrize("extra", [37, 1])
def test_n_samples_share_the_prompt(llm: LLM, extra: int) -> None:
    prompt = _prompt(llm, 2, extra)
    llm.reset_prefix_cache()
    before = len(llm.engine.records)
    out = llm.generate([prompt], _sampled(8, n=4, seed=3))[0]
    rounds = llm.engine.records[before:]
    assert out.samples is not None and len(out.samples) == 4 and [s.index for s in out.samples] == [0, 1, 2, 3]
    assert len({tuple(s.token_ids) for s in out.samples}) == 4  # distinct samples
    # the prompt is computed once: three siblings ride the round that completes it and compute none of it
    assert sorted(s.cached_tokens for s in out.samples) == [0] + [len(prompt)] * 3
    assert sum(r.num_tokens for r in rounds) == len(prompt) + 4 * 7
    # sibling i draws from seed + i: the same tokens as a lone request with that seed, computed cold
    for seed, sample in ((3, out.samples[0]), (5, out.samples[2])):
        llm.reset_prefix_cache()
        assert llm.generate([prompt], _sampled(8, seed=seed))[0].token_ids == sample.token_ids


def test_best_of_returns_the_highest_cumulative_logprob(llm: LLM) -> None:
    prompt = _prompt(llm, 1)
    every = llm.generate([prompt], _sampled(6, n=4, seed=20, logprobs=0))[0].samples
    assert every is not None
    scores = [s.cumulative_logprob for s in every]
    best = llm.generate([prompt], _sampled(6, n=2, best_of=4, seed=20))[0]
    assert best.samples is not None and best.logprobs is None
    ranked = sorted(range(4), key=lambda i: -scores[i])[:2]
    assert [s.token_ids for s in best.samples] == [every[i].token_ids for i in ranked]


# ------------------------------------------------------------------------ logit_bias, min_tokens
def test_logit_bias_forces_and_forbids(llm: LLM) -> None:
    prompt = _prompt(llm, 1)
    greedy = llm.generate([prompt], SamplingParams(max_tokens=5, ignore_eos=True))[0].token_ids
    forced, banned, other = llm.generate([prompt] * 3, [
        SamplingParams(max_tokens=5, ignore_eos=True, logit_bias={77: 100.0}),
        SamplingParams(max_tokens=5, ignore_eos=True, logit_bias={greedy[0]: -100.0}),
        SamplingParams(max_tokens=5, ignore_eos=True),
    ])  # fmt: skip
    assert forced.token_ids == [77] * 5
    assert banned.token_ids[0] != greedy[0] and greedy[0] not in banned.token_ids
    assert other.token_ids == greedy  # a row without a bias in the same rounds is unchanged


def test_min_tokens_keeps_eos_out(llm: LLM) -> None:
    prompt = _prompt(llm, 1)
    eos = llm.engine.eos_token_ids[0]
    eager = SamplingParams(max_tokens=8, logit_bias={eos: 100.0})  # EOS would come first
    first, held = llm.generate([prompt] * 2, [eager, SamplingParams(max_tokens=8, logit_bias={eos: 100.0}, min_tokens=3)])
    assert first.token_ids == [eos] and first.finish_reason == "stop"
    assert len(held.token_ids) == 4 and eos not in held.token_ids[:3] and held.token_ids[3] == eos
    assert held.finish_reason == "stop"
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=2, min_tokens=3)


# ------------------------------------------------------------------------------ prompt logprobs
def test_prompt_logprobs_match_the_engines_own_logprobs(llm: LLM) -> None:
    prompt = _prompt(llm, 1)
    llm.generate([prompt], SamplingParams(max_tokens=1))  # the prompt is cached now
    scored = llm.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=3))[0]
    assert scored.cached_tokens > 0 and scored.prompt_logprobs is not None
    assert len(scored.prompt_logprobs) == len(prompt) and scored.prompt_logprobs[0] is None
    # position i's alternatives are what the engine's step computes when it samples after prompt[:i]
    cuts = [5, 17, len(prompt) - 1]
    steps = llm.generate([prompt[:i] for i in cuts], SamplingParams(max_tokens=1, logprobs=3))
    for i, step in zip(cuts, steps):
        lp, ids, lps = scored.prompt_logprobs[i]
        assert step.logprobs is not None and ids == step.logprobs[0][1]
        np.testing.assert_allclose(lps, step.logprobs[0][2], atol=2e-4)
        assert lp <= lps[0] + 1e-6
