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


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 17, 25, 49, 70])
@pytest.mark.parametrize("out_features", [1, 5, 203])
@pytest.mark.parametrize("in_features", [5, 70])
def test_small_matmul_matches_the_dot(rows: int, out_features: int, in_features: int) -> None:
    """Every group size of rows (one group up to 8 rows on AVX-512, 4 on AVX2; above that groups
    of up to 6 or 4, with the later groups reading the weights back from cache), a tile of fewer
    weight rows at a block edge (5 = 4 + 1), a second task of 4 blocks of 48 features with a
    partial last block and tile (203 = 4 * 48 + 4 + 4 + 3), and a K that is not a multiple of the
    vector width (70 = 64 + 6) or shorter than one vector (5)."""
    x, w = _rand((rows, in_features), 1), _rand((out_features, in_features), 2)
    got = jax.jit(native.small_matmul)(x, w)
    assert got.shape == (rows, out_features) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(x @ w.T), rtol=1e-5, atol=1e-5)


def test_a_row_does_not_depend_on_the_others() -> None:
    """Each output is the same sum in the same order whatever the number of rows and the tile that
    computes it (one group, later groups, a narrower tile at a block edge), so a row's result is
    bit for bit the same in a round of 3 rows and in one of 17."""
    x, w = _rand((17, 70), 5), _rand((50, 70), 6)
    run = jax.jit(native.small_matmul)
    full = np.asarray(run(x, w))
    for lo, hi in [(0, 3), (2, 9), (11, 17)]:
        np.testing.assert_array_equal(np.asarray(run(x[lo:hi], w)), full[lo:hi])


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
