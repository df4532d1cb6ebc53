"""Tests of the SSD reference kernels against a per-token scan and a float64 numpy loop.

Invariants checked: chunked == naive (outputs, final states, every used chunk state), chunk
state ``first_chunk[r] + j`` equals row ``r``'s state after ``min((j + 1) * Q, len)`` tokens,
state carried across two spans equals one span, decode equals one naive step, padding gives 0.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixflow_jax.kernels.layout import chunk_layout
from radixflow_jax.kernels.ssd import ssd_chunked, ssd_decode
from tests.kernels.oracles import ssd_naive

TOL = 1e-4
LENS = (5, 0, 1, 17, 9, 1, 12)  # off the chunk grid, a zero-length row, one-token rows
PAD = 3

chunked = jax.jit(ssd_chunked, static_argnames="chunk_size")
naive = jax.jit(ssd_naive, static_argnames="chunk_size")


def make_inputs(
    seed: int, lens: tuple[int, ...], pad: int, heads: int, p: int, n: int, groups: int
) -> dict[str, np.ndarray]:
    """Random seeded SSD inputs (never zeros): dt = softplus(randn), A = -exp(randn)."""
    rng = np.random.default_rng(seed)
    tokens = sum(lens) + pad
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    return {
        "x": f32(tokens, heads, p),
        "dt": np.log1p(np.exp(f32(tokens, heads))).astype(np.float32),
        "A": -np.exp(f32(heads)).astype(np.float32),
        "B": f32(tokens, groups, n),
        "C": f32(tokens, groups, n),
        "cu_seqlens": np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
        "initial_state": f32(len(lens), heads, p, n),
    }


def numpy_oracle(inp: dict[str, np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Float64 loop: returns (y [T, H, P], per-row list of states [len + 1, H, P, N])."""
    x, dt, a = (inp[k].astype(np.float64) for k in ("x", "dt", "A"))
    b, c, cu = inp["B"].astype(np.float64), inp["C"].astype(np.float64), inp["cu_seqlens"]
    rep = x.shape[1] // b.shape[1]
    y = np.zeros_like(x)
    states = []
    for r in range(len(cu) - 1):
        h = inp["initial_state"][r].astype(np.float64)
        row_states = [h]
        for t in range(cu[r], cu[r + 1]):
            bt, ct = np.repeat(b[t], rep, axis=0), np.repeat(c[t], rep, axis=0)
            h = np.exp(dt[t] * a)[:, None, None] * h + (dt[t][:, None] * x[t])[:, :, None] * bt[:, None, :]
            y[t] = np.einsum("hpn,hn->hp", h, ct)
            row_states.append(h)
        states.append(np.stack(row_states))
    return y, states


def used_chunks(lens: tuple[int, ...], q: int) -> list[tuple[int, int, int]]:
    """(chunk index, row, tokens so far) of every used chunk, derived without chunk_layout."""
    out, idx = [], 0
    for r, length in enumerate(lens):
        for j in range(-(-length // q)):
            out.append((idx, r, min((j + 1) * q, length)))
            idx += 1
    return out


def max_diff(a: jnp.ndarray | np.ndarray, b: jnp.ndarray | np.ndarray) -> float:
    diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return float(np.max(diff, initial=0.0))


@pytest.mark.parametrize("chunk_size", [4, 8, 16])
@pytest.mark.parametrize("groups", [1, 2])
def test_chunked_matches_naive(chunk_size: int, groups: int) -> None:
    inp = make_inputs(chunk_size + groups, LENS, PAD, heads=4, p=3, n=5, groups=groups)
    y, final, cstates = chunked(**inp, chunk_size=chunk_size)
    y_ref, final_ref, cstates_ref = naive(**inp, chunk_size=chunk_size)
    assert y.shape == inp["x"].shape and y.dtype == jnp.float32
    assert final.shape == inp["initial_state"].shape and final.dtype == jnp.float32
    assert max_diff(y, y_ref) <= TOL and max_diff(final, final_ref) <= TOL
    assert np.all(np.asarray(y)[sum(LENS) :] == 0) and np.all(np.isfinite(np.asarray(cstates)))
    np.testing.assert_array_equal(np.asarray(final)[1], inp["initial_state"][1])  # zero-length row
    y64, states64 = numpy_oracle(inp)
    assert max_diff(y, y64) <= TOL and max_diff(y_ref, y64) <= TOL
    for idx, row, done in used_chunks(LENS, chunk_size):
        assert max_diff(cstates[idx], states64[row][done]) <= TOL, (idx, row, done)
        assert max_diff(cstates_ref[idx], states64[row][done]) <= TOL, (idx, row, done)
    for r, length in enumerate(LENS):
        assert max_diff(final[r], states64[r][length]) <= TOL


def test_two_spans_equal_one_span() -> None:
    lens, split = (13, 1, 22), (6, 1, 9)
    inp = make_inputs(7, lens, 0, heads=6, p=2, n=4, groups=3)
    y_all, final_all, _ = chunked(**inp, chunk_size=4)
    cu = inp["cu_seqlens"]
    first = np.concatenate([np.arange(cu[r], cu[r] + split[r]) for r in range(len(lens))])
    second = np.concatenate([np.arange(cu[r] + split[r], cu[r + 1]) for r in range(len(lens))])
    tail = tuple(l - s for l, s in zip(lens, split))

    def part(idx: np.ndarray, part_lens: tuple[int, ...], state: np.ndarray) -> tuple:
        sub = {k: inp[k][idx] for k in ("x", "dt", "B", "C")}
        cu_part = np.concatenate([[0], np.cumsum(part_lens)]).astype(np.int32)
        return chunked(**sub, A=inp["A"], cu_seqlens=cu_part, initial_state=state, chunk_size=4)

    y1, mid, _ = part(first, split, inp["initial_state"])
    y2, final, _ = part(second, tail, np.asarray(mid))
    assert max_diff(y1, np.asarray(y_all)[first]) <= TOL
    assert max_diff(y2, np.asarray(y_all)[second]) <= TOL
    assert max_diff(final, final_all) <= TOL


def test_decode_equals_naive_step() -> None:
    rows = 5
    inp = make_inputs(11, (1,) * rows, 0, heads=4, p=3, n=6, groups=2)
    y, new = jax.jit(ssd_decode)(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], inp["initial_state"])
    y_ref, final_ref, _ = naive(**inp, chunk_size=4)
    assert y.shape == (rows, 4, 3) and new.shape == (rows, 4, 3, 6)
    assert max_diff(y, y_ref) <= TOL and max_diff(new, final_ref) <= TOL


def test_bfloat16_inputs_close_to_f32() -> None:
    """bf16 x/B/C (f32 dt, A, state) vs the f32 oracle on the unrounded inputs, |y| ~ 1."""
    inp = make_inputs(13, LENS, PAD, heads=4, p=3, n=5, groups=2)
    inp["x"], inp["initial_state"] = inp["x"] * np.float32(0.1), inp["initial_state"] * np.float32(0.1)
    low = dict(inp, **{k: jnp.asarray(inp[k], jnp.bfloat16) for k in ("x", "B", "C")})
    y, final, _ = chunked(**low, chunk_size=8)
    y_ref, final_ref, _ = naive(**inp, chunk_size=8)
    assert y.dtype == jnp.bfloat16 and final.dtype == jnp.float32
    assert float(np.max(np.abs(np.asarray(y_ref)))) > 0.5  # the bound below is not vacuous
    assert max_diff(y, y_ref) <= 2e-2 and max_diff(final, final_ref) <= 2e-2


def test_eager_matches_jit() -> None:
    inp = make_inputs(17, (3, 6), 2, heads=2, p=2, n=3, groups=1)
    eager = ssd_chunked(**inp, chunk_size=4)
    jitted = chunked(**inp, chunk_size=4)
    for a, b in zip(eager, jitted):
        assert max_diff(a, b) <= 1e-6


@functools.lru_cache(maxsize=None)
def _fixed_batch_inputs() -> dict[str, np.ndarray]:
    return make_inputs(19, (24,), 0, heads=2, p=2, n=3, groups=2)


@settings(max_examples=12, deadline=None)
@given(cuts=st.lists(st.integers(0, 24), min_size=4, max_size=4))
def test_random_ragged_layouts(cuts: list[int]) -> None:
    """Fixed static shapes (T=24, R=4, Q=4) so only cu_seqlens varies: one compile."""
    cu = np.array([0] + sorted(cuts), np.int32)
    base = _fixed_batch_inputs()
    rng = np.random.default_rng(int(cu.sum()))
    inp = dict(base, cu_seqlens=cu, initial_state=rng.standard_normal((4, 2, 2, 3)).astype(np.float32))
    y, final, cstates = chunked(**inp, chunk_size=4)
    y_ref, final_ref, cstates_ref = naive(**inp, chunk_size=4)
    assert max_diff(y, y_ref) <= TOL and max_diff(final, final_ref) <= TOL
    used = np.asarray(chunk_layout(jnp.asarray(cu), 24, 4).length) > 0
    assert max_diff(np.asarray(cstates)[used], np.asarray(cstates_ref)[used]) <= TOL
    assert np.all(np.asarray(y)[cu[-1] :] == 0)
