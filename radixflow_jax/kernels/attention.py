"""Paged attention reference kernels in pure ``jax.numpy`` (tests check them against the dense
float64 oracle in ``tests/kernels/oracles.py``).

KV pools ``k_pages``/``v_pages`` are ``[num_pages, page_size, Hkv, D]``; a flat slot is
``page_id * page_size + offset``. Page 0 is a reserved padding sink: padding tokens write to
slots ``0 .. page_size - 1`` and nothing ever reads them as real context.

A batch is packed as in :mod:`radixflow_jax.kernels.batch`: row ``r`` owns query tokens
``cu_seqlens[r] : cu_seqlens[r + 1]`` and ``kv_lens[r]`` counts its whole context *including*
the span (whose KV is already written). Decode rows (1 token) and prefill rows (many tokens,
possibly continuing a cached prefix) mix freely.

Invariants:
  * Token at absolute position ``pos`` attends to KV positions ``0 .. pos`` (with a sliding
    window ``W``: only ``pos - W < kv_pos <= pos``), read through ``page_table[row]``.
  * Page-table entries and page slots that are never attended may hold anything (even NaN);
    they cannot affect the output.
  * Softmax and accumulation in float32 (matmuls at ``Precision.HIGHEST``); output in q's
    dtype; padding tokens output 0.
  * Memory per loop step is ``O(T * page_size * Hkv * D)``, independent of context length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from radixflow_jax.kernels.batch import positions_from_batch

__all__ = ["paged_attention", "positions_from_batch", "write_kv"]

_HI = jax.lax.Precision.HIGHEST
_F32 = jnp.float32
NEG_INF = -1e30  # finite "minus infinity": keeps fully masked steps free of NaN


def write_kv(
    k_pages: jnp.ndarray, v_pages: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, slot_mapping: jnp.ndarray
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Writes ``k, v [T, Hkv, D]`` into flat slots ``slot_mapping [T]``; returns the new pools.

    Functional (``.at[].set``) so callers can donate the pools. Duplicate slots (padding tokens
    aimed at page 0) resolve arbitrarily; every other slot is left untouched.
    """
    k_pages, v_pages = jnp.asarray(k_pages), jnp.asarray(v_pages)
    num_pages, page_size = k_pages.shape[:2]
    flat_shape = (num_pages * page_size,) + k_pages.shape[2:]
    slots = jnp.asarray(slot_mapping, jnp.int32)
    new_k = k_pages.reshape(flat_shape).at[slots].set(k.astype(k_pages.dtype), mode="drop")
    new_v = v_pages.reshape(flat_shape).at[slots].set(v.astype(v_pages.dtype), mode="drop")
    return new_k.reshape(k_pages.shape), new_v.reshape(v_pages.shape)


def soft_cap(logits: jnp.ndarray, cap: float | None) -> jnp.ndarray:
    return logits if cap is None else cap * jnp.tanh(logits / cap)


def column_range(
    positions: jnp.ndarray, valid: jnp.ndarray, page_size: int, max_pages: int, window: int | None
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Page-table columns ``[lo, hi)`` that any valid token can attend to (traced scalars)."""
    last = jnp.max(jnp.where(valid, positions, -1))
    hi = jnp.minimum(last // page_size + 1, max_pages)
    if window is None:
        return jnp.int32(0), hi.astype(jnp.int32)
    first = jnp.min(jnp.where(valid, jnp.maximum(positions - window + 1, 0), jnp.iinfo(jnp.int32).max))
    lo = jnp.minimum(first // page_size, hi)
    return lo.astype(jnp.int32), hi.astype(jnp.int32)


def paged_attention(
    q: jnp.ndarray,
    k_pages: jnp.ndarray,
    v_pages: jnp.ndarray,
    page_table: jnp.ndarray,
    cu_seqlens: jnp.ndarray,
    kv_lens: jnp.ndarray,
    *,
    scale: float,
    sliding_window: int | None = None,
    logit_soft_cap: float | None = None,
) -> jnp.ndarray:
    """Causal paged attention over a packed batch: q [T, Hq, D] -> out [T, Hq, D] (q's dtype).

    Online (flash-style) softmax over page-table columns: each step gathers one page per token.
    Logits are ``scale * q.k``, then ``cap * tanh(logits / cap)`` when ``logit_soft_cap`` is set.
    """
    k_pages, v_pages, page_table = jnp.asarray(k_pages), jnp.asarray(v_pages), jnp.asarray(page_table, jnp.int32)
    num_tokens, q_heads, dim = q.shape
    page_size, kv_heads = k_pages.shape[1], k_pages.shape[2]
    if q_heads % kv_heads:
        raise ValueError(f"query heads {q_heads} not divisible by kv heads {kv_heads}")
    rep = q_heads // kv_heads
    num_rows, max_pages = page_table.shape
    row, pos, valid = positions_from_batch(cu_seqlens, kv_lens, num_tokens)
    tok_pages = page_table[jnp.minimum(row, num_rows - 1)]  # [T, max_pages]
    qf = jnp.asarray(q, _F32).reshape(num_tokens, kv_heads, rep, dim) * scale
    offsets = jnp.arange(page_size, dtype=jnp.int32)

    def body(col: jnp.ndarray, carry: tuple) -> tuple:
        m, l, acc = carry  # [T, Hkv, rep], [T, Hkv, rep], [T, Hkv, rep, D]
        ids = jnp.clip(jax.lax.dynamic_index_in_dim(tok_pages, col, axis=1, keepdims=False), 0, k_pages.shape[0] - 1)
        kv_pos = col * page_size + offsets  # [page_size]
        mask = valid[:, None] & (kv_pos[None, :] <= pos[:, None])  # [T, page_size]
        if sliding_window is not None:
            mask = mask & (kv_pos[None, :] > pos[:, None] - sliding_window)
        k = k_pages[ids].astype(_F32)  # [T, page_size, Hkv, D]
        v = jnp.where(mask[:, :, None, None], v_pages[ids].astype(_F32), 0.0)
        s = soft_cap(jnp.einsum("tkrd,tskd->tkrs", qf, k, precision=_HI), logit_soft_cap)
        s = jnp.where(mask[:, None, None, :], s, NEG_INF)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.where(mask[:, None, None, :], jnp.exp(s - m_new[..., None]), 0.0)
        corr = jnp.exp(m - m_new)
        acc = corr[..., None] * acc + jnp.einsum("tkrs,tskd->tkrd", p, v, precision=_HI)
        return m_new, corr * l + jnp.sum(p, axis=-1), acc

    stats_shape = (num_tokens, kv_heads, rep)
    init = (jnp.full(stats_shape, NEG_INF, _F32), jnp.zeros(stats_shape, _F32), jnp.zeros(stats_shape + (dim,), _F32))
    lo, hi = column_range(pos, valid, page_size, max_pages, sliding_window)
    _, l, acc = jax.lax.fori_loop(lo, hi, body, init)
    out = jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)
    return out.reshape(num_tokens, q_heads, dim).astype(q.dtype)
