"""Softmax attention over a paged KV cache for a packed ragged batch.

Covers Qwen3-Next/Qwen3.5 gated attention (output gate interleaved per head in ``q_proj``, zero-
centred q/k norm, partial RoPE), Qwen3 (q/k RMSNorm, full RoPE), Llama (no q/k norm), Granite-4.0-H
(explicit softmax scale, optional RoPE) and Falcon-H1 (``key_multiplier`` on k before RoPE, so the
cached keys are the scaled ones, as in the reference cache).
The new K/V of every token is written into its page slot *before* attending, so a prefill row sees
its own span and its cached prefix through the same page table. The decode rows ``[:num_decode]``
(one query each) and the prefill rows attend in two calls, so each part's cost follows its own
context lengths, not the other's. With ``row_last`` (the model's last layer, whose outputs only
matter at each row's last token) every token's K/V is still written, but only those tokens query:
one query per row, at position ``kv_lens[r] - 1``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from radixflow_jax.kernels import ops
from radixflow_jax.models.batch import Batch
from radixflow_jax.models.config import AttentionConfig
from radixflow_jax.models.layers import Linear, RMSNorm, apply_rope, rope_inv_freq

KvPages = tuple[jax.Array, jax.Array]


class Attention(nnx.Module):
    def __init__(
        self,
        cfg: AttentionConfig,
        hidden: int,
        eps: float,
        *,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
        key_multiplier: float = 1.0,
    ):
        self.cfg = cfg
        self.key_multiplier = key_multiplier
        q_out = cfg.num_heads * cfg.head_dim * (2 if cfg.output_gate else 1)
        kv_out = cfg.num_kv_heads * cfg.head_dim
        self.q_proj = Linear(hidden, q_out, bias=cfg.bias, dtype=dtype, rngs=rngs)
        self.k_proj = Linear(hidden, kv_out, bias=cfg.bias, dtype=dtype, rngs=rngs)
        self.v_proj = Linear(hidden, kv_out, bias=cfg.bias, dtype=dtype, rngs=rngs)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, hidden, bias=cfg.bias, dtype=dtype, rngs=rngs)
        if cfg.qk_norm == "none":
            self.q_norm = self.k_norm = None
        else:
            style = "zero_centered" if cfg.qk_norm == "rms_zc" else "llama"
            self.q_norm = RMSNorm(cfg.head_dim, eps, style=style, dtype=dtype)
            self.k_norm = RMSNorm(cfg.head_dim, eps, style=style, dtype=dtype)

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        batch: Batch,
        kv: KvPages,
        num_decode: int = 0,
        row_last: jax.Array | None = None,
    ) -> tuple[jax.Array, KvPages]:
        """``x [T, hidden]`` -> ``(out [T, hidden], pools)``; with ``row_last [R]`` (the index of
        each row's last token; rows without tokens: any index) ``out`` is ``[R, hidden]``: row
        ``r``'s last token's output (unspecified for rows without tokens). ``row_last`` may go on
        past ``R`` entries with any tokens' indices (verify points, ``runner/step.py``), whose
        outputs follow."""
        cfg = self.cfg
        num_tokens = x.shape[0]
        xq, q_positions = (x, positions) if row_last is None else (x[row_last], positions[row_last])
        num_q = xq.shape[0]
        q = self.q_proj(xq)
        gate = None
        if cfg.output_gate:
            q = q.reshape(num_q, cfg.num_heads, 2 * cfg.head_dim)
            q, gate = q[..., : cfg.head_dim], q[..., cfg.head_dim :]
            gate = gate.reshape(num_q, -1)
        q = q.reshape(num_q, cfg.num_heads, cfg.head_dim)
        k = self.k_proj(x).reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        v = self.v_proj(x).reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        if self.key_multiplier != 1.0:
            k = k * self.key_multiplier
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if cfg.rope is not None:
            inv_freq = rope_inv_freq(cfg.rope)
            q = apply_rope(q, q_positions, inv_freq)
            k = apply_rope(k, positions, inv_freq)
        k_pages, v_pages = ops.write_kv(kv[0], kv[1], k, v, batch.slot_mapping)
        if row_last is None:
            out = attend(q, k_pages, v_pages, batch, num_decode, scale=cfg.softmax_scale, window=cfg.sliding_window)
        else:  # one query per row: the row's last token, at position kv_lens[r] - 1 (a row without
            # tokens gets context 1, so every kernel sees its contract; its output is never read)
            page_table, context = batch.page_table, jnp.maximum(batch.kv_lens, 1)
            extra = num_q - page_table.shape[0]
            if extra:  # verify points past the rows' last tokens (speculative decoding): their own row and depth
                idx = row_last[page_table.shape[0] :]
                qrow = jnp.clip(jnp.searchsorted(batch.cu_seqlens[1:], idx, side="right"), 0, page_table.shape[0] - 1)
                page_table = jnp.concatenate([page_table, page_table[qrow]], axis=0)
                context = jnp.concatenate([context, positions[idx] + 1])
            out = ops.paged_attention(
                q,
                k_pages,
                v_pages,
                page_table,
                jnp.arange(num_q + 1, dtype=jnp.int32),
                context,
                scale=cfg.softmax_scale,
                sliding_window=cfg.sliding_window,
            )
        out = out.reshape(num_q, -1)
        if gate is not None:
            out = out * jax.nn.sigmoid(gate)
        return self.o_proj(out), (k_pages, v_pages)


def attend(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    batch: Batch,
    num_decode: int,
    *,
    scale: float,
    window: int | None,
) -> jax.Array:
    """Paged attention of ``q [T, H, D]``: the decode region (rows and tokens ``[:num_decode]``) and
    the prefill region in separate calls, each over its own rows' page tables and context lengths."""
    d, num_rows = num_decode, batch.page_table.shape[0]

    def part(qs: jax.Array, rows: slice, cu: jax.Array) -> jax.Array:
        return ops.paged_attention(
            qs, k_pages, v_pages, batch.page_table[rows], cu, batch.kv_lens[rows], scale=scale, sliding_window=window
        )

    if d == 0:
        return part(q, slice(None), batch.cu_seqlens)
    decode = part(q[:d], slice(0, d), batch.cu_seqlens[: d + 1])
    if num_rows == d:
        return jnp.concatenate([decode, jnp.zeros_like(q[d:])], axis=0) if q.shape[0] > d else decode
    prefill = part(q[d:], slice(d, None), batch.cu_seqlens[d:] - d)
    return jnp.concatenate([decode, prefill], axis=0)
