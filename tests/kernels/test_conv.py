"""Tests for the causal depthwise conv1d kernels against a direct numpy per-token loop.

Rows are ragged (incl. a zero-length row and rows shorter than ``K - 1``), batches have trailing
padding tokens, and initial states are random non-zero.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax.kernels.conv import causal_conv1d, causal_conv1d_update, conv_states_at

LENS = (5, 0, 1, 2, 9)
PAD = 3
CHANNELS = 6


def _cu(lens: tuple[int, ...]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _make(seed: int, num_tokens: int, num_rows: int, kernel: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((num_tokens, CHANNELS)).astype(np.float32),
        "w": rng.standard_normal((CHANNELS, kernel)).astype(np.float32),
        "b": rng.standard_normal((CHANNELS,)).astype(np.float32),
        "init": rng.standard_normal((num_rows, kernel - 1, CHANNELS)).astype(np.float32),
    }


def _act(y: np.ndarray, activation: str | None) -> np.ndarray:
    return y / (1.0 + np.exp(-y)) if activation == "silu" else y


def _extended(inp: dict[str, np.ndarray], lens: tuple[int, ...], r: int) -> np.ndarray:
    cu = _cu(lens)
    return np.concatenate([inp["init"][r], inp["x"][cu[r] : cu[r + 1]]]).astype(np.float64)


def _numpy_conv(inp, lens, bias: np.ndarray | None, activation: str | None):
    kernel = inp["w"].shape[1]
    y = np.zeros(inp["x"].shape)
    finals = []
    cu = _cu(lens)
    for r, n in enumerate(lens):
        ext = _extended(inp, lens, r)
        for p in range(n):
            acc = np.zeros(CHANNELS) if bias is None else bias.astype(np.float64).copy()
            for i in range(kernel):
                acc += inp["w"][:, i] * ext[p + i]
            y[cu[r] + p] = _act(acc, activation)
        finals.append(ext[len(ext) - (kernel - 1) :])
    return y, np.stack(finals)


@pytest.mark.parametrize("kernel,activation,use_bias", [(4, "silu", True), (2, None, False), (3, "silu", False)])
def test_conv_matches_numpy_loop(kernel: int, activation: str | None, use_bias: bool) -> None:
    inp = _make(kernel, sum(LENS) + PAD, len(LENS), kernel)
    bias = inp["b"] if use_bias else None
    call = jax.jit(functools.partial(causal_conv1d, activation=activation))
    y, final = call(inp["x"], inp["w"], bias, jnp.asarray(_cu(LENS)), inp["init"])
    ref_y, ref_final = _numpy_conv(inp, LENS, bias, activation)
    assert y.dtype == jnp.float32 and final.shape == inp["init"].shape
    np.testing.assert_allclose(y, ref_y, atol=1e-5, rtol=0)
    assert np.all(np.asarray(y)[sum(LENS) :] == 0)
    np.testing.assert_allclose(final, ref_final, atol=0, rtol=0)
    np.testing.assert_array_equal(final[1], inp["init"][1])  # zero-length row keeps its state


def test_conv_states_at_offsets() -> None:
    kernel = 4
    inp = _make(1, sum(LENS) + PAD, len(LENS), kernel)
    pairs = [(0, 0), (0, 1), (0, 2), (0, 3), (0, 5), (1, 0), (2, 1), (3, 1), (3, 2), (4, 0), (4, 4), (4, 9)]
    rows = jnp.asarray([r for r, _ in pairs], jnp.int32)
    offsets = jnp.asarray([o for _, o in pairs], jnp.int32)
    states = jax.jit(conv_states_at)(inp["x"], jnp.asarray(_cu(LENS)), inp["init"], rows, offsets)
    for m, (r, o) in enumerate(pairs):
        np.testing.assert_array_equal(states[m], _extended(inp, LENS, r)[o : o + kernel - 1].astype(np.float32))
    _, final = causal_conv1d(inp["x"], inp["w"], inp["b"], jnp.asarray(_cu(LENS)), inp["init"])
    all_rows = jnp.arange(len(LENS), dtype=jnp.int32)
    at_end = conv_states_at(inp["x"], jnp.asarray(_cu(LENS)), inp["init"], all_rows, jnp.asarray(LENS, jnp.int32))
    np.testing.assert_array_equal(final, at_end)


def test_update_matches_loop_and_packed() -> None:
    kernel, steps, rows = 4, 5, 3
    rng_inp = _make(9, steps * rows, rows, kernel)
    xs = rng_inp["x"].reshape(rows, steps, CHANNELS)
    update = jax.jit(causal_conv1d_update)
    state = jnp.asarray(rng_inp["init"])
    ys = []
    for s in range(steps):
        y, new_state = update(xs[:, s], rng_inp["w"], rng_inp["b"], state)
        window = np.concatenate([np.asarray(state), xs[:, s][:, None]], axis=1).astype(np.float64)
        ref = _act(rng_inp["b"] + np.einsum("bkc,ck->bc", window, rng_inp["w"]), "silu")
        np.testing.assert_allclose(y, ref, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(new_state, window[:, 1:].astype(np.float32))
        ys.append(np.asarray(y))
        state = new_state
    lens = (steps,) * rows
    packed = {**rng_inp, "x": xs.reshape(rows * steps, CHANNELS)}
    y_all, final = causal_conv1d(packed["x"], packed["w"], packed["b"], jnp.asarray(_cu(lens)), packed["init"])
    np.testing.assert_allclose(np.stack(ys, axis=1).reshape(-1, CHANNELS), y_all, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(final, state)


def test_bfloat16_inputs() -> None:
    kernel = 4
    inp = _make(2, sum(LENS) + PAD, len(LENS), kernel)
    x16 = jnp.asarray(inp["x"], jnp.bfloat16)
    y, final = causal_conv1d(x16, inp["w"], inp["b"], jnp.asarray(_cu(LENS)), inp["init"])
    assert y.dtype == jnp.bfloat16 and final.dtype == jnp.float32
    ref_y, ref_final = _numpy_conv({**inp, "x": np.asarray(x16, np.float32)}, LENS, inp["b"], "silu")
    np.testing.assert_allclose(np.asarray(y, np.float32), ref_y, atol=2e-2, rtol=2e-2)
    np.testing.assert_array_equal(final, ref_final.astype(np.float32))
