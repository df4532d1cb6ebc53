"""Faster XLA formulations of the hot ops for the CPU (docs/design.md, "Kernels").

Each function has the exact signature and contract of its reference in ``kernels/`` (the oracle)
and is tested against it (``tests/kernels/test_fast.py``); ``kernels/ops.py`` picks them under the
``auto`` and ``xla`` backends where no Pallas kernel runs. What changes is only how XLA is asked:

* :func:`gated_delta_chunked`: the UT transform's unit lower triangular system is solved without
  a triangular-solve op (which XLA:CPU runs as a slow batched loop): the diagonal ``16 x 16`` blocks
  are inverted by a forward substitution over whole rows (15 loop steps, each one batched
  matrix-vector product over every block of every chunk and head), and the blocks are combined by
  block forward substitution, so everything is batched matmuls. It runs in sub-chunks of
  ``SUB_CHUNK`` (32) tokens inside the contract's 64-token chunks: the intra-chunk terms grow
  with the chunk's square and short rows fill a 64-token chunk only partly; the chunk states are
  read back in the contract's layout. The scan applies each chunk's corrections to its start
  state (``S' = gamma S + k_dec^T (w_v - w_k S)``) instead of forming a ``dk x dk`` transition
  matrix per chunk.
* :func:`gated_delta_decode`: the one-step update reads the (decayed) state once for both of its
  products instead of reading the new state again for the output.
* :func:`paged_attention`: queries are grouped in blocks of consecutive tokens of one row
  (``block_q``, the chunk layout of ``kernels/layout``), and each loop step reads
  ``pages_per_step`` pages *per block* instead of one page per token: a prefill row's pages are read
  once per block, not once per token, and the loop runs half the steps. One-token rows
  (a decode region: as many tokens as rows) use blocks of one token. As in the chunked scan, the
  layout's last ``R`` blocks (used only by rows that end off the block grid) run under a
  ``lax.cond`` when rows are short.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from radixflow_jax.kernels import gated_delta as _gd
from radixflow_jax.kernels import attention as _attn
from radixflow_jax.kernels.attention import NEG_INF, column_range, positions_from_batch, soft_cap
from radixflow_jax.kernels.layout import chunk_ending_at, chunk_layout, final_states, gather_chunks, heads_chunks
from radixflow_jax.kernels.layout import scan_chunks, scatter_chunks

_HI = jax.lax.Precision.HIGHEST
_F32 = jnp.float32


# ------------------------------------------------------------------------------- gated delta
def unit_lower_solve(system: jnp.ndarray, rhs: jnp.ndarray, block: int = 16) -> jnp.ndarray:
    """``system^-1 rhs`` for unit lower triangular ``system [..., C, C]`` and ``rhs [..., C, n]``,
    using only matmuls: diagonal blocks inverted by forward substitution (one whole row per
    unrolled step), then block forward substitution. Entries above the diagonal are ignored."""
    c = system.shape[-1]
    b = block if c % block == 0 else c
    nb = c // b
    strict = jnp.where(jnp.tril(jnp.ones((c, c), bool), -1), system, 0.0)
    diag = jnp.stack([strict[..., i * b : (i + 1) * b, i * b : (i + 1) * b] for i in range(nb)], axis=-3)
    eye = jnp.eye(b, dtype=system.dtype)

    def fill_row(r: jnp.ndarray, inv: jnp.ndarray) -> jnp.ndarray:
        # row r of (I + L)^-1 = e_r - L[r, :r] @ rows[:r] (rows >= r are still e_j, and L[r, j>=r] = 0)
        lrow = jax.lax.dynamic_index_in_dim(diag, r, axis=-2, keepdims=False)
        row = jax.lax.dynamic_index_in_dim(eye, r, axis=0, keepdims=False)
        row = row - jnp.einsum("...j,...jk->...k", lrow, inv, precision=_HI)
        return jax.lax.dynamic_update_index_in_dim(inv, row, r, axis=-2)

    inv = jax.lax.fori_loop(1, b, fill_row, jnp.broadcast_to(eye, diag.shape))
    parts: list[jnp.ndarray] = []
    for i in range(nb):
        acc = rhs[..., i * b : (i + 1) * b, :]
        if i:
            done = jnp.concatenate(parts, axis=-2)
            acc = acc - jnp.einsum("...ij,...jn->...in", strict[..., i * b : (i + 1) * b, : i * b], done, precision=_HI)
        parts.append(jnp.einsum("...ij,...jn->...in", inv[..., i, :, :], acc, precision=_HI))
    return jnp.concatenate(parts, axis=-2)


SUB_CHUNK = 32  # measured 2026-12-01 (docs/perf-log.md): 32 beat 64 and 16 on 4x256, 32x32 and 64x32 rows


class _Terms(NamedTuple):
    """Per-chunk terms of the fast form (leading dims ``[N, Hv]``): the chunk's output is
    ``out_bias + out_read @ S0`` as in the reference, and its end state ``gamma S0 + k_dec^T (w_v -
    w_k S0)`` (the UT transform's corrections applied to the start state ``S0``), so no ``dk x dk``
    transition matrix is formed per chunk."""

    out_bias: jnp.ndarray  # [N, Hv, C, dv]
    out_read: jnp.ndarray  # [N, Hv, C, dk]
    w_k: jnp.ndarray  # [N, Hv, C, dk]: U = w_v - w_k S0
    w_v: jnp.ndarray  # [N, Hv, C, dv]
    k_dec: jnp.ndarray  # [N, Hv, C, dk]: k_i exp(G_last - G_i)
    gamma: jnp.ndarray  # [N, Hv]: exp(G_last)


def _terms(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, g: jnp.ndarray, beta: jnp.ndarray, scale: float) -> _Terms:
    """The UT transform of ``kernels/gated_delta._chunk_terms`` (same system, same right-hand
    sides) with its products merged: ``[k; q] k^T`` in one matmul, ``attn @ [w_v | w_k]`` in one,
    and the state update left to the scan (:func:`_advance`)."""
    chunk, dv = g.shape[-1], v.shape[-1]
    cum = jnp.cumsum(g, axis=-1)  # G_i, [N, H, C]
    causal = jnp.tril(jnp.ones((chunk, chunk), dtype=bool))
    strict = jnp.tril(jnp.ones((chunk, chunk), dtype=bool), k=-1)
    decay = jnp.where(causal, jnp.exp(jnp.where(causal, cum[..., :, None] - cum[..., None, :], 0.0)), 0.0)
    qs = q * scale
    both = _gd.mm("nhid,nhjd->nhij", jnp.concatenate([k, qs], axis=-2), k)  # [N, H, 2C, C]
    system = jnp.where(strict, beta[..., :, None] * both[..., :chunk, :] * decay, 0.0) + jnp.eye(chunk, dtype=_F32)
    exp_cum = jnp.exp(cum)[..., None]
    solved = unit_lower_solve(system, jnp.concatenate([beta[..., None] * v, beta[..., None] * exp_cum * k], axis=-1))
    read = _gd.mm("nhij,nhjv->nhiv", both[..., chunk:, :] * decay, solved)
    last = cum[..., -1]  # padding slots have g = 0, so this is G at the last real token
    k_dec = k * jnp.exp(last[..., None] - cum)[..., None]
    out_bias, out_read = read[..., :dv], qs * exp_cum - read[..., dv:]
    return _Terms(out_bias, out_read, solved[..., dv:], solved[..., :dv], k_dec, jnp.exp(last))


def _advance(
    start: jnp.ndarray, w_k: jnp.ndarray, w_v: jnp.ndarray, k_dec: jnp.ndarray, gamma: jnp.ndarray
) -> jnp.ndarray:
    """One chunk's end state from its start state ``[H, dk, dv]`` (the scan step)."""
    fresh = w_v - _gd.mm("hck,hkv->hcv", w_k, start)
    return gamma[:, None, None] * start + _gd.mm("hck,hcv->hkv", k_dec, fresh)


def _used_terms(chunks: list[jnp.ndarray], used: jnp.ndarray, num_tokens: int, chunk_size: int, scale: float) -> _Terms:
    """:func:`_terms` for the chunks a round uses: a layout of ``T`` tokens in ``R`` rows has
    ``ceil(T / C) + R`` chunks and numbers the used ones first, so the first ``ceil(T / C)`` are
    computed always and the other ``R`` only when more than that many are used (rows that end off
    the chunk grid); otherwise they stay zero (unused chunks are only required to be finite). Only
    for rounds of short rows (the ``R`` possible partial chunks at least half of the ``ceil(T /
    C)``, i.e. rows of about two chunks or less): 64 rows of 32 tokens use half of their chunks and
    the kernel took 62.2 instead of 82.9 ms (32 x 32: 28.8 against 36.6), while on 4 rows of 288
    tokens the split took 21.8 against 17.1 ms (medians of 11-21, interleaved, 2026-12-01,
    docs/perf-log.md). Running the whole kernel under a ``lax.cond`` instead (over the first
    ``ceil(T / C)`` chunks when no row ends off the grid) took a replayed 1088-slot mixed round
    from 476 to 444 ms, but added 0.36 CPU-s to every compile of this kernel at the tests'
    optimisation level and took the cold test suite to 14 min 43 s; not kept (2026-12-01)."""
    terms = functools.partial(_terms, scale=scale)
    dense = min(-(-num_tokens // chunk_size), chunks[0].shape[0])
    if 2 * (chunks[0].shape[0] - dense) < dense:  # long rows: the split measured slower than no split
        return terms(*chunks)
    head, rest = terms(*(x[:dense] for x in chunks)), [x[dense:] for x in chunks]
    zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(terms, *rest))
    tail = jax.lax.cond(used > dense, lambda: terms(*rest), lambda: zeros)
    return jax.tree.map(lambda h, t: jnp.concatenate([h, t]), head, tail)


def _chunked(
    q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, g: jnp.ndarray, beta: jnp.ndarray, cu_seqlens: jnp.ndarray,
    initial_state: jnp.ndarray, chunk_size: int, scale: float | None, pair_chunk: jnp.ndarray | None,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:  # fmt: skip
    """``kernels/gated_delta.gated_delta_chunked`` in the fast form (:func:`_terms`,
    :func:`_advance`), with the solve of :func:`unit_lower_solve` and the terms of the used chunks
    only (:func:`_used_terms`); ``layout.scan_chunks`` visits the used chunks only."""
    num_tokens = v.shape[0]
    scale = _gd.resolve_scale(scale, q.shape[-1])
    layout = chunk_layout(cu_seqlens, num_tokens, chunk_size)
    chunks = [heads_chunks(x, layout, chunk_size) for x in _gd.prepare(q, k, v, g, beta)]
    terms = _used_terms(chunks, layout.first_chunk[-1], num_tokens, chunk_size, scale)
    init = initial_state.astype(_F32)
    per_chunk = (terms.w_k, terms.w_v, terms.k_dec, terms.gamma)
    starts, ends = scan_chunks(_advance, per_chunk, layout, init, pair_chunk)
    out = terms.out_bias + _gd.mm("nhck,nhkv->nhcv", terms.out_read, starts)
    out = scatter_chunks(jnp.moveaxis(out, 2, 1), layout, num_tokens).astype(v.dtype)
    final = final_states(ends, layout, init, pair_chunk)
    return out, final, ends


def gated_delta_chunked(
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
    pair_chunk: jnp.ndarray | None = None,
    sub_chunk: int = SUB_CHUNK,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """:func:`radixflow_jax.kernels.gated_delta.gated_delta_chunked` without a triangular solve,
    computed in chunks of ``sub_chunk`` tokens when that divides ``chunk_size`` (the contract's
    chunk): the intra-chunk work grows with the chunk's square, and a short row (a 32-token
    suffix) fills half of a 64-token chunk. The outputs keep the contract's ``chunk_size`` layout:
    ``chunk_states[c]`` is the state after chunk ``c`` of ``chunk_layout(cu_seqlens, T,
    chunk_size)``, read from the sub-chunk that ends at the same token (every chunk end is a
    sub-chunk end), and ``pair_chunk`` names chunks of that layout too."""
    if sub_chunk >= chunk_size or chunk_size % sub_chunk:
        return _chunked(q, k, v, g, beta, cu_seqlens, initial_state, chunk_size, scale, pair_chunk)
    num_tokens = v.shape[0]
    layout = chunk_layout(cu_seqlens, num_tokens, chunk_size)

    def as_sub(chunk: jnp.ndarray) -> jnp.ndarray:
        """The sub-chunk ending where contract chunk ``chunk`` ends (``chunk`` must be used)."""
        row = jnp.minimum(layout.row[chunk], cu_seqlens.shape[0] - 2)
        end = layout.start[chunk] + layout.length[chunk] - cu_seqlens[row]
        return chunk_ending_at(cu_seqlens, row, jnp.maximum(end, 1), sub_chunk)

    sub_pair = None
    if pair_chunk is not None:
        src = jnp.clip(pair_chunk, 0, layout.row.shape[0] - 1)
        sub_pair = jnp.where(pair_chunk >= 0, as_sub(src), -1)
    out, final, sub_ends = _chunked(q, k, v, g, beta, cu_seqlens, initial_state, sub_chunk, scale, sub_pair)
    used = layout.length > 0  # unused chunks keep a finite placeholder: sub-chunk 0's end state
    idx = jnp.where(used, as_sub(jnp.arange(layout.row.shape[0])), 0)
    return out, final, sub_ends[jnp.clip(idx, 0, sub_ends.shape[0] - 1)]


def gated_delta_decode(
    q: jnp.ndarray,
    k: jnp.ndarray,
    v: jnp.ndarray,
    g: jnp.ndarray,
    beta: jnp.ndarray,
    state: jnp.ndarray,
    *,
    scale: float | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """:func:`radixflow_jax.kernels.gated_delta.gated_delta_decode` reading the state once for both
    products: with the decayed state ``A = exp(g) S``, ``u = beta (v - A^T k)``, the new state is
    ``A + k u^T`` and the output ``(A + k u^T)^T q = A^T q + u (k . q)``, so the new state is only
    written (the reference reads it again for ``S'^T q``). One 64-row layer of the vs_transformers
    model, its window read and written in place: 0.67 against 1.15 ms (median of 15, 2026-12-01,
    docs/perf-log.md)."""
    scale = _gd.resolve_scale(scale, q.shape[-1])
    qf, kf, vf, gf, bf = _gd.prepare(q, k, v, g, beta)
    qs = qf * scale
    decayed = state.astype(_F32) * jnp.exp(gf)[..., None, None]
    u = bf[..., None] * (vf - jnp.einsum("...hkv,...hk->...hv", decayed, kf, precision=_HI))
    out = jnp.einsum("...hkv,...hk->...hv", decayed, qs, precision=_HI) + u * jnp.sum(kf * qs, axis=-1)[..., None]
    return out.astype(v.dtype), decayed + kf[..., :, None] * u[..., None, :]


# --------------------------------------------------------------------------------- attention
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
    block_q: int | None = None,
    pages_per_step: int = 2,
) -> jnp.ndarray:
    """:func:`radixflow_jax.kernels.attention.paged_attention` over query blocks (see the module
    docstring). ``block_q`` defaults to 32. A round where every row has one token (``T == R``, a
    decode region) runs the reference's per-token loop unless ``block_q`` is given: on an idle
    2-core CPU the blocked form took 0.82x the reference's speed there (median of 4 runs of
    ``python benchmarks/kernels.py --small``, 2026-11-30), while it is 3x faster on prefill."""
    num_tokens = q.shape[0]
    if block_q is None and num_tokens == jnp.shape(page_table)[0]:
        args = (q, k_pages, v_pages, page_table, cu_seqlens, kv_lens)
        return _attn.paged_attention(*args, scale=scale, sliding_window=sliding_window, logit_soft_cap=logit_soft_cap)
    k_pages, v_pages, page_table = jnp.asarray(k_pages), jnp.asarray(v_pages), jnp.asarray(page_table, jnp.int32)
    num_tokens, q_heads, dim = q.shape
    page_size, kv_heads = k_pages.shape[1], k_pages.shape[2]
    if q_heads % kv_heads:
        raise ValueError(f"query heads {q_heads} not divisible by kv heads {kv_heads}")
    rep = q_heads // kv_heads
    num_rows, max_pages = page_table.shape
    if block_q is None:
        block_q = 32
    cu = jnp.asarray(cu_seqlens, jnp.int32)
    lens = jnp.asarray(kv_lens, jnp.int32)
    qf = jnp.asarray(q, _F32) * scale
    if block_q == 1:  # one block per token (no chunk layout: it would add a block per row)
        tok_row, tok_pos, tok_valid = positions_from_batch(cu, lens, num_tokens)
        row, valid, pos = jnp.minimum(tok_row, num_rows - 1), tok_valid[:, None], tok_pos[:, None]
        qb = qf[:, None]
        unblock = lambda o: jnp.where(tok_valid[:, None, None], o[:, 0], 0.0)  # noqa: E731
    else:
        layout = chunk_layout(cu, num_tokens, block_q)
        row = jnp.minimum(layout.row, num_rows - 1)  # [N]
        first_pos = lens[row] - (cu[row + 1] - cu[row]) + (layout.start - cu[row])  # position of slot 0
        slot = jnp.arange(block_q, dtype=jnp.int32)
        valid = slot[None, :] < layout.length[:, None]  # [N, Bq]
        pos = jnp.where(valid, first_pos[:, None] + slot[None, :], 0)
        qb = gather_chunks(qf, layout, block_q)  # [N, Bq, Hq, D]
        unblock = lambda o: scatter_chunks(o, layout, num_tokens)  # noqa: E731
    qb = qb.reshape(qb.shape[0], block_q, kv_heads, rep, dim)
    lo, hi = column_range(pos.reshape(-1), valid.reshape(-1), page_size, max_pages, sliding_window)
    attend = functools.partial(
        _attend_blocks,
        k_pages=k_pages,
        v_pages=v_pages,
        page_size=page_size,
        max_pages=max_pages,
        columns=(lo, hi),
        pages_per_step=pages_per_step,
        sliding_window=sliding_window,
        logit_soft_cap=logit_soft_cap,
    )
    parts = (qb, page_table[row], valid, pos)
    dense = -(-num_tokens // block_q)  # blocks always used; a layout has up to R more (rows ending off the grid)
    if block_q == 1 or 2 * (qb.shape[0] - dense) < dense:
        out = attend(*parts)
    else:  # short rows: the last R blocks run only when a row ends off the block grid
        head = attend(*(x[:dense] for x in parts))
        rest = [x[dense:] for x in parts]
        tail = jax.lax.cond(
            layout.first_chunk[-1] > dense, lambda: attend(*rest), lambda: jnp.zeros(rest[0].shape, _F32)
        )
        out = jnp.concatenate([head, tail])
    return unblock(out.reshape(out.shape[0], block_q, q_heads, dim)).astype(q.dtype)


def _attend_blocks(
    qb: jnp.ndarray,
    blk_pages: jnp.ndarray,
    valid: jnp.ndarray,
    pos: jnp.ndarray,
    *,
    k_pages: jnp.ndarray,
    v_pages: jnp.ndarray,
    page_size: int,
    max_pages: int,
    columns: tuple[jnp.ndarray, jnp.ndarray],
    pages_per_step: int,
    sliding_window: int | None,
    logit_soft_cap: float | None,
) -> jnp.ndarray:
    """Online-softmax attention of query blocks ``qb [N, Bq, Hkv, rep, D]`` (scaled, f32) over
    page-table columns ``columns = [lo, hi)`` of their rows' pages ``blk_pages [N, max_pages]``,
    ``pages_per_step`` pages a step; ``valid``/``pos [N, Bq]`` mark real query slots and their
    positions. Returns ``[N, Bq, Hkv, rep, D]`` (0 where a slot attends to nothing)."""
    kv_heads, dim = k_pages.shape[2], k_pages.shape[3]
    offsets = jnp.arange(pages_per_step * page_size, dtype=jnp.int32)
    lo, hi = columns

    def body(step: jnp.ndarray, carry: tuple) -> tuple:
        m, l, acc = carry  # [N, Bq, Hkv, rep], same, [N, Bq, Hkv, rep, D]
        col0 = lo + step * pages_per_step
        cols = col0 + jnp.arange(pages_per_step, dtype=jnp.int32)
        ids = jnp.clip(blk_pages[:, jnp.minimum(cols, max_pages - 1)], 0, k_pages.shape[0] - 1)  # [N, pps]
        kv_pos = col0 * page_size + offsets  # [S]
        mask = valid[:, :, None] & (kv_pos[None, None, :] <= pos[:, :, None])
        mask = mask & (kv_pos < max_pages * page_size)[None, None, :]
        if sliding_window is not None:
            mask = mask & (kv_pos[None, None, :] > pos[:, :, None] - sliding_window)
        n = ids.shape[0]
        k = k_pages[ids].astype(_F32).reshape(n, -1, kv_heads, dim)  # [N, S, Hkv, D]
        v = v_pages[ids].astype(_F32).reshape(n, -1, kv_heads, dim)
        any_key = jnp.any(mask, axis=1)  # [N, S]: a poisoned (never attended) slot must not reach acc
        v = jnp.where(any_key[:, :, None, None], v, 0.0)
        s = soft_cap(jnp.einsum("nbkrd,nskd->nbkrs", qb, k, precision=_HI), logit_soft_cap)
        mk = mask[:, :, None, None, :]
        s = jnp.where(mk, s, NEG_INF)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.where(mk, jnp.exp(s - m_new[..., None]), 0.0)
        corr = jnp.exp(m - m_new)
        acc = corr[..., None] * acc + jnp.einsum("nbkrs,nskd->nbkrd", p, v, precision=_HI)
        return m_new, corr * l + jnp.sum(p, axis=-1), acc

    stats = qb.shape[:4]
    init = (jnp.full(stats, NEG_INF, _F32), jnp.zeros(stats, _F32), jnp.zeros(stats + (dim,), _F32))
    steps = (hi - lo + pages_per_step - 1) // pages_per_step
    _, l, acc = jax.lax.fori_loop(0, steps, body, init)
    return jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)
