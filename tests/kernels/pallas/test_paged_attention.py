"""Pallas ragged paged attention (interpret mode, both lowering variants) against the jnp reference.

A mixed batch (decode rows, a prefill span longer than a query tile, a prefix-cached span, a
zero-length row, trailing padding tokens) with GQA (6 query heads on 2 KV heads). Pools are
NaN-poisoned before the context is written at shuffled page ids, and unused page-table entries
hold junk (including out-of-range ids): none of that may leak into the output, which must be
finite everywhere.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax.kernels.attention import paged_attention, write_kv
from tests.kernels.oracles import attention_naive
from radixflow_jax.kernels.pallas import paged_attention as pallas_attn

PAGE_SIZE, NUM_PAGES, MAX_PAGES = 4, 40, 6
HQ, HKV, DIM = 6, 2, 8
SCALE = DIM**-0.5
BLOCK_Q = 8
PAD = 3
ROWS = ((1, 9), (11, 15), (7, 7), (0, 6), (1, 1), (3, 20))  # (span_len, kv_len) per row


class Batch(NamedTuple):
    q: jnp.ndarray
    k_pages: jnp.ndarray
    v_pages: jnp.ndarray
    page_table: jnp.ndarray
    cu_seqlens: jnp.ndarray
    kv_lens: jnp.ndarray


def make_batch(seed: int, rows: tuple[tuple[int, int], ...], dtype: jnp.dtype = jnp.float32) -> Batch:
    rng = np.random.default_rng(seed)
    kv_lens = np.array([ctx for _, ctx in rows], np.int32)
    cu = np.concatenate([[0], np.cumsum([span for span, _ in rows])]).astype(np.int32)
    free = list(rng.permutation(np.arange(1, NUM_PAGES)))
    table = rng.integers(-3, 3 * NUM_PAGES, (len(rows), MAX_PAGES)).astype(np.int32)  # junk, some out of range
    slots = []
    for r, ctx in enumerate(kv_lens):
        for j in range(-(-int(ctx) // PAGE_SIZE)):
            table[r, j] = free.pop()
        pos = np.arange(ctx)
        slots.append(table[r, pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE)
    slot_mapping = np.concatenate(slots).astype(np.int32)
    k, v = rng.standard_normal((2, len(slot_mapping), HKV, DIM)).astype(np.float32)
    poison = jnp.full((NUM_PAGES, PAGE_SIZE, HKV, DIM), jnp.nan, dtype)
    k_pages, v_pages = jax.jit(write_kv)(poison, poison, k, v, slot_mapping)
    q = rng.standard_normal((int(cu[-1]) + PAD, HQ, DIM)).astype(np.float32)
    return Batch(jnp.asarray(q, dtype), k_pages, v_pages, jnp.asarray(table), jnp.asarray(cu), jnp.asarray(kv_lens))


def pallas(batch: Batch, backend: str, **kw: object) -> np.ndarray:
    kernel = functools.partial(
        pallas_attn.paged_attention, scale=SCALE, backend=backend, interpret=True, block_q=BLOCK_Q, **kw
    )
    return np.asarray(jnp.asarray(jax.jit(kernel)(*batch), jnp.float32))


def reference(batch: Batch, **kw: object) -> np.ndarray:
    ref = jax.jit(functools.partial(paged_attention, scale=SCALE, **kw))
    return np.asarray(jnp.asarray(ref(*batch), jnp.float32))


@pytest.fixture(scope="module")
def f32_case() -> tuple[Batch, np.ndarray]:
    batch = make_batch(0, ROWS)
    want = reference(batch)
    np.testing.assert_allclose(want, attention_naive(*batch, scale=SCALE), atol=1e-5)  # the oracle itself
    return batch, want


@pytest.fixture(scope="module")
def bf16_case() -> tuple[Batch, np.ndarray]:
    batch = make_batch(1, ROWS, jnp.bfloat16)
    return batch, reference(batch)


@pytest.fixture(scope="module")
def window_case() -> tuple[Batch, np.ndarray]:
    batch = make_batch(2, ROWS)
    return batch, reference(batch, sliding_window=5, logit_soft_cap=3.0)


def check(got: np.ndarray, want: np.ndarray, tol: float) -> None:
    assert np.isfinite(got).all(), "NaN from poisoned pages or unwritten output"
    np.testing.assert_allclose(got, want, atol=tol, rtol=tol)
    assert np.abs(got[-PAD:]).max() == 0.0  # padding tokens give 0


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_matches_reference_f32(backend: str, f32_case: tuple[Batch, np.ndarray]) -> None:
    batch, want = f32_case
    check(pallas(batch, backend), want, 1e-4)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_matches_reference_bf16(backend: str, bf16_case: tuple[Batch, np.ndarray]) -> None:
    batch, want = bf16_case
    got = jax.jit(
        functools.partial(pallas_attn.paged_attention, scale=SCALE, backend=backend, interpret=True, block_q=BLOCK_Q)
    )(*batch)
    assert got.dtype == jnp.bfloat16
    check(np.asarray(jnp.asarray(got, jnp.float32)), want, 2e-2)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_sliding_window_and_soft_cap(backend: str, window_case: tuple[Batch, np.ndarray]) -> None:
    batch, want = window_case
    check(pallas(batch, backend, sliding_window=5, logit_soft_cap=3.0), want, 1e-4)


def test_gpu_variant_needs_power_of_two_tiles() -> None:
    batch = make_batch(3, ((2, 3),))
    with pytest.raises(ValueError, match="power-of-two"):
        pallas_attn.paged_attention(*batch, scale=SCALE, backend="gpu", interpret=True, block_q=6)
