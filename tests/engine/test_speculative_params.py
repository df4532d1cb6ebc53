"""Speculative decoding for requests with penalties, ``logit_bias``, ``min_tokens``, logprobs and
structured outputs (``runner/verify.py``): each verify point samples as a round without drafts
would at its position, so the outputs equal plain decoding's token for token, the logprobs are
those of each committed token, and a drafted token the grammar forbids is rejected at its point.

Drafts come from the same oracle as ``test_speculative.py`` (the plain run's continuation, one
token altered on a fixed pattern), so every request verifies accepted and rejected drafts.
"""

from __future__ import annotations

import numpy as np
import pytest

from radixflow_jax.engine.grammar import StructuredOutputsParams
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.llm import LLM
from radixflow_jax.reliability.audit import assert_drained, audit_engine
from radixflow_jax.scheduler import running
from radixflow_jax.bench.oracle import oracle_drafter
from tests.engine.test_speculative import PROMPTS

OPTIONS = dict(max_num_seqs=4, max_num_batched_tokens=128)


def _params(first_tokens: list[int]) -> list[SamplingParams]:
    """One request of each kind; ``first_tokens``: a token each prompt's plain greedy answer has
    early, which ``min_tokens`` keeps from ending the request before its 9th token."""
    return [
        SamplingParams(max_tokens=24, ignore_eos=True, logit_bias={first_tokens[0]: 4.0, 7: -100.0}),
        SamplingParams(max_tokens=24, ignore_eos=True, min_tokens=9, stop_token_ids=(first_tokens[1],)),
        SamplingParams(max_tokens=24, ignore_eos=True, presence_penalty=0.6, frequency_penalty=0.9,
                       repetition_penalty=1.4),  # fmt: skip
        SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.7, seed=5, logprobs=3),
        SamplingParams(max_tokens=24, ignore_eos=True, logprobs=2, structured_outputs={"regex": r"[a-f]{3,12}!"}),
    ]


def _outputs(llm: LLM, params: list[SamplingParams]):
    outputs = llm.generate(PROMPTS, params)
    audit_engine(llm.replicas.engines[0])
    return outputs


@pytest.mark.parametrize("model", ["tiny-qwen3.5", "tiny-qwen3"])
def test_outputs_and_logprobs_with_drafts_equal_plain_decoding(model: str, monkeypatch, tiny_model) -> None:
    loaded = tiny_model(model)
    plain = LLM(loaded, **OPTIONS)
    greedy = plain.generate(PROMPTS, SamplingParams(max_tokens=4, ignore_eos=True))
    params = _params([o.token_ids[2] for o in greedy])
    cold = _outputs(plain, params)
    assert cold[4].text.endswith("!") and cold[4].finish_reason == "stop"  # the grammar completed
    vocab = plain.replicas.engines[0].vocab_size
    full = [tuple(p) + tuple(o.token_ids) for p, o in zip(PROMPTS, cold)]
    monkeypatch.setattr(running, "ngram_draft", oracle_drafter(full, vocab))
    policies = ("pair", "no-cache") if model == "tiny-qwen3.5" else ("pair",)
    for policy in policies:
        llm = LLM(loaded, speculative={"num_draft": 3}, policy=policy, **OPTIONS)
        engine = llm.replicas.engines[0]
        for _ in range(2):  # the second pass hits the cache the first one left
            outs = _outputs(llm, params)
            for got, want in zip(outs, cold):
                assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
            for i in (3, 4):  # one entry per committed token, equal to plain decoding's
                assert len(outs[i].logprobs) == len(outs[i].token_ids)
                got_lp = np.array([lp[0] for lp in outs[i].logprobs])
                want_lp = np.array([lp[0] for lp in cold[i].logprobs])
                np.testing.assert_allclose(got_lp, want_lp, rtol=0, atol=2e-4)
                assert [lp[1][0] for lp in outs[i].logprobs] == [lp[1][0] for lp in cold[i].logprobs]
        drafted = sum(r.drafted_tokens for r in engine.records)
        accepted = sum(r.accepted_tokens for r in engine.records)
        assert 0 < accepted < drafted
        assert_drained(engine)


def test_draft_masks_follow_the_draft_and_leave_the_matcher(tiny_model) -> None:
    """``GrammarState.draft_masks``: point ``j``'s mask is the matcher's after ``draft[:j]``, the
    row's after the whole draft; from a forbidden drafted token on, all ones; the matcher's own
    state (its next mask) is unchanged."""
    llm = LLM(tiny_model("tiny-qwen3.5"), **OPTIONS)
    engine = llm.replicas.engines[0]
    a, b, c, x = (engine.tokenizer.encode(ch)[0] for ch in "abcx")
    state = engine._grammars.open(StructuredOutputsParams(regex="ab+c"))
    words = -(-engine.vocab_size // 32)

    def allowed(mask: np.ndarray) -> set[int]:
        bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[: engine.vocab_size]
        return set(np.flatnonzero(bits).tolist())

    before = np.zeros(words, np.int32)
    state.mask_into(before)
    points, after = np.zeros((3, words), np.int32), np.zeros(words, np.int32)
    state.draft_masks([a, b, b], points, after)
    assert a in allowed(points[0]) and b not in allowed(points[0])
    assert b in allowed(points[1]) and c not in allowed(points[1])
    assert {b, c} <= allowed(points[2]) and {b, c} <= allowed(after) and a not in allowed(after)
    points[:], after[:] = 0, 0
    state.draft_masks([a, x, b], points, after)  # x is forbidden after "a"
    assert b in allowed(points[1]) and x not in allowed(points[1])
    assert (points[2] == -1).all() and (after == -1).all()
    again = np.zeros(words, np.int32)
    state.mask_into(again)
    np.testing.assert_array_equal(again, before)
