"""Tests for the gated delta rule kernels against a float64 numpy per-token oracle.

Inputs are seeded random (never zeros): L2-normalised q/k, g = -softplus(randn), beta in (0, 1),
non-zero initial states, ragged rows off the chunk grid (incl. a zero-length and a one-token row)
and trailing padding tokens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax.kernels import fast
from radixflow_jax.kernels.gated_delta import gated_delta_chunked, gated_delta_decode
from tests.kernels.oracles import gated_delta_naive
from radixflow_jax.kernels.layout import num_chunks_for

ATOL = 1e-4
LENS = (5, 0, 1, 13, 8)
PAD = 3


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _make_inputs(
    seed: int, num_tokens: int, num_rows: int, hk: int, hv: int, dk: int, dv: int, g_scale: float = 1.0
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "q": _normalise(rng.standard_normal((num_tokens, hk, dk))).astype(np.float32),
        "k": _normalise(rng.standard_normal((num_tokens, hk, dk))).astype(np.float32),
        "v": rng.standard_normal((num_tokens, hv, dv)).astype(np.float32),
        "g": (-g_scale * np.logaddexp(0.0, rng.standard_normal((num_tokens, hv)))).astype(np.float32),
        "beta": rng.uniform(0.05, 0.95, (num_tokens, hv)).astype(np.float32),
        "init": (0.5 * rng.standard_normal((num_rows, hv, dk, dv))).astype(np.float32),
    }


def _cu(lens: tuple[int, ...]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _numpy_oracle(inp: dict[str, np.ndarray], lens: tuple[int, ...], scale: float):
    """Returns ``(out [T, Hv, dv], states)`` with ``states[r][n]`` = row r's state after n tokens."""
    q, k, v, g, beta = (inp[n].astype(np.float64) for n in ("q", "k", "v", "g", "beta"))
    group = v.shape[1] // q.shape[1]
    q, k = np.repeat(q, group, axis=1), np.repeat(k, group, axis=1)
    out = np.zeros(v.shape)
    states = []
    cu = _cu(lens)
    for r in range(len(lens)):
        s = inp["init"][r].astype(np.float64).copy()
        row_states = [s.copy()]
        for t in range(cu[r], cu[r + 1]):
            s = s * np.exp(g[t])[:, None, None]
            u = beta[t][:, None] * (v[t] - np.einsum("hkv,hk->hv", s, k[t]))
            s = s + k[t][:, :, None] * u[:, None, :]
            out[t] = np.einsum("hkv,hk->hv", s, scale * q[t])
            row_states.append(s.copy())
        states.append(row_states)
    return out, states


def _used_chunks(lens: tuple[int, ...], chunk_size: int) -> list[tuple[int, int, int]]:
    """``(chunk index, row, tokens of the row so far)`` of every used chunk."""
    chunks, idx = [], 0
    for r, n in enumerate(lens):
        for j in range(-(-n // chunk_size)):
            chunks.append((idx, r, min((j + 1) * chunk_size, n)))
            idx += 1
    return chunks


def _run(fn, inp: dict[str, np.ndarray], lens: tuple[int, ...], chunk_size: int, scale: float | None):
    call = jax.jit(functools.partial(fn, chunk_size=chunk_size, scale=scale))
    return call(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], jnp.asarray(_cu(lens)), inp["init"])


def _check_against_oracle(result, inp, lens, chunk_size, scale) -> None:
    out, final, chunk_states = (np.asarray(x, np.float64) for x in result)
    ref_out, ref_states = _numpy_oracle(inp, lens, scale)
    np.testing.assert_allclose(out, ref_out, atol=ATOL, rtol=0)
    assert np.all(out[sum(lens) :] == 0)
    for r, n in enumerate(lens):
        np.testing.assert_allclose(final[r], ref_states[r][n], atol=ATOL, rtol=0)
    assert chunk_states.shape[0] == num_chunks_for(out.shape[0], len(lens), chunk_size)
    assert np.all(np.isfinite(chunk_states))
    for c, r, n in _used_chunks(lens, chunk_size):
        np.testing.assert_allclose(chunk_states[c], ref_states[r][n], atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "chunk_size,hk,hv,dk,dv",
    [(4, 2, 4, 8, 6), (8, 1, 3, 6, 8), (16, 2, 2, 8, 4)],
)
def test_chunked_and_naive_match_oracle(chunk_size: int, hk: int, hv: int, dk: int, dv: int) -> None:
    num_tokens = sum(LENS) + PAD
    inp = _make_inputs(chunk_size, num_tokens, len(LENS), hk, hv, dk, dv)
    scale = 0.7
    chunked = _run(gated_delta_chunked, inp, LENS, chunk_size, scale)
    naive = _run(gated_delta_naive, inp, LENS, chunk_size, scale)
    _check_against_oracle(chunked, inp, LENS, chunk_size, scale)
    _check_against_oracle(naive, inp, LENS, chunk_size, scale)
    for a, b in zip(chunked[:2], naive[:2]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=ATOL, rtol=0)


def test_default_chunk_size_and_scale() -> None:
    lens = (70, 3)
    inp = _make_inputs(11, sum(lens) + 2, len(lens), 2, 2, 8, 8)
    result = jax.jit(gated_delta_chunked)(
        inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], jnp.asarray(_cu(lens)), inp["init"]
    )
    _check_against_oracle(result, inp, lens, 64, 8**-0.5)


def test_strong_decay_stays_finite() -> None:
    lens = (19, 16)
    inp = _make_inputs(5, sum(lens), len(lens), 1, 2, 4, 4, g_scale=40.0)
    result = _run(gated_delta_chunked, inp, lens, 16, None)
    _check_against_oracle(result, inp, lens, 16, 4**-0.5)


def test_two_spans_equal_one_span() -> None:
    n, cut, chunk_size = 21, 9, 8
    inp = _make_inputs(3, n, 1, 2, 4, 8, 6)
    whole_out, whole_final, _ = _run(gated_delta_chunked, inp, (n,), chunk_size, None)
    first = {name: x[:cut] for name, x in inp.items() if name != "init"}
    out1, final1, _ = _run(gated_delta_chunked, {**first, "init": inp["init"]}, (cut,), chunk_size, None)
    second = {name: x[cut:] for name, x in inp.items() if name != "init"}
    out2, final2, _ = _run(gated_delta_chunked, {**second, "init": np.asarray(final1)}, (n - cut,), chunk_size, None)
    np.testing.assert_allclose(np.concatenate([out1, out2]), whole_out, atol=ATOL, rtol=0)
    np.testing.assert_allclose(final2, whole_final, atol=ATOL, rtol=0)


@pytest.mark.parametrize("impl", [gated_delta_decode, fast.gated_delta_decode], ids=["reference", "fast"])
def test_decode_matches_naive_step(impl) -> None:
    rows = 3
    inp = _make_inputs(7, rows, rows, 2, 4, 8, 6)
    out, state = jax.jit(impl)(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], inp["init"])
    lens = (1,) * rows
    ref_out, ref_final, _ = _run(gated_delta_naive, inp, lens, 4, None)
    np.testing.assert_allclose(out, ref_out, atol=ATOL, rtol=0)
    np.testing.assert_allclose(state, ref_final, atol=ATOL, rtol=0)
    np_out, np_states = _numpy_oracle(inp, lens, 8**-0.5)
    np.testing.assert_allclose(out, np_out, atol=ATOL, rtol=0)
    np.testing.assert_allclose(state, np.stack([s[1] for s in np_states]), atol=ATOL, rtol=0)


def test_jit_reuses_trace_across_layouts() -> None:
    traces: list[int] = []

    def traced(*args):
        traces.append(1)
        return gated_delta_chunked(*args, chunk_size=4)

    call = jax.jit(traced)
    num_tokens = 16
    for seed, lens in enumerate([(5, 0, 9), (0, 1, 12)]):
        inp = _make_inputs(seed + 20, num_tokens, len(lens), 1, 2, 4, 4)
        args = (inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], jnp.asarray(_cu(lens)), inp["init"])
        _check_against_oracle(call(*args), inp, lens, 4, 0.5)
    assert len(traces) == 1


def test_bfloat16_inputs() -> None:
    lens = (11, 0, 1, 6)
    num_tokens = sum(lens) + 2
    inp = _make_inputs(13, num_tokens, len(lens), 2, 4, 8, 8)
    low = {n: (x if n == "init" else x.astype(jnp.bfloat16)) for n, x in inp.items()}
    out, final, chunks = _run(gated_delta_chunked, low, lens, 8, None)
    assert out.dtype == jnp.bfloat16 and final.dtype == jnp.float32 and chunks.dtype == jnp.float32
    ref = {n: np.asarray(x, np.float32) for n, x in low.items()}
    ref_out, ref_final, _ = _run(gated_delta_naive, ref, lens, 8, None)
    np.testing.assert_allclose(np.asarray(out, np.float32), ref_out, atol=2e-2, rtol=0)
    np.testing.assert_allclose(final, ref_final, atol=2e-2, rtol=0)
