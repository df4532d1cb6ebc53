"""Speculative method ``mtp``: the model's own MTP layer drafts one token a round inside the step
(``runner/mtpstep.py``). Every draft equals the teacher-forced guess of the MTP reference
(``LoadedModel.mtp_logits``, itself checked against transformers' modules in
``tests/models/test_mtp.py``) on the final sequence, prompts split into chunks included; greedy
outputs equal plain decoding, with the prefix cache on and off; what cannot draft is refused.

The tiny presets' MTP layers are random, so their guesses are rarely accepted; a bigram model
whose MTP layer guesses what the trunk will (``bench/mtpmodels.bigram_mtp``) has every draft
accepted. The roll-back of a hybrid's state is the verify path's, tested with every drafter in
``test_speculative.py``."""

from __future__ import annotations

import numpy as np
import pytest

from radixflow_jax.bench.mtpmodels import bigram_mtp
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.llm import LLM
from radixflow_jax.models import api
from radixflow_jax.models.safetensors_io import WeightsError
from radixflow_jax.reliability.audit import assert_drained, audit_engine
from radixflow_jax.scheduler.drafts import MtpDrafts, SpeculativeConfig

# 64-token rounds: the 100-token prompts run in two chunks, so a chunk's last slot pairs with the
# next chunk's first token (RowPlan.next_token)
OPTIONS = dict(max_num_seqs=4, max_num_batched_tokens=64, bucket_mode="fixed", warmup=False)
PARAMS = SamplingParams(max_tokens=10, ignore_eos=True)


def _prompts(n: int = 3, length: int = 100) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [[int(t) for t in rng.integers(3, 500, length)] for _ in range(n)]


def _recorded(llm: LLM) -> list[tuple[tuple[int, ...], int]]:
    """Every draft the engine's MTP drafter was offered: (the request's tokens, the guess after them)."""
    drafter = llm.replicas.engines[0].scheduler.drafter
    assert isinstance(drafter, MtpDrafts)
    seen: list[tuple[tuple[int, ...], int]] = []
    offer = drafter.offer

    engine = llm.replicas.engines[0]

    def spy(rounds):  # (token count, last tokens, draft): the request's tokens are found by the count
        for count, tail, draft in rounds:
            req = next(r for r in engine.scheduler.requests.values() if r.num_tokens == count and
                       tuple(r.tokens[-len(tail):]) == tuple(tail))  # fmt: skip
            seen.append((tuple(req.tokens), draft))
        offer(rounds)

    drafter.offer = spy
    return seen


@pytest.fixture(scope="module")
def mtp_model():
    """``mtp_model(preset)``: the preset loaded with its MTP layer, once per module, so this module's
    engines share its compiled step variants (``LoadedModel.compiled_variants``)."""
    models: dict[str, api.LoadedModel] = {}

    def get(preset: str) -> api.LoadedModel:
        if preset not in models:
            models[preset] = api.load(preset, mtp=True)
        return models[preset]

    return get


@pytest.mark.parametrize("preset", ["tiny-qwen3.5", "tiny-qwen3-next"])
def test_mtp_drafts_are_the_teacher_forced_guesses(preset: str, tiny_model, mtp_model) -> None:
    prompts = _prompts()
    # a sampled request too (hot enough that it leaves the greedy path on the presets' sharp logits): its
    # draft must follow the token it sampled, not the greedy one
    params = [SamplingParams(max_tokens=10, ignore_eos=True, temperature=4.0, seed=5), PARAMS, PARAMS]
    plain = [o.token_ids for o in LLM(tiny_model(preset), policy="no-cache", **OPTIONS).generate(prompts, params)]
    llm = LLM(mtp_model(preset), policy="no-cache", speculative="mtp", **OPTIONS)
    seen = _recorded(llm)
    outs = [o.token_ids for o in llm.generate(prompts, params)]
    assert outs == plain
    records = llm.replicas.engines[0].records
    assert sum(r.verify_rows for r in records) > 0 and sum(r.drafted_tokens for r in records) > 0
    reference = mtp_model(preset)
    finals = [tuple(p) + tuple(o) for p, o in zip(prompts, outs)]
    checked = 0
    for tokens, draft in seen:
        final = next(f for f in finals if f[: len(tokens)] == tokens)
        guesses = reference.mtp_logits(list(final[: len(tokens)]))  # row t guesses token t + 2
        last = guesses[len(tokens) - 2]
        # the step's guess is the reference's, up to float rounding between a batched and a lone call
        assert last[draft] >= last.max() - 1e-4 * max(1.0, float(np.abs(last).max())), (len(tokens), draft)
        checked += 1
    assert checked >= len(prompts) * (PARAMS.max_tokens - 1)


def test_mtp_drafts_keep_outputs_with_the_prefix_cache_on(tiny_model, mtp_model) -> None:
    shared = _prompts(1, 80)[0]
    prompts = [shared + [7 + i, 9, 11] for i in range(4)] + [shared + [7, 9, 11]]  # a hit, a rider twin
    params = [PARAMS, PARAMS, SamplingParams(max_tokens=8, temperature=0.8, seed=3), PARAMS, PARAMS]
    cold_llm = LLM(tiny_model("tiny-qwen3.5"), policy="no-cache", **OPTIONS)
    cold = [o.token_ids for o in cold_llm.generate(prompts, params)]
    for policy in ("native", "radixflow", "pair"):
        llm = LLM(mtp_model("tiny-qwen3.5"), policy=policy, speculative="mtp", **OPTIONS)
        assert [o.token_ids for o in llm.generate(prompts, params)] == cold, policy
        engine = llm.replicas.engines[0]
        audit_engine(engine)
        assert_drained(engine)


def test_accepted_mtp_drafts_draft_from_the_last_accepted_token() -> None:
    """On the bigram model every MTP draft is accepted: each verify row keeps its drafted token and
    the next draft comes from the slot after it; outputs equal plain decoding in fewer rounds."""
    model = bigram_mtp(api.load("tiny-qwen3.5", mtp=True))
    prompts = _prompts(2, 40)
    plain_llm = LLM(model, policy="no-cache", **OPTIONS)
    plain = [o.token_ids for o in plain_llm.generate(prompts, PARAMS)]
    llm = LLM(model, policy="radixflow", speculative="mtp", **OPTIONS)
    outs = [o.token_ids for o in llm.generate(prompts, PARAMS)]
    assert outs == plain
    records = llm.replicas.engines[0].records
    drafted, accepted = sum(r.drafted_tokens for r in records), sum(r.accepted_tokens for r in records)
    assert drafted > 0 and accepted == drafted, (drafted, accepted)
    assert len(records) < len(plain_llm.replicas.engines[0].records)


def test_what_cannot_draft_with_mtp_is_refused(tiny_model) -> None:
    with pytest.raises(ValueError, match="MTP layers"):
        LLM(tiny_model("tiny-qwen3.5"), speculative="mtp", **OPTIONS)  # loaded without them
    with pytest.raises(WeightsError, match="no MTP layers"):
        LLM("tiny-bamba", speculative="mtp", **OPTIONS)
    with pytest.raises(ValueError, match="one token a round"):
        SpeculativeConfig(method="mtp", num_draft=2)
    assert SpeculativeConfig(method="mtp").num_draft == 1 and SpeculativeConfig().num_draft == 4


def test_mtp_drafts_answer_only_the_tokens_they_follow() -> None:
    drafts = MtpDrafts(keep=2)
    drafts.offer([(3, [1, 2, 3], 9), (2, [4, 5], 8)])
    assert drafts([1, 2, 3], 4) == (9,) and drafts([4, 5], 1) == (8,)
    assert drafts([1, 2, 3, 9], 1) == () and drafts([1, 2, 3], 0) == ()
    drafts.offer([(1, [6], 7)])  # the oldest goes first
    assert drafts([1, 2, 3], 1) == () and drafts([6], 1) == (7,)
