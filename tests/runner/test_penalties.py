"""Penalties and logprobs on device (``runner/sampling``) against a numpy reference written from the
definitions (vLLM / OpenAI): repetition over prompt + output, frequency and presence over output."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from radixflow_jax.runner.sampling import apply_penalties, token_logprobs

V, W = 50, 24


def reference(logits, prompts, outputs, presence, frequency, repetition) -> np.ndarray:
    out = logits.astype(np.float64).copy()
    for r in range(len(out)):
        seen = set(prompts[r]) | set(outputs[r])
        for t in seen:
            if repetition[r] != 1:
                out[r, t] = out[r, t] / repetition[r] if out[r, t] > 0 else out[r, t] * repetition[r]
        counts = np.bincount(np.asarray(outputs[r], int), minlength=V)
        out[r] -= frequency[r] * counts + presence[r] * (counts > 0)
    return out


def context(prompts, outputs) -> tuple[np.ndarray, np.ndarray]:
    ids = np.full((len(prompts), W), -1, np.int32)
    is_out = np.zeros((len(prompts), W), bool)
    for r, (p, o) in enumerate(zip(prompts, outputs)):
        ids[r, : len(p)] = p
        ids[r, len(p) : len(p) + len(o)] = o
        is_out[r, len(p) : len(p) + len(o)] = True
    return ids, is_out


def test_penalties_match_numpy_reference() -> None:
    rng = np.random.default_rng(0)
    rows = 6
    logits = (rng.normal(size=(rows, V)) * 3).astype(np.float32)
    prompts = [list(rng.integers(0, V, n)) for n in (5, 0, 12, 3, 8, 1)]
    outputs = [list(rng.integers(0, V // 3, n)) for n in (6, 4, 0, 11, 9, 2)]  # repeats within the output
    presence = np.array([0.5, 0.0, 1.0, -0.7, 2.0, 0.0], np.float32)
    frequency = np.array([0.3, 1.2, 0.0, 0.4, -1.5, 0.0], np.float32)
    repetition = np.array([1.3, 1.0, 0.8, 2.0, 1.1, 1.0], np.float32)
    ids, is_out = context(prompts, outputs)
    got = jax.jit(apply_penalties)(jnp.asarray(logits), ids, is_out, presence, frequency, repetition)
    want = reference(logits, prompts, outputs, presence, frequency, repetition)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-5)
    assert np.array_equal(np.asarray(got)[5], logits[5])  # neutral settings: bit-identical


def test_penalties_change_greedy_choice() -> None:
    logits = np.zeros((1, V), np.float32)
    logits[0, 7], logits[0, 9] = 5.0, 4.0
    ids, is_out = context([[1, 2]], [[7, 7]])
    got = apply_penalties(jnp.asarray(logits), ids, is_out, jnp.array([0.0]), jnp.array([1.0]), jnp.array([1.0]))
    assert int(jnp.argmax(got[0])) == 9  # 7 was generated twice: 5 - 2 < 4


def test_token_logprobs_are_log_softmax() -> None:
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(3, V)) * 2).astype(np.float32)
    tokens = np.array([4, 0, 49], np.int32)
    chosen, top_ids, top_lp = token_logprobs(jnp.asarray(logits), jnp.asarray(tokens), 5)
    x = logits.astype(np.float64)
    logp = x - x.max(1, keepdims=True) - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
    np.testing.assert_allclose(np.asarray(chosen), logp[np.arange(3), tokens], atol=1e-5)
    order = np.argsort(-logp, axis=1)[:, :5]
    assert np.array_equal(np.asarray(top_ids), order)
    np.testing.assert_allclose(np.asarray(top_lp), np.take_along_axis(logp, order, 1), atol=1e-5)


def test_build_arrays_writes_penalised_rows_context() -> None:
    from radixflow_jax.runner.inputs import SamplingRow, build_arrays
    from radixflow_jax.runner.shapes import Variant
    from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan

    rows = (
        RowPlan(request_id=1, tokens=(9,), start=3, pages=(1,), slot=1, copy_from=None, emits=(), sample=True),
        RowPlan(request_id=2, tokens=(4,), start=2, pages=(2,), slot=2, copy_from=None, emits=(), sample=True),
    )
    output = [7, 8]
    sampling = {1: SamplingRow(frequency_penalty=0.5, prompt=(1, 2, 3), output=output), 2: SamplingRow()}
    plan = RoundPlan(rows=rows, num_decode=2, stats=RoundStats())
    a = build_arrays(plan, Variant(2, 2, 2, 2), page_size=16, max_pages=2, sampling=sampling, penalty_window=8).inputs
    assert a.ctx_ids[0].tolist() == [1, 2, 3, 7, 8, -1, -1, -1] and a.ctx_out[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 0]
    assert a.ctx_ids[1].tolist() == [-1] * 8 and a.frequency.tolist() == [0.5, 0.0]
    output.append(9)  # the live output list: the next round sees the new token
    a = build_arrays(plan, Variant(2, 2, 2, 2), page_size=16, max_pages=2, sampling=sampling, penalty_window=8).inputs
    assert a.ctx_ids[0, :6].tolist() == [1, 2, 3, 7, 8, 9]
