"""Slow, obviously correct oracles of the kernels' contracts, for tests only: the gated delta rule
and SSD token by token (``lax.scan``), and paged attention densely per row in float64 numpy.
Each has the contract of the package op it checks (``kernels/gated_delta.gated_delta_chunked``,
``kernels/ssd.ssd_chunked``, ``kernels/attention.paged_attention``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from radixflow_jax.kernels.batch import row_of_token
from radixflow_jax.kernels.gated_delta import delta_step, prepare, resolve_scale
from radixflow_jax.kernels.layout import chunk_layout, final_states
from radixflow_jax.kernels.ssd import check_shapes, ssd_step

_F32 = jnp.float32


def gated_delta_naive(
    q: jnp.ndarray,
    k: jnp.ndarray,
    v: jnp.ndarray,
    g: jnp.ndarray,
    beta: jnp.ndarray,
    cu_seqlens: jnp.ndarray,
    initial_state: jnp.ndarray,
    *,
    chunk_size: int = 64,
    scale: float | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Per-token ``lax.scan`` oracle with the same contract as :func:`gated_delta_chunked`.

    Unused chunk slots of ``chunk_states`` are zero. Slow (``T`` sequential steps)."""
    num_tokens = v.shape[0]
    scale = resolve_scale(scale, q.shape[-1])
    cu = cu_seqlens.astype(jnp.int32)
    num_rows = cu.shape[0] - 1
    layout = chunk_layout(cu, num_tokens, chunk_size)
    init = initial_state.astype(jnp.float32)
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    row = jnp.minimum(jnp.searchsorted(cu[1:], t, side="right").astype(jnp.int32), num_rows - 1)
    valid = t < cu[num_rows]
    local = t - cu[row]
    chunk_idx = layout.first_chunk[row] + local // chunk_size
    chunk_end = valid & ((local % chunk_size == chunk_size - 1) | (t == cu[row + 1] - 1))
    num_chunks = layout.row.shape[0]

    def body(
        carry: tuple[jnp.ndarray, jnp.ndarray], xs: tuple[jnp.ndarray, ...]
    ) -> tuple[tuple[jnp.ndarray, jnp.ndarray], jnp.ndarray]:
        state, chunk_buf = carry
        qt, kt, vt, gt, bt, r, ok, is_start, c, is_end = xs
        state = jnp.where(is_start & ok, init[r], state)
        out, new_state = delta_step(state, qt, kt, vt, gt, bt, scale)
        state = jnp.where(ok, new_state, state)
        chunk_buf = chunk_buf.at[c].set(jnp.where(is_end, state, chunk_buf[c]))
        return (state, chunk_buf), jnp.where(ok, out, 0.0)

    qf, kf, vf, gf, bf = prepare(q, k, v, g, beta)
    buf = jnp.zeros((num_chunks,) + init.shape[1:], jnp.float32)
    xs = (qf, kf, vf, gf, bf, row, valid, local == 0, jnp.minimum(chunk_idx, num_chunks - 1), chunk_end)
    (_, chunk_states), out = jax.lax.scan(body, (jnp.zeros_like(init[0]), buf), xs)
    final = final_states(chunk_states, layout, init)
    return out.astype(v.dtype), final, chunk_states


def ssd_naive(
    x: jnp.ndarray,
    dt: jnp.ndarray,
    A: jnp.ndarray,
    B: jnp.ndarray,
    C: jnp.ndarray,
    cu_seqlens: jnp.ndarray,
    initial_state: jnp.ndarray,
    *,
    chunk_size: int = 64,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Same contract as :func:`ssd_chunked`, computed by a per-token ``lax.scan`` (test oracle)."""
    check_shapes(x, dt, A, B, C)
    num_tokens, num_rows = x.shape[0], initial_state.shape[0]
    cu = jnp.asarray(cu_seqlens, jnp.int32)
    A = jnp.asarray(A, _F32)
    row = row_of_token(cu, num_tokens)
    valid = row < num_rows
    safe = jnp.minimum(row, num_rows - 1)
    is_first = valid & (jnp.arange(num_tokens, dtype=jnp.int32) == cu[safe])
    init = jnp.asarray(initial_state, _F32)

    def body(carry: jnp.ndarray, inp: tuple) -> tuple[jnp.ndarray, tuple[jnp.ndarray, jnp.ndarray]]:
        xt, dtt, bt, ct, r, first, ok = inp
        start = jnp.where(first, init[r], carry)
        new, y = ssd_step(start, xt, dtt, A, bt, ct)
        new = jnp.where(ok, new, start)
        return new, (jnp.where(ok, y, 0.0), new)

    _, (y, states) = jax.lax.scan(body, jnp.zeros_like(init[0]), (x, dt, B, C, safe, is_first, valid))
    layout = chunk_layout(cu, num_tokens, chunk_size)
    used = layout.length > 0
    end_tok = jnp.clip(layout.start + layout.length - 1, 0, num_tokens - 1)
    chunk_states = jnp.where(used[:, None, None, None], states[end_tok], 0.0)
    last_tok = jnp.clip(cu[1:] - 1, 0, num_tokens - 1)
    has = cu[1:] > cu[:-1]
    final = jnp.where(has[:, None, None, None], states[last_tok], init)
    return y.astype(x.dtype), final, chunk_states


def attention_naive(
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
) -> np.ndarray:
    """Dense per-row float64 numpy oracle with :func:`paged_attention`'s contract (not traceable)."""
    qn = np.asarray(q, np.float64)
    kp, vp = np.asarray(k_pages, np.float64), np.asarray(v_pages, np.float64)
    table, cu, lens = np.asarray(page_table), np.asarray(cu_seqlens), np.asarray(kv_lens)
    page_size, kv_heads = kp.shape[1], kp.shape[2]
    rep = qn.shape[1] // kv_heads
    flat_k, flat_v = kp.reshape((-1,) + kp.shape[2:]), vp.reshape((-1,) + vp.shape[2:])
    out = np.zeros_like(qn)
    for r in range(table.shape[0]):
        start, stop, ctx = int(cu[r]), int(cu[r + 1]), int(lens[r])
        if stop == start:
            continue
        kv_pos = np.arange(ctx)
        slots = table[r, kv_pos // page_size].astype(np.int64) * page_size + kv_pos % page_size
        keys = np.repeat(flat_k[slots], rep, axis=1)  # [ctx, Hq, D]
        vals = np.repeat(flat_v[slots], rep, axis=1)
        q_pos = ctx - (stop - start) + np.arange(stop - start)
        logits = np.einsum("thd,shd->ths", qn[start:stop], keys) * scale
        if logit_soft_cap is not None:
            logits = logit_soft_cap * np.tanh(logits / logit_soft_cap)
        mask = kv_pos[None, :] <= q_pos[:, None]
        if sliding_window is not None:
            mask &= kv_pos[None, :] > q_pos[:, None] - sliding_window
        logits = np.where(mask[:, None, :], logits, -np.inf)
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        out[start:stop] = np.einsum("ths,shd->thd", probs, vals)
    return out.astype(np.asarray(q).dtype)
