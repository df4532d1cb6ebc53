"""The offline ``LLM`` API: text and id prompts, parameter validation, stop conditions, seeded
sampling that does not depend on batching, prefix-cache reporting."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from radixflow_jax import LLM, SamplingParams, UnsupportedParameterError

SMALL = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512, warmup=False)
PROMPT = list(range(30, 70))


@pytest.fixture(scope="module")
def llm(tiny_model) -> LLM:
    return LLM(tiny_model("tiny-qwen3.5"), **SMALL)


@pytest.fixture(scope="module")
def bare_llm(llm: LLM, tmp_path_factory) -> LLM:
    """The same weights from a directory without tokenizer files."""
    src = llm.model.model_dir
    dst = tmp_path_factory.mktemp("no-tokenizer")
    for name in os.listdir(src):
        if not name.startswith("tokenizer"):
            shutil.copy(os.path.join(src, name), dst / name)
    return LLM(str(dst), **SMALL)


def _greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw)


# ------------------------------------------------------------------------------------ prompts
def test_text_prompts_decode(llm: LLM) -> None:
    tok = llm.model.tokenizer
    assert tok is not None
    text = "the student read a story about the river"
    out_text, out_ids = llm.generate([text, tok.encode(text)], _greedy(8))
    assert list(out_text.prompt_token_ids) == tok.encode(text)
    assert out_text.prompt_tokens == len(tok.encode(text))
    assert out_text.token_ids == out_ids.token_ids  # the text prompt is the same request as its ids
    assert len(out_text.token_ids) == 8 and out_text.finish_reason == "length"
    assert isinstance(out_text.text, str)
    assert out_text.text == tok.decode(out_text.token_ids)
    assert out_ids.text == out_text.text  # ids prompts decode their output too when a tokenizer exists


def test_outputs_come_back_in_prompt_order(llm: LLM) -> None:
    prompts = [PROMPT[: 5 + 7 * i] for i in range(6)]
    together = llm.generate(prompts, [_greedy(2 + i) for i in range(6)])
    for i, (p, out) in enumerate(zip(prompts, together)):
        assert list(out.prompt_token_ids) == p
        assert len(out.token_ids) == 2 + i
    alone = llm.generate([prompts[4], prompts[1]], [_greedy(6), _greedy(3)])
    assert [o.token_ids for o in alone] == [together[4].token_ids, together[1].token_ids]


def test_no_tokenizer_rejects_text_but_accepts_ids(llm: LLM, bare_llm: LLM) -> None:
    assert bare_llm.model.tokenizer is None
    with pytest.raises(ValueError, match="tokenizer"):
        bare_llm.generate(["hello world"], _greedy(4))
    assert not bare_llm.engine.has_unfinished()
    out = bare_llm.generate([PROMPT], _greedy(6))[0]
    assert out.text is None
    assert out.token_ids == llm.generate([PROMPT], _greedy(6))[0].token_ids  # same weights, same tokens
    with pytest.raises(ValueError, match="tokenizer"):
        bare_llm.generate([PROMPT], SamplingParams(max_tokens=4, stop=["x"]))
    assert not bare_llm.engine.has_unfinished()


def test_stop_strings_without_tokenizer_queue_nothing(bare_llm: LLM) -> None:
    with pytest.raises(ValueError, match="tokenizer"):
        bare_llm.generate([PROMPT, PROMPT], [_greedy(3), SamplingParams(max_tokens=3, stop=["x"])])
    try:
        assert not bare_llm.engine.has_unfinished()
    finally:
        bare_llm.engine.run_until_done()  # do not leave the stray request to later tests


@pytest.mark.parametrize("bad", [512, 10**6, -1])
def test_out_of_vocab_ids_are_rejected(llm: LLM, bad: int) -> None:
    with pytest.raises(ValueError, match="vocab"):
        llm.generate([[5, bad, 7]], _greedy(2))


def test_bad_prompt_types(llm: LLM) -> None:
    with pytest.raises(TypeError):
        llm.generate("a single string", _greedy(2))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        llm.generate(PROMPT, _greedy(2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], _greedy(2))
    with pytest.raises(ValueError, match="sampling params"):
        llm.generate([PROMPT, PROMPT], [_greedy(2)] * 3)
    assert not llm.engine.has_unfinished()


# --------------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("name,value", [("use_beam_search", True)])
def test_unsupported_parameters_are_rejected(name: str, value) -> None:
    with pytest.raises(UnsupportedParameterError, match=name):
        SamplingParams.from_dict({name: value})


@pytest.mark.parametrize("name,value", [("n", 1), ("best_of", 1), ("logprobs", None), ("presence_penalty", 0.0),
                                        ("frequency_penalty", 0), ("repetition_penalty", 1.0), ("logit_bias", {}),
                                        ("use_beam_search", False), ("min_tokens", 0), ("prompt_logprobs", None)])  # fmt: skip
def test_neutral_values_of_unsupported_parameters_are_accepted(name: str, value) -> None:
    assert SamplingParams.from_dict({name: value, "max_tokens": 3}) == SamplingParams(max_tokens=3)


@pytest.mark.parametrize("name,value,bad", [("presence_penalty", 0.5, 2.5), ("frequency_penalty", -0.2, -3),
                                            ("repetition_penalty", 1.2, 0.0), ("logprobs", 5, 21)])  # fmt: skip
def test_penalties_and_logprobs_are_parameters(name: str, value, bad) -> None:
    assert getattr(SamplingParams.from_dict({name: value}), name) == value
    with pytest.raises(ValueError, match=name):
        SamplingParams.from_dict({name: bad})


def test_logprobs_and_penalties_through_the_engine(llm: LLM) -> None:
    plain, scored, penalised = llm.generate(
        [PROMPT] * 3, [_greedy(6), _greedy(6, logprobs=3), _greedy(6, frequency_penalty=2.0, presence_penalty=2.0)]
    )
    assert plain.logprobs is None and scored.token_ids == plain.token_ids
    assert len(scored.logprobs) == 6
    for token, (chosen, ids, lps) in zip(scored.token_ids, scored.logprobs):
        assert ids[0] == token and chosen == pytest.approx(lps[0]) and len(ids) == 3 and lps == sorted(lps, reverse=True)
    assert penalised.token_ids[0] == plain.token_ids[0]  # nothing generated yet: presence/frequency act on output only


def test_unknown_parameter_is_rejected() -> None:
    with pytest.raises(UnsupportedParameterError, match="unknown.*tempreature"):
        SamplingParams.from_dict({"tempreature": 0.5})
    assert issubclass(UnsupportedParameterError, ValueError)


def test_from_dict_builds_params() -> None:
    p = SamplingParams.from_dict(
        {"max_tokens": 5, "temperature": 0.7, "top_k": -1, "top_p": 0.9, "seed": 3, "stop": "END", "stop_token_ids": [4]}
    )
    assert p == SamplingParams(max_tokens=5, temperature=0.7, top_k=0, top_p=0.9, seed=3, stop=("END",), stop_token_ids=(4,))
    assert SamplingParams.from_dict({"seed": None, "temperature": None}) == SamplingParams()


@pytest.mark.parametrize(
    "kwargs",
    [dict(max_tokens=0), dict(max_tokens=-3), dict(max_tokens=2.5), dict(max_tokens=True), dict(top_p=0.0),
     dict(top_p=1.5), dict(temperature=-1.0), dict(temperature=float("nan")), dict(temperature=float("inf")),
     dict(temperature="hot"), dict(min_p=-0.1), dict(min_p=1.5), dict(top_k=1.5), dict(stop=[""]),
     dict(stop=[3]), dict(seed=1.5), dict(seed="7"), dict(stop_token_ids=["a"])],
)  # fmt: skip
def test_invalid_values_raise_value_error(kwargs) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
    with pytest.raises(ValueError):
        SamplingParams.from_dict(kwargs)


def test_too_long_prompt_raises_before_queueing(llm: LLM) -> None:
    before = len(llm.engine.scheduler.requests)
    long_prompt = [5] * 500
    with pytest.raises(ValueError, match="max_model_len=512"):
        llm.generate([long_prompt], _greedy(16))
    # a bad prompt anywhere in the batch queues nothing, not even the good ones before it
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([PROMPT, long_prompt], _greedy(16))
    assert not llm.engine.has_unfinished()
    assert len(llm.engine.scheduler.requests) == before
    ok = llm.generate([long_prompt[:490], PROMPT], _greedy(4))  # the engine still serves afterwards
    assert [len(o.token_ids) for o in ok] == [4, 4]


def test_too_few_kv_pages_refused_at_construction(llm: LLM) -> None:
    with pytest.raises(ValueError, match=re.escape("minimum is 33")):
        LLM(llm.model, num_kv_pages=3, **SMALL)  # 512 / 16 = 32 pages + the reserved page 0


# ------------------------------------------------------------------------------ stop conditions
def test_stop_token_ids_end_generation(llm: LLM) -> None:
    ref = llm.generate([PROMPT], _greedy(12))[0].token_ids
    k = next(i for i in range(2, 12) if ref[i] not in ref[:i])
    out = llm.generate([PROMPT], _greedy(12, stop_token_ids=(ref[k],)))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == ref[: k + 1]  # the stop token ends the output


def test_eos_ends_generation_unless_ignored(llm: LLM) -> None:
    # the engine's EOS ids (config + tokenizer) act like stop tokens unless ignore_eos
    ref = llm.generate([PROMPT], _greedy(12))[0].token_ids
    k = next(i for i in range(1, 12) if ref[i] not in ref[:i])
    saved = llm.engine.eos_token_ids
    llm.engine.eos_token_ids = (ref[k],)
    try:
        out = llm.generate([PROMPT], SamplingParams(max_tokens=12))[0]
        ignored = llm.generate([PROMPT], _greedy(12))[0]
    finally:
        llm.engine.eos_token_ids = saved
    assert (out.finish_reason, out.token_ids) == ("stop", ref[: k + 1])
    assert (ignored.finish_reason, ignored.token_ids) == ("length", ref)


def _stop_string_case(llm: LLM, prompt: str) -> tuple[object, str, int]:
    """A reference greedy output and a stop string that first appears at character ``cut`` of it."""
    ref = llm.generate([prompt], _greedy(24))[0]
    assert len(ref.text) >= 8, "the seeded preset produces text to cut"
    for i in range(1, len(ref.text) // 2):  # the first 3-char window whose first occurrence is past 0
        stop = ref.text[i : i + 3]
        if stop.strip() and ref.text.find(stop) == i:
            return ref, stop, i
    raise AssertionError(f"no 3-character window of {ref.text!r} works as a stop string")


def test_stop_strings_cut_the_text(llm: LLM) -> None:
    ref, stop, cut = _stop_string_case(llm, "the teacher asked a question about the passage")
    out = llm.generate(["the teacher asked a question about the passage"], _greedy(24, stop=("zzzzq", stop)))[0]
    assert out.finish_reason == "stop"
    assert out.text == ref.text[:cut]
    assert stop not in out.text
    assert 0 < len(out.token_ids) < len(ref.token_ids)
    assert out.token_ids == ref.token_ids[: len(out.token_ids)]
    assert stop in llm.model.tokenizer.decode(out.token_ids)  # generation stopped at the token completing it


def test_stop_string_completed_by_the_last_token(llm: LLM) -> None:
    prompt = "the teacher asked a question about the passage"
    ref, stop, cut = _stop_string_case(llm, prompt)
    n = len(llm.generate([prompt], _greedy(24, stop=(stop,)))[0].token_ids)
    out = llm.generate([prompt], _greedy(n, stop=(stop,)))[0]  # the stop string completes at token n
    assert out.text == ref.text[:cut]
    assert out.finish_reason == "stop"


# ------------------------------------------------------------------------------------ sampling
SEEDED = SamplingParams(max_tokens=10, temperature=0.8, seed=7, ignore_eos=True)


def test_seeded_sampling_is_reproducible_across_instances(llm: LLM, bare_llm: LLM) -> None:
    first = llm.generate([PROMPT], SEEDED)[0].token_ids
    again = llm.generate([PROMPT], SEEDED)[0].token_ids
    other = bare_llm.generate([PROMPT], SEEDED)[0].token_ids  # another instance, loaded separately
    assert first == again == other
    greedy = llm.generate([PROMPT], _greedy(10))[0].token_ids
    other_seed = llm.generate([PROMPT], SamplingParams(max_tokens=10, temperature=0.8, seed=8, ignore_eos=True))
    assert first != greedy or other_seed[0].token_ids != first  # the seed matters: this is not greedy


def test_seeded_sampling_is_independent_of_batch(llm: LLM) -> None:
    alone = llm.generate([PROMPT], SEEDED)[0].token_ids
    others = [list(range(100, 100 + n)) for n in (3, 90, 17, 150, 40)]
    prompts = others[:2] + [PROMPT] + others[2:]
    params = [SamplingParams(max_tokens=4 + i, temperature=1.0, seed=i, ignore_eos=True) for i in range(2)]
    params += [SEEDED] + [_greedy(7), SamplingParams(max_tokens=5, temperature=0.5, top_k=5, ignore_eos=True), _greedy(3)]
    outs = llm.generate(prompts, params)
    assert outs[2].token_ids == alone
    assert len(set(alone)) > 1


def test_prefix_sharing_reports_cached_tokens(llm: LLM) -> None:
    prefix = [(7 * i) % 400 + 50 for i in range(200)]
    first = llm.generate([prefix + [11, 12, 13]], _greedy(3))[0]
    second = llm.generate([prefix + [21, 22, 23, 24]], _greedy(3))[0]
    assert first.cached_tokens == 0
    assert 128 <= second.cached_tokens <= 200
    assert second.prompt_tokens == 204
    assert llm.reset_prefix_cache()  # the cache is empty: the same prompt computes from scratch
    again = llm.generate([prefix + [21, 22, 23, 24]], _greedy(3))[0]
    assert again.cached_tokens == 0
    assert again.token_ids == second.token_ids
