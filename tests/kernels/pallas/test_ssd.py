"""Pallas chunked SSD (interpret mode, both lowering variants) against the jnp reference.

Inputs are seeded random and never zero (dt = softplus(randn), A = -exp(randn), non-zero initial
states), with n_groups > 1 (B/C shared by two heads), ragged rows off the chunk grid (zero-length
and one-token rows) and trailing padding. Interpret mode fills kernel outputs and scratch with
NaN, so every returned element (all chunk states too) must be finite.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax.kernels import ssd as ref
from radixflow_jax.kernels.layout import chunk_layout
from radixflow_jax.kernels.pallas import ssd as pallas_ssd

CHUNK = 8
LENS = (5, 0, 1, 17, 9, 1)
PAD = 3
HEADS, GROUPS, P, N = 4, 2, 16, 8


def _cu(lens: tuple[int, ...]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def make_inputs(seed: int, lens: tuple[int, ...], pad: int, dtype: jnp.dtype = jnp.float32) -> tuple:
    rng = np.random.default_rng(seed)
    tokens = sum(lens) + pad
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    x = normal(tokens, HEADS, P)
    dt = np.logaddexp(0.0, normal(tokens, HEADS))
    a = -np.exp(normal(HEADS))
    b, c = normal(tokens, GROUPS, N), normal(tokens, GROUPS, N)
    init = normal(len(lens), HEADS, P, N)
    cast = lambda v: jnp.asarray(v, dtype)  # noqa: E731
    return cast(x), cast(dt), jnp.asarray(a), cast(b), cast(c), jnp.asarray(_cu(lens)), jnp.asarray(init)


reference = jax.jit(functools.partial(ref.ssd_chunked, chunk_size=CHUNK))


def pallas(args: tuple, backend: str, block_p: int | None = 8) -> tuple:
    kernel = functools.partial(
        pallas_ssd.ssd_chunked, chunk_size=CHUNK, backend=backend, interpret=True, block_p=block_p
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


def assert_matches(got: tuple, want: tuple, lens: tuple[int, ...], out_tol: float, state_tol: float) -> None:
    out, final, states = (np.asarray(jnp.asarray(v, jnp.float32)) for v in got)
    r_out, r_final, r_states = (np.asarray(jnp.asarray(v, jnp.float32)) for v in want)
    for v in (out, final, states):
        assert np.isfinite(v).all(), "unwritten (NaN-poisoned) or non-finite kernel output"
    used = np.asarray(chunk_layout(jnp.asarray(_cu(lens)), out.shape[0], CHUNK).length) > 0
    np.testing.assert_allclose(out, r_out, atol=out_tol, rtol=out_tol)
    np.testing.assert_allclose(final, r_final, atol=state_tol, rtol=state_tol)
    np.testing.assert_allclose(states[used], r_states[used], atol=state_tol, rtol=state_tol)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_matches_reference_f32(backend: str, f32_case: tuple[tuple, tuple]) -> None:
    args, want = f32_case
    got = pallas(args, backend)
    assert_matches(got, want, LENS, 1e-4, 1e-4)
    assert np.abs(np.asarray(got[0])[sum(LENS) :]).max() == 0.0  # padding tokens give 0


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_matches_reference_bf16(backend: str, bf16_case: tuple[tuple, tuple]) -> None:
    args, want = bf16_case
    got = pallas(args, backend, block_p=None)
    assert got[0].dtype == jnp.bfloat16 and got[1].dtype == jnp.float32
    assert_matches(got, want, LENS, 2e-2, 1e-4)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_only_empty_rows_and_padding(backend: str) -> None:
    args = make_inputs(2, (0, 0, 0), 5)
    out, final, states = pallas(args, backend)
    assert np.asarray(out).max() == 0.0 and np.asarray(out).min() == 0.0
    np.testing.assert_array_equal(np.asarray(final), np.asarray(args[-1]))
    assert np.isfinite(np.asarray(states)).all()


def test_gpu_variant_needs_power_of_two_tiles() -> None:
    args = make_inputs(3, (3,), 1)
    with pytest.raises(ValueError, match="power-of-two"):
        pallas_ssd.ssd_chunked(*args, chunk_size=6, backend="gpu", interpret=True)
