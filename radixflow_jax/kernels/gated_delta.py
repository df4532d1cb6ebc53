"""Gated delta rule (Gated DeltaNet linear attention): pure-jnp reference kernels.

Recurrence, per value head, with state ``S`` in ``R^{dk x dv}`` and for every token ``t``::

    S <- exp(g_t) * S
    u_t = beta_t * (v_t - S^T k_t)
    S <- S + k_t u_t^T
    o_t = S^T (scale * q_t)

Conventions and invariants shared by every function here:
  * ``q, k``: ``[..., Hk, dk]`` and already L2-normalised by the caller; ``scale`` (default
    ``dk ** -0.5``) is applied to ``q`` inside the kernel. ``v``: ``[..., Hv, dv]``;
    ``g`` (log-decay, ``<= 0``) and ``beta``: ``[..., Hv]``. Value head ``j`` reads key/query head
    ``j // (Hv // Hk)`` (repeat-interleave), so ``Hv % Hk == 0``.
  * All math is float32; outputs have ``v``'s dtype; states are float32 ``[..., Hv, dk, dv]``.
  * Packed batches follow :mod:`radixflow_jax.kernels.layout`: padding tokens produce zero output
    and never touch a state; a zero-length row's final state is its initial state.
  * ``chunk_states[c]`` is the state after chunk ``c`` of ``chunk_layout(cu_seqlens, T, chunk_size)``
    (i.e. row ``row[c]`` after ``start[c] + length[c] - cu_seqlens[row[c]]`` tokens of its span);
    unused chunks hold a finite placeholder.

The chunked form (WY / UT transform): inside a chunk with cumulative log-decay ``G_i`` the
corrections ``U`` solve ``(I + A) U = beta V - beta exp(G) K S0`` with the strictly lower
triangular ``A_ij = beta_i exp(G_i - G_j) k_i . k_j``, so ``U = Wv - Wk S0``. Then
``O = P + Q S0`` and ``S_end = Adec S0 + B`` with per-chunk matrices that need no state, so all
intra-chunk work is parallel and the sequential scan over chunks is a small affine recurrence.
Padding slots inside a chunk are gathered as zeros (``k = v = beta = g = 0``) and are inert.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from radixflow_jax.kernels.layout import chunk_layout, final_states, heads_chunks, scan_chunks, scatter_chunks

_HIGHEST = jax.lax.Precision.HIGHEST


class _ChunkTerms(NamedTuple):
    """State-independent per-chunk matrices; leading dims ``[N, Hv]``."""

    out_bias: jnp.ndarray  # P: [N, Hv, C, dv], output part not reading the chunk-start state
    out_read: jnp.ndarray  # Q: [N, Hv, C, dk], o = P + Q @ S0
    state_mul: jnp.ndarray  # Adec: [N, Hv, dk, dk], S_end = Adec @ S0 + B
    state_add: jnp.ndarray  # B: [N, Hv, dk, dv]


def mm(spec: str, a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """Full-precision float32 einsum (no TF32 / bf16 passes on accelerators)."""
    return jnp.einsum(spec, a, b, precision=_HIGHEST)


def resolve_scale(scale: float | None, head_dim: int) -> float:
    return head_dim**-0.5 if scale is None else float(scale)


def _expand_heads(x: jnp.ndarray, num_v_heads: int, axis: int) -> jnp.ndarray:
    """Repeat-interleaves key/query heads (on ``axis``) up to ``num_v_heads``."""
    num_k_heads = x.shape[axis]
    if num_v_heads % num_k_heads != 0:
        raise ValueError(f"Hv={num_v_heads} is not a multiple of Hk={num_k_heads}")
    return jnp.repeat(x, num_v_heads // num_k_heads, axis=axis)


def prepare(
    q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, g: jnp.ndarray, beta: jnp.ndarray
) -> tuple[jnp.ndarray, ...]:
    """Casts to float32 and expands q/k to the value heads."""
    num_v_heads = v.shape[-2]
    f32 = jnp.float32
    q = _expand_heads(q.astype(f32), num_v_heads, axis=-2)
    k = _expand_heads(k.astype(f32), num_v_heads, axis=-2)
    return q, k, v.astype(f32), g.astype(f32), beta.astype(f32)


def delta_step(
    state: jnp.ndarray, q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, g: jnp.ndarray, beta: jnp.ndarray, scale: float
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """One recurrence step for ``[..., Hv]`` heads; returns ``(o [..., Hv, dv], new_state)``."""
    state = state * jnp.exp(g)[..., None, None]
    pred = mm("...hkv,...hk->...hv", state, k)
    u = beta[..., None] * (v - pred)
    state = state + k[..., :, None] * u[..., None, :]
    out = mm("...hkv,...hk->...hv", state, q * scale)
    return out, state


def _triangular_solve(system: jnp.ndarray, rhs: jnp.ndarray) -> jnp.ndarray:
    """``system^-1 rhs`` for a unit lower triangular ``system`` (the reference: a triangular solve)."""
    return solve_triangular(system, rhs, lower=True, unit_diagonal=True)


UnitLowerSolve = Callable[[jnp.ndarray, jnp.ndarray], jnp.ndarray]


def _chunk_terms(
    q: jnp.ndarray,
    k: jnp.ndarray,
    v: jnp.ndarray,
    g: jnp.ndarray,
    beta: jnp.ndarray,
    scale: float,
    solve: UnitLowerSolve = _triangular_solve,
) -> _ChunkTerms:
    """Intra-chunk UT transform for all chunks at once; inputs ``[N, Hv, C, ...]`` float32;
    ``solve(system, rhs)`` solves the unit lower triangular system."""
    chunk = g.shape[-1]
    cum = jnp.cumsum(g, axis=-1)  # G_i, [N, H, C]
    causal = jnp.tril(jnp.ones((chunk, chunk), dtype=bool))
    strict = jnp.tril(jnp.ones((chunk, chunk), dtype=bool), k=-1)
    diff = cum[..., :, None] - cum[..., None, :]
    decay = jnp.where(causal, jnp.exp(jnp.where(causal, diff, 0.0)), 0.0)  # exp(G_i - G_j), j <= i
    kk = mm("nhid,nhjd->nhij", k, k)
    system = jnp.where(strict, beta[..., :, None] * kk * decay, 0.0) + jnp.eye(chunk, dtype=jnp.float32)
    exp_cum = jnp.exp(cum)[..., None]
    rhs = jnp.concatenate([beta[..., None] * v, beta[..., None] * exp_cum * k], axis=-1)
    solved = solve(system, rhs)
    w_v, w_k = solved[..., : v.shape[-1]], solved[..., v.shape[-1] :]
    qs = q * scale
    attn = mm("nhid,nhjd->nhij", qs, k) * decay
    out_bias = mm("nhij,nhjv->nhiv", attn, w_v)
    out_read = qs * exp_cum - mm("nhij,nhjk->nhik", attn, w_k)
    last = cum[..., -1]  # padding slots have g = 0, so this is G at the last real token
    k_dec = k * jnp.exp(last[..., None] - cum)[..., None]
    eye_k = jnp.eye(k.shape[-1], dtype=jnp.float32)
    state_mul = jnp.exp(last)[..., None, None] * eye_k - mm("nhck,nhcj->nhkj", k_dec, w_k)
    state_add = mm("nhck,nhcv->nhkv", k_dec, w_v)
    return _ChunkTerms(out_bias, out_read, state_mul, state_add)


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
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Chunked gated delta rule over a packed batch.

    Returns ``(out [T, Hv, dv] in v.dtype, final_state [R, Hv, dk, dv] f32,
    chunk_states [num_chunks, Hv, dk, dv] f32)``; see the module docstring for the contract.
    ``pair_chunk int32 [R]`` (policy ``pair``): row ``r`` with ``pair_chunk[r] >= 0`` starts from
    ``chunk_states[pair_chunk[r]]`` instead of ``initial_state[r]`` (see
    :func:`radixflow_jax.kernels.layout.scan_chunks`; that chunk must belong to an unpaired row).
    """
    num_tokens = v.shape[0]
    scale = resolve_scale(scale, q.shape[-1])
    layout = chunk_layout(cu_seqlens, num_tokens, chunk_size)
    qf, kf, vf, gf, bf = prepare(q, k, v, g, beta)
    chunks = [heads_chunks(x, layout, chunk_size) for x in (qf, kf, vf, gf, bf)]
    terms = _chunk_terms(*chunks, scale=scale, solve=_triangular_solve)
    init = initial_state.astype(jnp.float32)
    step = lambda start, mul, add: mm("hkj,hjv->hkv", mul, start) + add  # noqa: E731
    starts, ends = scan_chunks(step, (terms.state_mul, terms.state_add), layout, init, pair_chunk)
    out = terms.out_bias + mm("nhck,nhkv->nhcv", terms.out_read, starts)
    out = scatter_chunks(jnp.moveaxis(out, 2, 1), layout, num_tokens).astype(v.dtype)
    final = final_states(ends, layout, init, pair_chunk)
    return out, final, ends


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
    """One token per row: ``q, k [B, Hk, dk]``, ``v [B, Hv, dv]``, ``g, beta [B, Hv]``,
    ``state [B, Hv, dk, dv]`` -> ``(out [B, Hv, dv] in v.dtype, new_state f32)``."""
    scale = resolve_scale(scale, q.shape[-1])
    qf, kf, vf, gf, bf = prepare(q, k, v, g, beta)
    out, new_state = delta_step(state.astype(jnp.float32), qf, kf, vf, gf, bf, scale)
    return out.astype(v.dtype), new_state
