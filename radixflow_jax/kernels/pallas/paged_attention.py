"""Pallas ragged paged attention for a mixed batch (same contract as
:func:`radixflow_jax.kernels.attention.paged_attention`).

Writing the new tokens' K/V into the page pools is *not* part of this kernel: it stays the jnp
scatter :func:`radixflow_jax.kernels.attention.write_kv` (one ``.at[].set`` that XLA updates in
place on donated pools), run before this kernel as with the reference.

Layout: every row's query span is cut into *query tiles* of ``block_q`` tokens, counted from the
span start (:func:`radixflow_jax.kernels.layout.chunk_layout` with ``chunk_size = block_q``), so
decode rows (one token) and prefill spans (many) mix in one grid; a tile never straddles rows.
Per tile the kernel runs an online (flash) softmax over the row's page-table columns, one KV page
per step, reading each page through the page table. Only columns ``[lo, hi)`` that some query of
the tile can attend (causal, sliding window) are computed.

Variants (``backend``):
  * ``"tpu"``: grid ``(tiles, max_pages)``, page axis ``"arbitrary"``. Page table, tile row,
    column range and attended-KV range arrive by scalar prefetch; the K/V ``index_map`` reads the
    page id, clamping the column into ``[lo, hi)`` so skipped steps re-use the resident page (no
    DMA). All KV heads of a page are handled in one step; the ``rep = Hq / Hkv`` query heads of a
    KV head are folded into the tile's rows (``rep * block_q`` rows, GQA without repeating K/V).
    Softmax statistics and the accumulator live in VMEM scratch.
  * ``"gpu"``: grid ``(tiles, Hq)``; each program loops over its columns with the statistics as the
    loop carry and loads K/V pages of its KV head ``h // rep`` with scalar-indexed loads. Needs
    power-of-two ``block_q``, ``page_size`` and head dim.

Costs and limits: a decode row still occupies a whole ``block_q`` tile (its other rows are masked),
so pure-decode batches do ``block_q`` times the minimal MXU work (they are bandwidth bound, so it
is mostly hidden); the TPU variant keeps the whole flattened page table in SMEM, which bounds
``R * max_pages``; the grid always spans ``max_pages`` columns (skipped ones cost a step, no DMA).

Invariants: logits ``scale * q.k`` (then ``cap * tanh(. / cap)``), float32 softmax and matmuls at
``Precision.HIGHEST``; output in q's dtype; padding tokens and query slots past a tile's length
give 0; page slots outside every query's attended range are zeroed before ``p @ v`` so NaN or junk
in never-attended slots (and page-table entries, clamped to the pool) cannot leak.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from radixflow_jax.kernels.layout import ChunkLayout, chunk_layout, gather_chunks, scatter_chunks
from radixflow_jax.kernels.pallas.common import (
    NEG_INF,
    Backend,
    Ref,
    check_pow2,
    compiler_params,
    mm,
    mm_nt,
    resolve_backend,
)

_F32 = jnp.float32


class _Tiles(NamedTuple):
    """Per-query-tile metadata, all int32 ``[num_tiles]`` except ``qpos``."""

    row: jnp.ndarray  # owning row (clamped to R - 1 for unused tiles)
    col_lo: jnp.ndarray  # first page-table column to visit
    col_hi: jnp.ndarray  # one past the last column (0 for unused tiles)
    kv_first: jnp.ndarray  # first KV position any query of the tile attends
    kv_last: jnp.ndarray  # last KV position any query of the tile attends
    qpos: jnp.ndarray  # [num_tiles, block_q] absolute query positions, -1 for empty slots


def _tiles(
    cu: jnp.ndarray,
    kv_lens: jnp.ndarray,
    num_tokens: int,
    block_q: int,
    page_size: int,
    max_pages: int,
    window: int | None,
) -> tuple[_Tiles, ChunkLayout]:
    """Query tiles of ``block_q`` tokens per row span and the KV range each tile can attend."""
    num_rows = cu.shape[0] - 1
    layout = chunk_layout(cu, num_tokens, block_q)
    row = jnp.minimum(layout.row, num_rows - 1)
    used = layout.length > 0
    span = cu[row + 1] - cu[row]
    first = jnp.asarray(kv_lens, jnp.int32)[row] - span + (layout.start - cu[row])
    last = first + layout.length - 1
    col_hi = jnp.where(used, jnp.minimum(last // page_size + 1, max_pages), 0)
    kv_first = jnp.zeros_like(first) if window is None else jnp.maximum(first - window + 1, 0)
    col_lo = jnp.where(used, jnp.minimum(kv_first // page_size, col_hi), 0)
    slot = jnp.arange(block_q, dtype=jnp.int32)
    qpos = jnp.where(slot[None, :] < layout.length[:, None], first[:, None] + slot[None, :], -1)
    i32 = lambda x: x.astype(jnp.int32)  # noqa: E731
    return _Tiles(i32(row), i32(col_lo), i32(col_hi), i32(kv_first), i32(last), i32(qpos)), layout


def _online_step(
    q: jnp.ndarray,
    k: jnp.ndarray,
    v: jnp.ndarray,
    qpos: jnp.ndarray,
    kv_row: jnp.ndarray,
    v_ok: jnp.ndarray,
    carry: tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray],
    *,
    scale: float,
    window: int | None,
    cap: float | None,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """One KV page for ``[M, D]`` queries: q/qpos [M, D]/[M, 1], k/v [ps, D], kv_row [1, ps], v_ok [ps, 1]."""
    m, l, acc = carry
    mask = (qpos >= 0) & (kv_row <= qpos)
    if window is not None:
        mask = mask & (kv_row > qpos - window)
    s = mm_nt(q.astype(_F32) * scale, k.astype(_F32))
    if cap is not None:
        s = cap * jnp.tanh(s / cap)
    s = jnp.where(mask, s, NEG_INF)
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
    corr = jnp.exp(m - m_new)
    vf = jnp.where(v_ok, v.astype(_F32), 0.0)
    return m_new, corr * l + jnp.sum(p, axis=1, keepdims=True), corr * acc + mm(p, vf)


def _finish(l: jnp.ndarray, acc: jnp.ndarray) -> jnp.ndarray:
    return jnp.where(l > 0, acc / jnp.where(l > 0, l, 1.0), 0.0)


def _page_positions(col: jnp.ndarray, page_size: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """KV positions of page-table column ``col`` as a row ``[1, ps]`` and a column ``[ps, 1]``."""
    base = col * page_size
    return (
        base + jax.lax.broadcasted_iota(jnp.int32, (1, page_size), 1),
        base + jax.lax.broadcasted_iota(jnp.int32, (page_size, 1), 0),
    )


def _tpu_kernel(
    pages_ref: Ref,
    row_ref: Ref,
    lo_ref: Ref,
    hi_ref: Ref,
    kvf_ref: Ref,
    kvl_ref: Ref,
    q_ref: Ref,
    qpos_ref: Ref,
    k_ref: Ref,
    v_ref: Ref,
    o_ref: Ref,
    m_ref: Ref,
    l_ref: Ref,
    acc_ref: Ref,
    *,
    kv_heads: int,
    page_size: int,
    **opts: Any,
) -> None:
    del pages_ref, row_ref  # consumed by the K/V index_maps
    t, j = pl.program_id(0), pl.program_id(1)

    @pl.when(j == 0)
    def _init() -> None:
        m_ref[...] = jnp.full(m_ref.shape, NEG_INF, _F32)
        l_ref[...] = jnp.zeros(l_ref.shape, _F32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, _F32)

    @pl.when((j >= lo_ref[t]) & (j < hi_ref[t]))
    def _page() -> None:
        kv_row, kv_col = _page_positions(j, page_size)
        v_ok = (kv_col >= kvf_ref[t]) & (kv_col <= kvl_ref[t])
        qpos = qpos_ref[...]
        for h in range(kv_heads):
            carry = (m_ref[h], l_ref[h], acc_ref[h])
            m, l, acc = _online_step(q_ref[h], k_ref[:, h, :], v_ref[:, h, :], qpos, kv_row, v_ok, carry, **opts)
            m_ref[h], l_ref[h], acc_ref[h] = m, l, acc

    @pl.when(j == pl.num_programs(1) - 1)
    def _done() -> None:
        for h in range(kv_heads):
            o_ref[h] = _finish(l_ref[h], acc_ref[h]).astype(o_ref.dtype)


def _gpu_kernel(
    row_ref: Ref,
    lo_ref: Ref,
    hi_ref: Ref,
    kvf_ref: Ref,
    kvl_ref: Ref,
    pt_ref: Ref,
    q_ref: Ref,
    qpos_ref: Ref,
    k_ref: Ref,
    v_ref: Ref,
    o_ref: Ref,
    *,
    page_size: int,
    **opts: Any,
) -> None:
    t = pl.program_id(0)
    row, kv_first, kv_last = row_ref[t], kvf_ref[t], kvl_ref[t]
    q, qpos = q_ref[...], qpos_ref[...]

    def body(col: jnp.ndarray, carry: tuple[jnp.ndarray, ...]) -> tuple[jnp.ndarray, ...]:
        page = pt_ref[row, col]
        kv_row, kv_col = _page_positions(col, page_size)
        v_ok = (kv_col >= kv_first) & (kv_col <= kv_last)
        return _online_step(q, k_ref[page], v_ref[page], qpos, kv_row, v_ok, carry, **opts)

    rows, dim = q_ref.shape
    init = (jnp.full((rows, 1), NEG_INF, _F32), jnp.zeros((rows, 1), _F32), jnp.zeros((rows, dim), _F32))
    _, l, acc = jax.lax.fori_loop(lo_ref[t], hi_ref[t], body, init)
    o_ref[...] = _finish(l, acc).astype(o_ref.dtype)


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
    backend: Backend | None = None,
    interpret: bool = False,
    block_q: int = 16,
) -> jnp.ndarray:
    """Causal ragged paged attention: q [T, Hq, D] -> out [T, Hq, D] (q's dtype); see module docstring."""
    backend = resolve_backend(backend, interpret)
    num_tokens, q_heads, dim = q.shape
    num_pages, page_size, kv_heads = k_pages.shape[:3]
    if q_heads % kv_heads:
        raise ValueError(f"query heads {q_heads} not divisible by kv heads {kv_heads}")
    rep = q_heads // kv_heads
    check_pow2(backend, block_q=block_q, page_size=page_size, head_dim=dim)
    cu = jnp.asarray(cu_seqlens, jnp.int32)
    table = jnp.clip(jnp.asarray(page_table, jnp.int32), 0, num_pages - 1)
    num_rows, max_pages = table.shape
    tiles, layout = _tiles(cu, kv_lens, num_tokens, block_q, page_size, max_pages, sliding_window)
    num_tiles = tiles.row.shape[0]
    q_tiles = jnp.moveaxis(gather_chunks(q, layout, block_q), 2, 1)  # [tiles, Hq, bq, D]
    opts = dict(scale=float(scale), window=sliding_window, cap=logit_soft_cap)
    meta = (tiles.row, tiles.col_lo, tiles.col_hi, tiles.kv_first, tiles.kv_last)
    if backend == "tpu":
        rows = rep * block_q  # tile row m = r * block_q + t holds query head kv * rep + r, token t
        qpos = jnp.tile(tiles.qpos, (1, rep))[..., None]

        def kv_map(t: Any, j: Any, pages: Ref, row: Ref, lo: Ref, hi: Ref, kvf: Ref, kvl: Ref) -> tuple[Any, ...]:
            col = jnp.minimum(jnp.maximum(j, lo[t]), jnp.maximum(hi[t] - 1, lo[t]))
            return pages[row[t] * max_pages + col], 0, 0, 0

        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=6,
            grid=(num_tiles, max_pages),
            in_specs=[
                pl.BlockSpec((None, kv_heads, rows, dim), lambda t, j, *_: (t, 0, 0, 0)),
                pl.BlockSpec((None, rows, 1), lambda t, j, *_: (t, 0, 0)),
                pl.BlockSpec((None, page_size, kv_heads, dim), kv_map),
                pl.BlockSpec((None, page_size, kv_heads, dim), kv_map),
            ],
            out_specs=pl.BlockSpec((None, kv_heads, rows, dim), lambda t, j, *_: (t, 0, 0, 0)),
            scratch_shapes=[
                pltpu.VMEM((kv_heads, rows, 1), _F32),
                pltpu.VMEM((kv_heads, rows, 1), _F32),
                pltpu.VMEM((kv_heads, rows, dim), _F32),
            ],
        )
        call = pl.pallas_call(
            functools.partial(_tpu_kernel, kv_heads=kv_heads, page_size=page_size, **opts),
            out_shape=jax.ShapeDtypeStruct((num_tiles, kv_heads, rows, dim), q.dtype),
            grid_spec=grid_spec,
            compiler_params=compiler_params(backend, ("parallel", "arbitrary")),
            interpret=interpret,
            name="ragged_paged_attention_tpu",
        )
        q_tpu = q_tiles.reshape(num_tiles, kv_heads, rows, dim)
        out = call(table.reshape(-1), *meta, q_tpu, qpos, k_pages, v_pages).reshape(q_tiles.shape)
    else:
        whole = lambda n: pl.BlockSpec((n,), lambda t, h: (0,))  # noqa: E731
        kv_spec = pl.BlockSpec((num_pages, page_size, None, dim), lambda t, h: (0, 0, jax.lax.div(h, rep), 0))
        call = pl.pallas_call(
            functools.partial(_gpu_kernel, page_size=page_size, **opts),
            out_shape=jax.ShapeDtypeStruct(q_tiles.shape, q.dtype),
            grid=(num_tiles, q_heads),
            in_specs=[whole(num_tiles)] * 5
            + [
                pl.BlockSpec((num_rows, max_pages), lambda t, h: (0, 0)),
                pl.BlockSpec((None, None, block_q, dim), lambda t, h: (t, h, 0, 0)),
                pl.BlockSpec((None, block_q, 1), lambda t, h: (t, 0, 0)),
                kv_spec,
                kv_spec,
            ],
            out_specs=pl.BlockSpec((None, None, block_q, dim), lambda t, h: (t, h, 0, 0)),
            compiler_params=compiler_params(backend, ()),
            interpret=interpret,
            name="ragged_paged_attention_gpu",
        )
        out = call(*meta, table, q_tiles, tiles.qpos[..., None], k_pages, v_pages)
    return scatter_chunks(jnp.moveaxis(out, 1, 2), layout, num_tokens)
