"""Structured outputs in the engine: ``engine/grammar.py`` (validation naming the field, choice
escaping, one matcher per request), the step's grammar mask (``runner/sampling.apply_mask``: rows
without a grammar bit-identical), and ``LLM.generate`` with ``structured_outputs`` on tiny-qwen3.5:
valid outputs whatever the random weights prefer, unconstrained greedy outputs unchanged beside
constrained ones, and a preempted constrained request resuming with its matcher state."""

from __future__ import annotations

import json

import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

from radixflow_jax import LLM, SamplingParams
from radixflow_jax.engine.grammar import GrammarError, StructuredOutputsParams
from radixflow_jax.runner.sampling import apply_mask
from tests.engine.workloads import SMALL_FIXED

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
          "tag": {"enum": ["a", "b"]}}, "required": ["id", "tag"], "additionalProperties": False}  # fmt: skip


@pytest.mark.parametrize("values, fragment", [
    ({"json": {"type": "objectx"}}, "objectx"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"regex": "a[b"}, "regex"),
    ({"choice": []}, "choice"),
    ({"grammar": "start: undefined_rule"}, "undefined_rule"),
    ({"regex": "a", "choice": ["a"]}, "exactly one"),
    ({}, "exactly one"),
])  # fmt: skip
def test_invalid_constraints_name_their_field(values, fragment) -> None:
    with pytest.raises(GrammarError) as info:
        StructuredOutputsParams(**values, field="guided_x")
    assert info.value.field == "guided_x" and str(info.value).startswith("guided_x: ") and fragment in str(info.value)


def test_params_are_hashable_and_read_from_dicts() -> None:
    a = SamplingParams.from_dict({"structured_outputs": {"json": {"type": "boolean"}}, "max_tokens": 4})
    b = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(json='{"type": "boolean"}'))
    assert a == b and hash(a) == hash(b) and a.structured_outputs.kind == "json"
    assert SamplingParams(structured_outputs={"choice": ["x.y", "(z)"]}).structured_outputs.choice == ("x.y", "(z)")


def test_mask_forbids_and_leaves_unconstrained_rows_alone() -> None:
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, 70)).astype(np.float32))
    words = (70 + 31) // 32
    mask = np.full((3, words), -1, np.int32)
    assert (np.asarray(apply_mask(logits, jnp.asarray(mask))) == np.asarray(logits)).all()  # no grammar: untouched
    mask[1] = 0
    mask[1, 0] = 1 << 5  # only token 5
    mask[1, 2] = 1 << 1  # and token 65
    out = np.asarray(apply_mask(logits, jnp.asarray(mask)))
    assert (out[[0, 2]] == np.asarray(logits)[[0, 2]]).all()
    allowed = np.flatnonzero(np.isfinite(out[1]))
    assert allowed.tolist() == [5, 65] and (out[1, allowed] == np.asarray(logits)[1, allowed]).all()


def _valid(text: str) -> bool:
    jsonschema.validate(json.loads(text), SCHEMA)
    return True


def test_generate_with_a_schema_beside_greedy_and_under_preemption(tiny_model) -> None:
    """Two constrained and two unconstrained long prompts: in a roomy pool, then in one so small it
    preempts. The constrained outputs are valid (when they stop) and identical in both runs (a
    preempted request resumes with its matcher); the unconstrained greedy outputs equal a run
    without any constrained request."""
    model = tiny_model("tiny-qwen3.5")
    prompts = [list(range(10 + 50 * i, 130 + 50 * i)) for i in range(4)]
    plain = SamplingParams(max_tokens=24, ignore_eos=True)
    constrained = [SamplingParams(max_tokens=24, structured_outputs={"json": SCHEMA}),
                   SamplingParams(max_tokens=24, temperature=1.0, seed=4, structured_outputs={"json": SCHEMA})]
    per = [constrained[0], plain, constrained[1], plain]
    roomy = LLM(model, policy="no-cache", **SMALL_FIXED)
    alone = roomy.generate([prompts[1], prompts[3]], plain)
    mixed = roomy.generate(prompts, per)
    assert [o.token_ids for o in (mixed[1], mixed[3])] == [o.token_ids for o in alone]
    for o in (mixed[0], mixed[2]):
        assert o.finish_reason in ("stop", "length")
        if o.finish_reason == "stop":
            assert _valid(o.text)
    tight_llm = LLM(model, num_kv_pages=18, **{**SMALL_FIXED, "max_model_len": 256})
    tight = tight_llm.generate(prompts, per)
    assert sum(r.preempted for r in tight_llm.engine.records) > 0
    assert [o.token_ids for o in tight] == [o.token_ids for o in mixed]


def test_choice_and_regex_end_with_stop(tiny_model) -> None:
    llm = LLM(tiny_model("tiny-qwen3.5"), **SMALL_FIXED)
    prompt = llm.model.tokenizer.encode("answer:")
    params = [SamplingParams(max_tokens=16, temperature=1.0, seed=s, structured_outputs={"choice": ["left", "right"]})
              for s in range(3)] + [SamplingParams(max_tokens=16, n=2, temperature=1.0, seed=9,
                                                   structured_outputs={"regex": r"[a-c]{2}[0-9]"})]  # fmt: skip
    outs = llm.generate([prompt] * 4, params)
    assert all(o.finish_reason == "stop" and o.text in ("left", "right") for o in outs[:3])
    assert all(s.finish_reason == "stop" and len(s.text) == 3 for s in outs[3].samples)


def test_an_engine_without_a_mask_refuses_naming_the_field() -> None:
    from radixflow_jax.engine.intake import RequestLimits

    # structured=False: e.g. the simulated executor
    limits = RequestLimits(
        max_model_len=64, pool_tokens=64, penalty_window=0, logprobs=False, stop_strings=True, vocab_size=100, max_n=16
    )
    params = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(regex="a+", field="guided_regex"))
    with pytest.raises(ValueError, match="^guided_regex: structured outputs are not available"):
        limits.check([1, 2], params)
