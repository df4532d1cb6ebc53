"""Speculative decoding with a separate draft model (``engine/drafter.py``, ``method="draft"``):
greedy outputs equal plain decoding, with the cache on and off, whether the draft model is the
model itself (every drafted token accepted) or another model (almost none); the draft engine
answers a repeated ask from its kept drafts; a draft model whose vocabulary differs is refused
naming the option."""

from __future__ import annotations

import pytest

from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.llm import LLM
from radixflow_jax.reliability.audit import assert_drained, audit_engine
from radixflow_jax.scheduler.drafts import SpeculativeConfig
from tests.engine.test_speculative import PROMPTS

OPTIONS = dict(max_num_seqs=4, max_num_batched_tokens=128)


@pytest.mark.parametrize("draft_model", ["tiny-qwen3.5", "tiny-qwen3"])
def test_greedy_outputs_with_a_draft_model_equal_plain_decoding(draft_model: str, tiny_model) -> None:
    loaded = tiny_model("tiny-qwen3.5")
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (23, 30, 17, 23, 9)]
    cold = [tuple(o.token_ids) for o in LLM(loaded, **OPTIONS).generate(PROMPTS, params)]
    speculative = {"method": "draft", "draft_model": draft_model, "num_draft": 3}
    for policy in ("radixflow", "no-cache"):
        llm = LLM(loaded, speculative=speculative, policy=policy, **OPTIONS)
        engine = llm.replicas.engines[0]
        for _ in range(2):  # the second pass hits the cache the first one left
            assert [tuple(o.token_ids) for o in llm.generate(PROMPTS, params)] == cold
            audit_engine(engine)
        drafted = sum(r.drafted_tokens for r in engine.records)
        accepted = sum(r.accepted_tokens for r in engine.records)
        if draft_model == "tiny-qwen3.5":  # the model drafting for itself: its drafts are its own tokens
            assert accepted == drafted > 0
            assert len(engine.records) < sum(p.max_tokens for p in params)  # fewer rounds than tokens
        else:
            assert 0 < drafted and accepted < drafted
        assert engine.scheduler.drafter.drafts > 0
        assert_drained(engine)


def test_a_draft_model_needs_the_models_vocabulary(tiny_model) -> None:
    with pytest.raises(ValueError, match="draft_model 'smollm2-135m'"):
        LLM(tiny_model("tiny-qwen3.5"), speculative={"method": "draft", "draft_model": "smollm2-135m"}, **OPTIONS)
    with pytest.raises(ValueError, match="draft_model"):
        SpeculativeConfig(method="draft")
    with pytest.raises(ValueError, match="draft_model"):
        SpeculativeConfig(method="ngram", draft_model="tiny-qwen3")


def test_a_failing_draft_engine_never_fails_the_model(tiny_model, monkeypatch, caplog) -> None:
    """The draft engine raising in every run: each round goes on without drafts (logged), the
    draft engine keeps no request, and after three failures in a row drafting stops; the outputs
    are plain decoding's."""
    loaded = tiny_model("tiny-qwen3.5")
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    cold = [tuple(o.token_ids) for o in LLM(loaded, **OPTIONS).generate(PROMPTS, params)]
    llm = LLM(loaded, speculative={"method": "draft", "draft_model": "tiny-qwen3.5", "num_draft": 3}, **OPTIONS)
    drafter = llm.replicas.engines[0].scheduler.drafter

    def broken() -> None:
        raise RuntimeError("draft engine down")

    monkeypatch.setattr(drafter.core, "run_until_done", broken)
    assert [tuple(o.token_ids) for o in llm.generate(PROMPTS, params)] == cold
    assert drafter.disabled == "RuntimeError: draft engine down" and drafter.failures == 3
    assert not drafter.core.has_unfinished()
    assert sum(r.drafted_tokens for r in llm.replicas.engines[0].records) == 0
    assert "speculation stops" in caplog.text


def test_drafts_stop_before_ids_outside_the_vocabulary(tiny_model) -> None:
    llm = LLM(tiny_model("tiny-qwen3.5"), speculative={"method": "draft", "draft_model": "tiny-qwen3"}, **OPTIONS)
    drafter = llm.replicas.engines[0].scheduler.drafter
    assert drafter._valid([5, 511, 512, 7]) == (5, 511)  # a larger draft vocabulary's ids end the draft


def test_method_draft_needs_a_model_engine() -> None:
    from radixflow_jax.engine.build import assemble_engine
    from radixflow_jax.engine.config import EngineConfig
    from radixflow_jax.engine.spec import EngineSpec

    config = EngineConfig.from_options(max_num_seqs=2, max_num_batched_tokens=64, page_size=16,
                                       speculative={"method": "draft", "draft_model": "tiny-qwen3"})  # fmt: skip
    spec = EngineSpec(config=config, hybrid=True, chunk_sizes=(16,), num_pages=64, num_slots=8, max_model_len=256)
    with pytest.raises(ValueError, match="speculative method 'draft' needs a draft model's engine"):
        assemble_engine(spec, lambda shapes: None)
