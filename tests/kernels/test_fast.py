"""The faster CPU formulations (``kernels/fast.py``) against their references and oracles."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.linalg import solve_triangular

from radixflow_jax.kernels import fast, ops
from radixflow_jax.kernels.attention import paged_attention
from tests.kernels.oracles import attention_naive
from radixflow_jax.kernels.gated_delta import gated_delta_chunked
from tests.kernels.test_attention import LONG, MIXED, make_batch, max_diff
from tests.kernels.test_gated_delta import LENS, PAD, _check_against_oracle, _cu, _make_inputs, _used_chunks


@pytest.mark.parametrize("c,block", [(64, 16), (8, 16)])
def test_unit_lower_solve_equals_triangular_solve(c: int, block: int) -> None:
    rng = np.random.default_rng(c)
    k = rng.standard_normal((3, 2, c, 8))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    lower = np.tril(0.9 * np.einsum("...id,...jd->...ij", k, k), -1)  # GDN-like: |entries| <= 1
    system = (lower + np.eye(c) + np.triu(rng.standard_normal((c, c)), 1)).astype(np.float32)  # junk above
    rhs = rng.standard_normal((3, 2, c, 5)).astype(np.float32)
    want = solve_triangular(np.tril(system), rhs, lower=True, unit_diagonal=True)
    got = jax.jit(functools.partial(fast.unit_lower_solve, block=block))(system, rhs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "chunk_size,sub_chunk,hk,hv,dk,dv",
    [(4, 4, 2, 4, 8, 6), (4, 2, 2, 4, 8, 6), (64, 64, 1, 2, 8, 8), (64, fast.SUB_CHUNK, 1, 2, 8, 8)],
    ids=["chunk4", "chunk4-sub2", "chunk64", "chunk64-sub"],
)
def test_gated_delta_fast_matches_oracle_and_reference(
    chunk_size: int, sub_chunk: int, hk: int, hv: int, dk: int, dv: int
) -> None:
    """Also in sub-chunks: ``chunk_states`` stays in the contract's layout (``_check_against_oracle``
    compares every used chunk's state with the oracle's state at that chunk's end)."""
    lens = LENS + ((70,) if chunk_size == 64 else ())
    inp = _make_inputs(3, sum(lens) + PAD, len(lens), hk, hv, dk, dv)
    args = (inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], jnp.asarray(_cu(lens)), inp["init"])
    got = jax.jit(functools.partial(fast.gated_delta_chunked, chunk_size=chunk_size, sub_chunk=sub_chunk))(*args)
    _check_against_oracle(got, inp, lens, chunk_size, dk**-0.5)
    ref = jax.jit(functools.partial(gated_delta_chunked, chunk_size=chunk_size))(*args)
    for a, b in zip(got[:2], ref[:2]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=0)
    used = [c for c, _, _ in _used_chunks(lens, chunk_size)]  # unused chunks: any finite placeholder
    np.testing.assert_allclose(np.asarray(got[2])[used], np.asarray(ref[2])[used], atol=1e-4, rtol=0)


@pytest.mark.parametrize("sub_chunk", [4, 2])
@pytest.mark.parametrize("lens", [(4, 4, 8, 4, 0), (4, 5, 1, 4, 3)], ids=["on-grid", "off-grid"])
def test_gated_delta_fast_short_rows(lens: tuple[int, ...], sub_chunk: int) -> None:
    """Rounds of short rows compute the intra-chunk terms of the first ``ceil(T / C)`` chunks and
    the rest only when a row ends off the grid (``fast._used_terms``): both cases against the oracle
    and the reference."""
    inp = _make_inputs(5, sum(lens) + PAD, len(lens), 2, 4, 8, 6)
    args = (inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], jnp.asarray(_cu(lens)), inp["init"])
    got = jax.jit(functools.partial(fast.gated_delta_chunked, chunk_size=4, sub_chunk=sub_chunk))(*args)
    _check_against_oracle(got, inp, lens, 4, 8**-0.5)
    ref = jax.jit(functools.partial(gated_delta_chunked, chunk_size=4))(*args)
    for a, b in zip(got[:2], ref[:2]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "rows,window,cap,block_q",
    [
        (MIXED, None, None, None),
        (MIXED, 3, 1.5, 2),
        (LONG, 5, None, 2),
        (((1, 9), (1, 13), (1, 1)), None, 2.0, None),
        (((2, 9), (4, 13), (2, 2)), None, None, 2),  # rows end on the block grid: the tail blocks are skipped
    ],
    ids=["mixed", "mixed-window-cap", "long-window", "decode", "on-grid"],
)
def test_paged_attention_fast_matches_oracle(rows: tuple, window: int | None, cap: float | None, block_q) -> None:
    b = make_batch(11, rows)
    if rows[0][0] == 1 and all(s == 1 for s, _ in rows):  # decode: one token per row, no padding tokens
        b = b._replace(q=b.q[: len(rows)])
    kw = dict(scale=0.3, sliding_window=window, logit_soft_cap=cap)
    call = jax.jit(functools.partial(fast.paged_attention, block_q=block_q, pages_per_step=3, **kw))
    got = call(b.q, b.k_pages, b.v_pages, b.page_table, b.cu_seqlens, b.kv_lens)
    want = attention_naive(b.q, b.k_pages, b.v_pages, b.page_table, b.cu_seqlens, b.kv_lens, **kw)
    assert np.all(np.isfinite(np.asarray(got)))
    assert max_diff(got, want) < 1e-4
    ref_call = jax.jit(functools.partial(paged_attention, **kw))
    ref = ref_call(b.q, b.k_pages, b.v_pages, b.page_table, b.cu_seqlens, b.kv_lens)
    assert max_diff(got, ref) < 1e-4


def test_backends_pick_the_fast_forms_on_cpu() -> None:
    with ops.use_backend("reference"):
        assert ops.resolve("gated_delta_chunked") is gated_delta_chunked
        assert ops.resolve("paged_attention") is paged_attention
    for name in ("xla", "auto"):
        with ops.use_backend(name):
            assert ops.resolve("gated_delta_chunked") is fast.gated_delta_chunked
            assert ops.resolve("paged_attention") is fast.paged_attention
            assert ops.resolve("ssd_decode") is ops._REFERENCE["ssd_decode"]
