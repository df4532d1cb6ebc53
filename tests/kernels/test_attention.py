"""Tests of the paged attention reference kernels.

Pools are poisoned with NaN before use, page ids are shuffled and scattered, and unused
page-table entries point at arbitrary (poisoned) pages: none of that may leak into outputs.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax.kernels.attention import paged_attention, positions_from_batch, write_kv
from tests.kernels.oracles import attention_naive

PAGE_SIZE, NUM_PAGES, MAX_PAGES = 4, 40, 6
HQ, HKV, DIM = 6, 2, 8
PAD = 3
MIXED = ((1, 9), (5, 13), (7, 7), (0, 6), (1, 1), (3, 20))  # (span_len, kv_len) per row
LONG = ((4, 21), (2, 17))  # no short rows: the sliding window lets the loop skip columns

attend = jax.jit(paged_attention, static_argnames=("scale", "sliding_window", "logit_soft_cap"))


class Batch(NamedTuple):
    q: np.ndarray
    k_pages: jnp.ndarray
    v_pages: jnp.ndarray
    page_table: np.ndarray
    cu_seqlens: np.ndarray
    kv_lens: np.ndarray


def make_batch(seed: int, rows: tuple[tuple[int, int], ...], dtype: jnp.dtype = jnp.float32) -> Batch:
    """Writes every row's full KV history into NaN-poisoned pools at shuffled page ids."""
    rng = np.random.default_rng(seed)
    spans = [s for s, _ in rows]
    kv_lens = np.array([c for _, c in rows], np.int32)
    cu = np.concatenate([[0], np.cumsum(spans)]).astype(np.int32)
    free = list(rng.permutation(np.arange(1, NUM_PAGES)))
    table = rng.integers(0, NUM_PAGES, (len(rows), MAX_PAGES)).astype(np.int32)  # junk entries
    slots = []
    for r, ctx in enumerate(kv_lens):
        for j in range(-(-int(ctx) // PAGE_SIZE)):
            table[r, j] = free.pop()
        pos = np.arange(ctx)
        slots.append(table[r, pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE)
    slot_mapping = np.concatenate(slots + [np.arange(PAD) % PAGE_SIZE]).astype(np.int32)  # padding -> page 0
    n = len(slot_mapping)
    k, v = rng.standard_normal((2, n, HKV, DIM)).astype(np.float32)
    poison = jnp.full((NUM_PAGES, PAGE_SIZE, HKV, DIM), jnp.nan, dtype)
    k_pages, v_pages = jax.jit(write_kv)(poison, poison, k, v, slot_mapping)
    q = rng.standard_normal((int(cu[-1]) + PAD, HQ, DIM)).astype(np.float32)
    return Batch(np.asarray(jnp.asarray(q, dtype)), k_pages, v_pages, table, cu, kv_lens)


def max_diff(a: np.ndarray | jnp.ndarray, b: np.ndarray | jnp.ndarray) -> float:
    diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return float(np.max(diff, initial=0.0))


@pytest.mark.parametrize("rows", [MIXED, LONG], ids=["mixed", "long"])
@pytest.mark.parametrize(("window", "cap"), [(None, None), (5, None), (None, 2.0), (3, 1.5)])
def test_matches_dense_oracle(rows: tuple, window: int | None, cap: float | None) -> None:
    batch = make_batch(len(rows) + (window or 0), rows)
    scale = 0.7 if cap else DIM**-0.5
    out = attend(*batch, scale=scale, sliding_window=window, logit_soft_cap=cap)
    ref = attention_naive(*batch, scale=scale, sliding_window=window, logit_soft_cap=cap)
    assert out.shape == batch.q.shape and out.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(out)))
    assert max_diff(out, ref) <= 1e-5
    assert np.all(np.asarray(out)[int(batch.cu_seqlens[-1]) :] == 0)


def test_single_key_outputs_its_value() -> None:
    """kv_len 1 rows (and window 1 everywhere) attend to exactly one value vector."""
    batch = make_batch(3, MIXED)
    out = np.asarray(attend(*batch, scale=1.0, sliding_window=1))
    row, pos, valid = (np.asarray(a) for a in positions_from_batch(batch.cu_seqlens, batch.kv_lens, len(batch.q)))
    flat_v = np.asarray(batch.v_pages).reshape(-1, HKV, DIM)
    for t in np.flatnonzero(valid):
        slot = batch.page_table[row[t], pos[t] // PAGE_SIZE] * PAGE_SIZE + pos[t] % PAGE_SIZE
        np.testing.assert_allclose(out[t], np.repeat(flat_v[slot], HQ // HKV, axis=0), atol=1e-6)


def test_bfloat16_close_to_f32_oracle() -> None:
    batch = make_batch(5, MIXED, jnp.bfloat16)
    out = attend(*batch, scale=DIM**-0.5, logit_soft_cap=3.0)
    ref = attention_naive(*batch._replace(q=batch.q.astype(np.float32)), scale=DIM**-0.5, logit_soft_cap=3.0)
    assert out.dtype == jnp.bfloat16
    assert max_diff(out, ref) <= 2e-2


def test_positions_from_batch() -> None:
    cu = np.array([0, 1, 4, 4, 6], np.int32)
    kv_lens = np.array([9, 3, 5, 12], np.int32)
    row, pos, valid = jax.jit(positions_from_batch, static_argnums=2)(cu, kv_lens, 8)
    np.testing.assert_array_equal(row, [0, 1, 1, 1, 3, 3, 4, 4])
    np.testing.assert_array_equal(pos, [8, 0, 1, 2, 10, 11, 0, 0])
    np.testing.assert_array_equal(valid, [True] * 6 + [False] * 2)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_write_kv_places_tokens_and_leaves_rest(dtype: jnp.dtype) -> None:
    rng = np.random.default_rng(23)
    pool_shape = (NUM_PAGES, PAGE_SIZE, HKV, DIM)
    k_pool = np.where(rng.random(pool_shape) < 0.5, np.nan, 1e30).astype(np.float32)
    v_pool = np.full(pool_shape, -7e29, np.float32)
    real = rng.choice(np.arange(PAGE_SIZE, NUM_PAGES * PAGE_SIZE), 11, replace=False).astype(np.int32)
    slots = np.concatenate([real, [0, 1, 1, 3]]).astype(np.int32)  # padding into page 0, duplicates
    k, v = rng.standard_normal((2, len(slots), HKV, DIM)).astype(np.float32)
    new_k, new_v = jax.jit(write_kv)(jnp.asarray(k_pool, dtype), jnp.asarray(v_pool, dtype), k, v, slots)
    assert new_k.shape == pool_shape and new_k.dtype == dtype and new_v.dtype == dtype
    flat_k = np.asarray(new_k, np.float32).reshape(-1, HKV, DIM)
    flat_v = np.asarray(new_v, np.float32).reshape(-1, HKV, DIM)
    expect_k = np.asarray(jnp.asarray(k, dtype), np.float32)
    expect_v = np.asarray(jnp.asarray(v, dtype), np.float32)
    np.testing.assert_array_equal(flat_k[real], expect_k[: len(real)])
    np.testing.assert_array_equal(flat_v[real], expect_v[: len(real)])
    untouched = np.ones(NUM_PAGES * PAGE_SIZE, bool)
    untouched[real] = False
    untouched[:PAGE_SIZE] = False  # page 0 is the padding sink
    old_k = np.asarray(jnp.asarray(k_pool, dtype), np.float32).reshape(-1, HKV, DIM)
    old_v = np.asarray(jnp.asarray(v_pool, dtype), np.float32).reshape(-1, HKV, DIM)
    np.testing.assert_array_equal(flat_k[untouched], old_k[untouched])  # NaN == NaN here
    np.testing.assert_array_equal(flat_v[untouched], old_v[untouched])
