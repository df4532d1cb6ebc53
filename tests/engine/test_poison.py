"""Poison requests (issue #43): every value that reaches a fixed-width step input is range-checked
at intake (``SamplingParams`` for what needs no engine facts, ``engine/intake.py`` for the
vocabulary), as an ``InvalidParameterError`` naming the field; a request whose sampling row still
cannot be built fails alone when it is queued, in no round: no failed round is counted, no pool is
rebuilt, the cache is not flushed and its neighbours' outputs are the ones they have alone."""

from __future__ import annotations

import pytest

from radixflow_jax import LLM
from radixflow_jax.engine import record
from radixflow_jax.engine.intake import CheckedRequest, RequestLimits
from radixflow_jax.engine.params import INT32_MAX, InvalidParameterError, SamplingParams
from radixflow_jax.replicas.background import BackgroundEngine, RequestFailedError
from radixflow_jax.runner.inputs import SamplingRow, check_row
from tests.engine.workloads import SMALL_FIXED

PROMPT = list(range(30, 62))
OTHER = list(range(100, 120))
BIG = 10**10


# ------------------------------------------------------------------------ ranges (no engine)
@pytest.mark.parametrize(
    "field,kwargs",
    [
        ("top_k", {"top_k": BIG}),
        ("top_k", {"top_k": INT32_MAX + 1}),
        ("top_k", {"top_k": -2}),
        ("stop_token_ids", {"stop_token_ids": [BIG]}),
        ("stop_token_ids", {"stop_token_ids": [-1]}),
        ("stop_token_ids", {"stop_token_ids": [1, None]}),
        ("logit_bias", {"logit_bias": {str(10**12): 1}}),
        ("logit_bias", {"logit_bias": {INT32_MAX + 1: 1}}),
        ("logit_bias", {"logit_bias": {5: float("nan")}}),
        ("seed", {"seed": 2**64}),
        ("seed", {"seed": -(2**63) - 1}),
        ("seed", {"seed": 2**64 - 1, "n": 2}),  # sibling 1 would run seed + 1
        ("max_tokens", {"max_tokens": INT32_MAX + 1}),
        ("max_tokens", {"max_tokens": 0}),
        ("min_tokens", {"min_tokens": 17}),
        ("temperature", {"temperature": float("nan")}),
        ("temperature", {"temperature": float("inf")}),
        ("top_p", {"top_p": float("nan")}),
        ("min_p", {"min_p": 1.5}),
        ("presence_penalty", {"presence_penalty": float("inf")}),
        ("frequency_penalty", {"frequency_penalty": float("nan")}),
        ("repetition_penalty", {"repetition_penalty": float("inf")}),
        ("logprobs", {"logprobs": 21}),
        ("prompt_logprobs", {"prompt_logprobs": -1}),
        ("n", {"n": 0}),
        ("best_of", {"n": 2, "best_of": INT32_MAX + 1}),
    ],
)
def test_each_range_is_checked_and_names_its_field(field: str, kwargs: dict) -> None:
    with pytest.raises(InvalidParameterError) as info:
        SamplingParams(**kwargs)
    assert info.value.field == field and str(info.value).startswith(field)
    assert isinstance(info.value, ValueError)


def test_edge_values_are_accepted() -> None:
    p = SamplingParams(top_k=INT32_MAX, stop_token_ids=[0, INT32_MAX], logit_bias={str(INT32_MAX): 1}, seed=2**64 - 1)
    assert p.top_k == INT32_MAX and p.logit_bias == ((INT32_MAX, 1.0),)
    assert SamplingParams(top_k=-1).top_k == 0 == SamplingParams.from_dict({"top_k": -1}).top_k
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)


def _limits(vocab_size: int | None) -> RequestLimits:
    return RequestLimits(
        max_model_len=1024, pool_tokens=4096, penalty_window=0, logprobs=True, stop_strings=False,
        vocab_size=vocab_size, bias_width=128, max_n=4,
    )


@pytest.mark.parametrize(
    "field,prompt,kwargs",
    [
        ("prompt", [1, 1000], {}),
        ("prompt", [-1], {}),
        ("stop_token_ids", [1], {"stop_token_ids": [1000]}),
        ("logit_bias", [1], {"logit_bias": {1000: 1.0}}),
    ],
)
def test_intake_checks_the_vocabulary(field: str, prompt: list[int], kwargs: dict) -> None:
    with pytest.raises(InvalidParameterError) as info:
        _limits(1000).check(prompt, SamplingParams(**kwargs))
    assert info.value.field == field and "vocabulary [0, 1000)" in str(info.value)


def test_intake_bounds_ids_by_int32_without_a_vocabulary() -> None:
    with pytest.raises(InvalidParameterError, match="int32") as info:
        _limits(None).check([INT32_MAX + 1], SamplingParams())
    assert info.value.field == "prompt"
    assert _limits(None).check([INT32_MAX], SamplingParams(top_k=INT32_MAX)).params.top_k == INT32_MAX


def test_top_k_at_least_the_vocabulary_is_off() -> None:
    """vLLM keeps every token for a ``top_k`` beyond the vocabulary; intake stores it as 0 (off)."""
    assert _limits(1000).check([1], SamplingParams(top_k=1000)).params.top_k == 0
    assert _limits(1000).check([1], SamplingParams(top_k=999)).params.top_k == 999


def test_check_row_raises_what_a_round_would() -> None:
    check_row(SamplingRow(top_k=INT32_MAX, seed=2**64 - 1, bias=((5, 1.0),)))
    with pytest.raises(OverflowError):
        check_row(SamplingRow(top_k=BIG))
    with pytest.raises(ValueError, match="bias slots"):
        check_row(SamplingRow(bias=tuple((i, 1.0) for i in range(200))))
    with pytest.raises(ValueError, match="penalty window"):
        check_row(SamplingRow(presence_penalty=1.0, prompt=(1,) * 9), penalty_window=8)


# ------------------------------------------------------------------------------ on an engine
@pytest.fixture(scope="module")
def llm(tiny_model) -> LLM:
    return LLM(tiny_model("tiny-qwen3.5"), **SMALL_FIXED)


def _greedy(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=6, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def alone(llm: LLM) -> list[int]:
    """The normal request's output when it runs by itself."""
    return llm.generate([PROMPT], _greedy())[0].token_ids


def test_poison_top_k_is_refused_at_intake(llm: LLM, alone: list[int]) -> None:
    """The issue's case: ``top_k=10**10`` beside a normal greedy request is a typed error before
    anything is queued; the normal request then runs as it does alone, with no failed round."""
    failures = llm.engine.num_step_failures
    with pytest.raises(InvalidParameterError, match="top_k") as info:
        llm.generate([PROMPT, OTHER], [_greedy(), _greedy(top_k=BIG)])
    assert info.value.field == "top_k"
    assert not llm.engine.has_unfinished()
    assert llm.generate([PROMPT, OTHER], [_greedy(), _greedy(top_k=10**6)])[0].token_ids == alone
    assert llm.engine.num_step_failures == failures == 0


def _unchecked(params: SamplingParams, **bad: object) -> SamplingParams:
    """``params`` with values intake would refuse, as a bug in a check would let through."""
    for name, value in bad.items():
        object.__setattr__(params, name, value)
    return params


def test_unbuildable_row_fails_alone_before_its_round(llm: LLM, alone: list[int]) -> None:
    core = llm.engine
    rounds, failures = core.num_rounds, core.num_step_failures
    poison = core.add(CheckedRequest(tuple(OTHER), _unchecked(_greedy(), top_k=BIG)))
    normal = core.add(CheckedRequest(tuple(PROMPT), _greedy()))
    first = core.step()
    assert first[0].request_id == poison and first[0].finish_reason == "error"
    assert "OverflowError" in (first[0].error or "") and first[0].finish_round is None
    core.run_until_done()
    assert core.output(normal).token_ids == alone and core.output(normal).finish_reason == "length"
    assert core.output(poison).token_ids == [] and core.num_rounds > rounds
    assert core.num_step_failures == failures == 0  # no failed round: no pool rebuilt, no cache flush
    assert core.scheduler.memory.pages.num_used > 0  # what the rounds cached is still there
    for rid in (poison, normal):
        core.forget(rid)


def test_forced_row_failure_fails_only_that_request(llm: LLM, alone: list[int], monkeypatch) -> None:
    """Whatever goes wrong writing one request's row (here: a patched check) ends that request with
    ``error``; the request beside it, in the same ``generate``, is untouched."""
    real = record.check_row

    def broken(row: SamplingRow, *, penalty_window: int = 0) -> None:
        if row.seed == 1234:
            raise RuntimeError("row build failed")
        real(row, penalty_window=penalty_window)

    monkeypatch.setattr(record, "check_row", broken)
    failures = llm.engine.num_step_failures
    bad, good = llm.generate([OTHER, PROMPT], [_greedy(seed=1234), _greedy()])
    assert bad.finish_reason == "error" and "row build failed" in (bad.error or "") and bad.token_ids == []
    assert good.token_ids == alone and good.finish_reason == "length"
    assert llm.engine.num_step_failures == failures == 0


def test_background_engine_delivers_the_refusal(llm: LLM, alone: list[int]) -> None:
    """On the engine thread, the refused request's handle gets its error from the next step and
    the request queued beside it completes as it does alone."""
    engine = BackgroundEngine(llm.engine)
    try:
        bad = engine.enqueue(CheckedRequest(tuple(OTHER), _unchecked(_greedy(), top_k=BIG)))
        good = engine.submit(PROMPT, _greedy())
        with pytest.raises(RequestFailedError, match="sampling settings cannot be run"):
            bad.result(timeout=300)
        assert good.result(timeout=300).token_ids == alone
    finally:
        engine.shutdown()
    assert llm.engine.num_step_failures == 0 and not llm.engine.has_unfinished()
