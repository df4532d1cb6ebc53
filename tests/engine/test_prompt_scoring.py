"""Prompt scoring (``prompt_logprobs``; ``echo`` with ``logprobs``) in one fixed-shape program
(``runner/scoring.py``): the same values as a cold full forward scored in float64 on the host (the
previous implementation), no compile for a prompt length never seen once warm-up is done, the
compile guard refusing a scorer that was not warmed, and the intake cap on a scored prompt's length.
tiny-qwen3.5 (attention and recurrent layers: the chunks carry KV and state), one fixed-bucket
step variant plus the scoring program."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from radixflow_jax import LLM, SamplingParams
from radixflow_jax.engine import intake
from radixflow_jax.engine.intake import RequestLimits
from radixflow_jax.engine.params import InvalidParameterError
from radixflow_jax.runner.scoring import CHUNK, PromptScorer
from radixflow_jax.runner.step import CompileAfterWarmupError
from tests.engine.workloads import SMALL_FIXED


@pytest.fixture(scope="module")
def llm(tiny_model) -> LLM:
    llm = LLM(tiny_model("tiny-qwen3.5"), **{**SMALL_FIXED, "warmup": True})
    llm.engine.executor.step.strict = True  # the compile guard: warm-up compiled the variant and the scorer
    return llm


def _cold_scores(llm: LLM, prompt: list[int], k: int) -> list:
    """The previous implementation: one cold forward of the prompt, log-softmax in float64, stable argsort."""
    logits = llm.model.logits(prompt).astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    out = [None]
    for i in range(1, len(prompt)):
        top = np.argsort(-logp[i - 1], kind="stable")[:k]
        out.append((float(logp[i - 1, prompt[i]]), top.tolist(), logp[i - 1, top].tolist()))
    return out


def _prompt(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 500, n)]


@pytest.mark.parametrize("length, k", [(1, 3), (2, 0), (CHUNK, 5), (2 * CHUNK + 45, 20)])
def test_scores_equal_a_cold_float64_forward(llm: LLM, length: int, k: int) -> None:
    prompt = _prompt(length, seed=length)
    got = llm.engine.executor.prompt_logprobs(prompt, k)
    want = _cold_scores(llm, prompt, k)
    assert len(got) == length and got[0] is None
    # float32 rounding of two matmul kernels, carried through the layers and the recurrent state:
    # the scorer's chunks of up to 128 tokens run the native few-row matmul on the CPU, the cold
    # forward of a longer prompt XLA's. On 2026-12-07 the 301-token prompt's scores were up to
    # 3.8e-4 apart (the 128-token one's, both native, 3.7e-6); at 100-128 rows XLA's dot was 1e-4
    # from a float64 one, the native one 2.7e-5. A wrong chunk state moves scores by far more.
    for g, w in zip(got[1:], want[1:]):
        assert g[1] == w[1]  # the same ids in the same order
        np.testing.assert_allclose(g[0], w[0], rtol=1e-6, atol=1e-3)
        np.testing.assert_allclose(g[2], w[2], rtol=1e-6, atol=1e-3)


def test_a_new_prompt_length_compiles_nothing_after_warmup(llm: LLM) -> None:
    executor = llm.engine.executor
    step, scorer = executor.step.num_compiles, executor.scorer.num_compiles
    backend: list[float] = []

    def count(event: str, duration: float, **_: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            backend.append(duration)

    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        for length in (37, CHUNK + 3, 301):  # lengths this process never scored
            out = llm.generate([_prompt(length, seed=7)], SamplingParams(max_tokens=2, prompt_logprobs=2))[0]
            assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == length
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert executor.step.num_compiles == step and executor.scorer.num_compiles == scorer
    assert backend == []  # nothing compiled at all (no hidden jit either)


def test_the_guard_refuses_a_scorer_not_warmed(llm: LLM) -> None:
    scorer = PromptScorer(llm.model, capacity=64, chunk=32)  # another program: not compiled yet
    with pytest.raises(CompileAfterWarmupError, match="not compiled at warm-up"):
        scorer.score([1, 2, 3], 1, strict=True)
    assert scorer.num_compiles == 0
    with pytest.raises(ValueError, match="1 to 64 tokens"):
        scorer.score(_prompt(65), 1)


def test_the_scoring_cap_is_checked_at_intake(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = RequestLimits(
        max_model_len=8192, pool_tokens=8192, penalty_window=0, logprobs=True, stop_strings=False,
        vocab_size=1000, prompt_logprobs=True, max_n=4,
    )
    assert limits.score_max_len == intake.MAX_SCORED_PROMPT
    limits.check(_prompt(intake.MAX_SCORED_PROMPT), SamplingParams(max_tokens=1, prompt_logprobs=1))
    limits.check(_prompt(intake.MAX_SCORED_PROMPT + 1), SamplingParams(max_tokens=1))  # not scored: no cap
    with pytest.raises(InvalidParameterError, match="at most 2048 tokens") as info:
        limits.check(_prompt(intake.MAX_SCORED_PROMPT + 1), SamplingParams(max_tokens=1, prompt_logprobs=0))
    assert info.value.field == "prompt_logprobs"
    monkeypatch.setattr(intake, "MAX_SCORED_PROMPT", 16)
    assert limits.score_max_len == 16
