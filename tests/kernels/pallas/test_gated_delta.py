"""Pallas chunked gated delta (interpret mode, both lowering variants) against the jnp reference.

Inputs are seeded random and never zero: L2-normalised q/k, g = -softplus(randn), beta in (0, 1),
non-zero initial states, Hk != Hv, ragged rows off the chunk grid (a zero-length row, a one-token
row, an exact-chunk row) and trailing padding. Interpret mode fills kernel outputs and scratch
with NaN, so every returned element (all chunk states too, used or not) must be finite.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax.kernels import gated_delta as ref
from radixflow_jax.kernels.layout import chunk_layout
from radixflow_jax.kernels.pallas import gated_delta as pallas_gd

CHUNK = 8
LENS = (5, 0, 1, 13, 8)
PAD = 3
HK, HV, DK, DV = 2, 4, 8, 16


def _cu(lens: tuple[int, ...]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def make_inputs(seed: int, lens: tuple[int, ...], pad: int, dtype: jnp.dtype = jnp.float32) -> tuple:
    rng = np.random.default_rng(seed)
    tokens, rows = sum(lens) + pad, len(lens)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    q = unit(rng.standard_normal((tokens, HK, DK)))
    k = unit(rng.standard_normal((tokens, HK, DK)))
    v = rng.standard_normal((tokens, HV, DV))
    g = -np.logaddexp(0.0, rng.standard_normal((tokens, HV)))
    beta = rng.uniform(0.05, 0.95, (tokens, HV))
    init = (0.5 * rng.standard_normal((rows, HV, DK, DV))).astype(np.float32)
    cast = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    return cast(q), cast(k), cast(v), cast(g), cast(beta), jnp.asarray(_cu(lens)), jnp.asarray(init)


def used_chunks(lens: tuple[int, ...], num_tokens: int) -> np.ndarray:
    return np.asarray(chunk_layout(jnp.asarray(_cu(lens)), num_tokens, CHUNK).length) > 0


reference = jax.jit(functools.partial(ref.gated_delta_chunked, chunk_size=CHUNK))


def pallas(args: tuple, backend: str, block_v: int | None = 8) -> tuple:
    kernel = functools.partial(
        pallas_gd.gated_delta_chunked, chunk_size=CHUNK, backend=backend, interpret=True, block_v=block_v
    )
    return jax.jit(kernel)(*args)


@pytest.fixture(scope="module")
def f32_case() -> tuple[tuple, tuple]:
    """``(inputs, reference results)``, shared by both backend variants."""
    args = make_inputs(0, LENS, PAD)
    return args, reference(*args)


@pytest.fixture(scope="module")
def bf16_case() -> tuple[tuple, tuple]:
    args = make_inputs(1, LENS, PAD, jnp.bfloat16)
    return args, reference(*args)


def assert_matches(got: tuple, want: tuple, used: np.ndarray, out_tol: float, state_tol: float) -> None:
    out, final, states = (np.asarray(jnp.asarray(x, jnp.float32)) for x in got)
    r_out, r_final, r_states = (np.asarray(jnp.asarray(x, jnp.float32)) for x in want)
    for x in (out, final, states):
        assert np.isfinite(x).all(), "unwritten (NaN-poisoned) or non-finite kernel output"
    np.testing.assert_allclose(out, r_out, atol=out_tol, rtol=out_tol)
    np.testing.assert_allclose(final, r_final, atol=state_tol, rtol=state_tol)
    np.testing.assert_allclose(states[used], r_states[used], atol=state_tol, rtol=state_tol)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_matches_reference_f32(backend: str, f32_case: tuple[tuple, tuple]) -> None:
    args, want = f32_case
    got = pallas(args, backend)
    assert_matches(got, want, used_chunks(LENS, args[2].shape[0]), 1e-4, 1e-4)
    assert np.abs(np.asarray(got[0])[sum(LENS) :]).max() == 0.0  # padding tokens give 0


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_matches_reference_bf16(backend: str, bf16_case: tuple[tuple, tuple]) -> None:
    args, want = bf16_case
    got = pallas(args, backend, block_v=None)
    assert got[0].dtype == jnp.bfloat16 and got[1].dtype == jnp.float32
    assert_matches(got, want, used_chunks(LENS, args[2].shape[0]), 2e-2, 1e-4)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_only_empty_rows_and_padding(backend: str) -> None:
    """No used chunk at all: the output is zero and every final state is its initial state."""
    args = make_inputs(2, (0, 0), 4)
    out, final, states = pallas(args, backend)
    assert np.asarray(out).max() == 0.0 and np.asarray(out).min() == 0.0
    np.testing.assert_array_equal(np.asarray(final), np.asarray(args[-1]))
    assert np.isfinite(np.asarray(states)).all()


def test_gpu_variant_needs_power_of_two_tiles() -> None:
    args = make_inputs(3, (3,), 1)
    with pytest.raises(ValueError, match="power-of-two"):
        pallas_gd.gated_delta_chunked(*args, chunk_size=6, backend="gpu", interpret=True)
