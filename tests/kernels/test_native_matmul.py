"""The native few-row matmul (``kernels/native/small_matmul.cc``) against ``x @ w.T``, and
``ops.linear`` sending only the rows it serves to it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax.kernels import native, ops

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="native kernels are for XLA:CPU")


@pytest.fixture(scope="module", autouse=True)
def _native_kernels() -> None:
    if native.mode() == "0":
        pytest.skip("RADIXFLOW_NATIVE=0")
    reason = native._load()
    if reason is not None:
        pytest.fail(f"the native kernels did not build: {reason}")


def _rand(shape: tuple[int, ...], seed: int) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 16, 17, 24, 25, 33, 40, 48, 49, 70])
@pytest.mark.parametrize("out_features", [1, 31, 50, 96])
def test_small_matmul_matches_the_dot(rows: int, out_features: int) -> None:
    """Every tile width (narrow: 1-3 vectors of rows up to 24, wide: 1-4 above, a partial last
    vector, a last block of up to 8 columns in a narrow tile at 33, 40, 49 and 70) and block edge
    (50 = 48 + 2)."""
    x, w = _rand((rows, 70), 1), _rand((out_features, 70), 2)
    got = jax.jit(native.small_matmul)(x, w)
    assert got.shape == (rows, out_features) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(x @ w.T), rtol=1e-5, atol=1e-5)


def test_linear_routes_only_the_rows_it_serves(monkeypatch) -> None:
    w = _rand((40, 24), 3)
    calls: list[tuple[int, ...]] = []
    real = native.small_matmul
    monkeypatch.setattr(native, "small_matmul", lambda x, w: calls.append(x.shape) or real(x, w))
    lo, hi = native.SMALL_MATMUL_ROWS
    for shape in [(lo - 1, 24), (lo, 24), (2, 2, 24), (hi, 24), (hi + 1, 24)]:
        x = _rand(shape, 4)
        got = jax.jit(ops.linear)(x, w)
        np.testing.assert_allclose(np.asarray(got), np.asarray(x @ w.T), rtol=1e-5, atol=1e-5)
    assert calls == [(lo, 24), (4, 24), (hi, 24)]
