"""On-device sampling (``runner/sampling.sample``) on hand-made logits: greedy is exact argmax, the
filters keep exactly what they should, draws are a pure function of (seed, position), and the
temperature-1 distribution follows the softmax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax.runner.sampling import sample

V = 64


def _logits(rows: int, seed: int = 0, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=(rows, V)) * scale).astype(np.float32)


def _sample(logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, position=0) -> np.ndarray:
    logits = np.asarray(logits, np.float32)
    r = logits.shape[0]

    def col(value, dtype):
        return jnp.asarray(np.broadcast_to(np.asarray(value, dtype), (r,)).copy())

    out = sample(
        jnp.asarray(logits), col(temperature, np.float32), col(top_k, np.int32), col(top_p, np.float32),
        col(min_p, np.float32), col(seed, np.uint32), col(position, np.int32),
    )  # fmt: skip
    assert out.dtype == jnp.int32 and out.shape == (r,)
    return np.asarray(out)


_sample_jit = jax.jit(sample)


def test_temperature_zero_is_exact_argmax() -> None:
    logits = _logits(32)
    # near-ties: the argmax must still be exact (no noise at temperature 0)
    logits[0, :] = 0.0
    logits[0, 17] = 1e-6
    logits[1, 5] = logits[1].max() + 1e-5
    expected = logits.argmax(axis=-1)
    for seed in range(5):
        got = _sample(logits, temperature=0.0, seed=seed, position=np.arange(32), top_k=3, top_p=0.5, min_p=0.2)
        np.testing.assert_array_equal(got, expected)
    assert _sample(logits, temperature=0.0)[0] == 17


def test_top_k_one_is_argmax_at_any_temperature() -> None:
    logits = _logits(16, seed=1)
    expected = logits.argmax(axis=-1)
    for temperature in (0.3, 1.0, 5.0, 100.0):
        for seed in range(4):
            got = _sample(logits, temperature=temperature, top_k=1, seed=seed, position=np.arange(16) + seed)
            np.testing.assert_array_equal(got, expected)


def test_tiny_top_p_keeps_only_the_max() -> None:
    logits = _logits(16, seed=2, scale=0.5)  # flat-ish: without the filter draws would spread
    expected = logits.argmax(axis=-1)
    for seed in range(4):
        got = _sample(logits, temperature=2.0, top_p=1e-4, seed=seed, position=np.arange(16))
        np.testing.assert_array_equal(got, expected)


def test_min_p_near_one_keeps_only_the_max() -> None:
    logits = _logits(16, seed=3, scale=0.5)
    expected = logits.argmax(axis=-1)
    for min_p in (0.999, 1.0):
        for seed in range(4):
            got = _sample(logits, temperature=2.0, min_p=min_p, seed=seed, position=np.arange(16))
            np.testing.assert_array_equal(got, expected)


def test_top_k_two_draws_only_the_top_two() -> None:
    base = _logits(1, seed=4, scale=0.3)[0]  # flat: the top two do not dominate on their own
    n = 512
    logits = np.tile(base, (n, 1))
    top2 = set(np.argsort(base)[-2:].tolist())
    got = _sample(logits, temperature=1.5, top_k=2, seed=np.arange(n), position=3)
    assert set(got.tolist()) == top2  # only the top two, and both of them
    # without the filter the same seeds reach many tokens
    free = _sample(logits, temperature=1.5, seed=np.arange(n), position=3)
    assert len(set(free.tolist())) > 10


def test_top_p_and_min_p_keep_the_expected_set() -> None:
    probs = np.array([0.64, 0.24, 0.09, 0.03], np.float64)
    logits = np.full((1, V), -1e9, np.float32)
    logits[0, [10, 20, 30, 40]] = np.log(probs)
    n = 512
    tiled = np.tile(logits, (n, 1))
    # top_p 0.7: 0.64 < 0.7 so the second token is needed, the third is not (0.88 >= 0.7)
    got = set(_sample(tiled, top_p=0.7, seed=np.arange(n)).tolist())
    assert got == {10, 20}
    # min_p 0.3: keep p >= 0.3 * 0.64 = 0.192
    got = set(_sample(tiled, min_p=0.3, seed=np.arange(n)).tolist())
    assert got == {10, 20}
    got = set(_sample(tiled, min_p=0.1, seed=np.arange(n)).tolist())
    assert got == {10, 20, 30}
    got = set(_sample(tiled, seed=np.arange(n)).tolist())
    assert got == {10, 20, 30, 40}


def test_top_p_one_is_off_even_for_peaked_logits() -> None:
    """``top_p == 1`` must not mask anything, even when float32 cumulative sums saturate at 1."""
    logits = _logits(1, seed=5, scale=20.0)
    from radixflow_jax.runner.sampling import _filter

    masked = _filter(jnp.asarray(logits[0] / 0.5), jnp.int32(0), jnp.float32(1.0), jnp.float32(0.0))
    assert not bool(jnp.any(jnp.isinf(masked)))


def test_same_seed_and_position_gives_same_token() -> None:
    logits = np.tile(_logits(1, seed=6, scale=0.5), (64, 1))
    a = _sample(logits, seed=123, position=np.arange(64))
    b = _sample(logits, seed=123, position=np.arange(64))
    np.testing.assert_array_equal(a, b)
    # row order / batch composition does not matter: row i only depends on (seed, position)
    perm = np.random.default_rng(0).permutation(64)
    c = _sample(logits, seed=123, position=np.arange(64)[perm])
    np.testing.assert_array_equal(c, a[perm])
    # a row alone in a batch of one draws the same token
    for i in (0, 7, 63):
        assert _sample(logits[:1], seed=123, position=i)[0] == a[i]
    # different positions spread over the vocabulary; a different seed gives a different stream
    assert len(set(a.tolist())) > 15
    d = _sample(logits, seed=124, position=np.arange(64))
    assert (d != a).sum() > 32


def test_temperature_one_follows_softmax() -> None:
    base = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0], np.float32)
    logits = np.full((1, V), -1e9, np.float32)
    logits[0, : len(base)] = base
    n = 4000
    tiled = jnp.asarray(np.tile(logits, (n, 1)))
    got = np.asarray(
        _sample_jit(
            tiled, jnp.ones(n, jnp.float32), jnp.zeros(n, jnp.int32), jnp.ones(n, jnp.float32),
            jnp.zeros(n, jnp.float32), jnp.arange(n, dtype=jnp.uint32), jnp.full(n, 11, jnp.int32),
        )  # fmt: skip
    )
    counts = np.bincount(got, minlength=V)
    assert counts[len(base) :].sum() == 0
    expected = np.exp(base - base.max())
    expected = expected / expected.sum() * n
    chi2 = float(((counts[: len(base)] - expected) ** 2 / expected).sum())
    assert chi2 < 30.0, (counts[: len(base)], expected)  # 5 dof: p(chi2 > 30) ~ 1e-5


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_scales_the_distribution(temperature: float) -> None:
    base = np.array([1.0, 0.0], np.float32)
    logits = np.full((1, V), -1e9, np.float32)
    logits[0, :2] = base
    n = 4000
    got = _sample(np.tile(logits, (n, 1)), temperature=temperature, seed=np.arange(n), position=5)
    p0 = 1.0 / (1.0 + np.exp(-1.0 / temperature))
    frac = (got == 0).mean()
    assert abs(frac - p0) < 4 * np.sqrt(p0 * (1 - p0) / n), (frac, p0)


def test_logit_bias_entries_apply_until_their_position() -> None:
    from radixflow_jax.runner.sampling import apply_bias

    logits = jnp.asarray(_logits(3))
    ids = jnp.asarray([[5, 9, -1], [7, -1, -1], [-1, -1, -1]], jnp.int32)
    vals = jnp.asarray([[100.0, -np.inf, 0.0], [-np.inf, 0.0, 0.0], [0.0, 0.0, 0.0]], jnp.float32)
    until = jnp.asarray([[2**31 - 1, 4, 0], [3, 0, 0], [0, 0, 0]], jnp.int32)
    early = np.asarray(jax.jit(apply_bias)(logits, ids, vals, until, jnp.asarray([3, 2, 0], jnp.int32)))
    base = np.asarray(logits)
    assert early[0, 5] == pytest.approx(base[0, 5] + 100) and early[0, 9] == -np.inf and early[1, 7] == -np.inf
    np.testing.assert_array_equal(np.delete(early[0], [5, 9]), np.delete(base[0], [5, 9]))
    np.testing.assert_array_equal(early[2], base[2])  # a row without entries is bit-identical
    late = np.asarray(apply_bias(logits, ids, vals, until, jnp.asarray([4, 3, 0], jnp.int32)))
    assert late[0, 9] == base[0, 9] and late[1, 7] == base[1, 7]  # the min_tokens bans have run out
    none = apply_bias(logits, jnp.full((3, 3), -1, jnp.int32), vals, until, jnp.zeros(3, jnp.int32))
    np.testing.assert_array_equal(np.asarray(none), base)
