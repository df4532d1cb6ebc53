"""Mamba2 state-space duality (SSD) reference kernels in pure ``jax.numpy``.

Per head ``h`` (using B/C group ``h // (H // G)``) the recurrence over a row's tokens is::

    state_t = exp(dt_t * A) * state_{t-1} + dt_t * outer(x_t, B_t)      # [P, N]
    y_t     = state_t @ C_t                                              # [P]

with ``state_{-1} = initial_state[row]``. No D skip term and no gating: the caller adds
``D * x`` and the gate. ``dt`` arrives already softplus'ed and clamped (``dt > 0``) and ``A < 0``.

Invariants:
  * All math is float32 (matmuls at ``Precision.HIGHEST``); ``y`` has ``x``'s dtype, states f32.
  * Padding tokens (at or after ``cu_seqlens[R]``) get ``y == 0`` and never touch any state.
  * ``final_state[r] == initial_state[r]`` for zero-length rows.
  * ``chunk_states[c]`` is the state after chunk ``c`` of
    :func:`radixflow_jax.kernels.layout.chunk_layout`; unused chunks hold finite junk.
  * Shapes depend only on static input shapes and ``chunk_size``; everything is jit-able.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from radixflow_jax.kernels.layout import chunk_layout, final_states, gather_chunks, scan_chunks, scatter_chunks

_HI = jax.lax.Precision.HIGHEST
_F32 = jnp.float32


def check_shapes(x: jnp.ndarray, dt: jnp.ndarray, A: jnp.ndarray, B: jnp.ndarray, C: jnp.ndarray) -> None:
    """Static shape checks shared by all entry points (x [.., H, P], B/C [.., G, N])."""
    heads, groups = x.shape[-2], B.shape[-2]
    if dt.shape != x.shape[:-1] or A.shape != (heads,) or B.shape != C.shape:
        raise ValueError(f"bad SSD shapes x={x.shape} dt={dt.shape} A={A.shape} B={B.shape} C={C.shape}")
    if heads % groups:
        raise ValueError(f"heads {heads} not divisible by groups {groups}")


def _heads_per_group(x: jnp.ndarray, B: jnp.ndarray) -> int:
    return x.shape[-2] // B.shape[-2]


# ----------------------------------------------------------------------------- per-token step


def ssd_step(
    state: jnp.ndarray, x: jnp.ndarray, dt: jnp.ndarray, A: jnp.ndarray, B: jnp.ndarray, C: jnp.ndarray
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """One recurrence step of one row: state [H, P, N], x [H, P], dt [H], B/C [G, N] -> (state', y [H, P])."""
    k = _heads_per_group(x, B)
    b = jnp.repeat(B.astype(_F32), k, axis=0)  # [H, N]
    c = jnp.repeat(C.astype(_F32), k, axis=0)
    dt = dt.astype(_F32)
    decay = jnp.exp(dt * A.astype(_F32))[:, None, None]
    new = decay * state + (dt[:, None] * x.astype(_F32))[:, :, None] * b[:, None, :]
    y = jnp.einsum("hpn,hn->hp", new, c, precision=_HI)
    return new, y


def ssd_decode(
    x: jnp.ndarray, dt: jnp.ndarray, A: jnp.ndarray, B: jnp.ndarray, C: jnp.ndarray, state: jnp.ndarray
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """One token per row: x [Bt, H, P], dt [Bt, H], B/C [Bt, G, N], state f32 [Bt, H, P, N].

    Returns ``(y [Bt, H, P] in x's dtype, new_state f32 [Bt, H, P, N])``.
    """
    check_shapes(x, dt, A, B, C)
    new, y = jax.vmap(ssd_step, in_axes=(0, 0, 0, None, 0, 0))(jnp.asarray(state, _F32), x, dt, A, B, C)
    return y.astype(x.dtype), new


# ----------------------------------------------------------------------------- chunked SSD


def _segsum(a: jnp.ndarray) -> jnp.ndarray:
    """``a [..., Q] -> [..., Q, Q]`` with ``out[i, j] = sum(a[j+1 : i+1])`` for ``i >= j``, else ``-inf``.

    Built from a masked cumsum (not a difference of cumsums) so nearby entries stay exact.
    """
    q = a.shape[-1]
    rep = jnp.broadcast_to(a[..., :, None], a.shape + (q,))  # rep[..., k, j] = a[k]
    strict = jnp.tril(jnp.ones((q, q), bool), -1)  # k > j
    summed = jnp.cumsum(jnp.where(strict, rep, 0.0), axis=-2)
    return jnp.where(jnp.tril(jnp.ones((q, q), bool)), summed, -jnp.inf)


def _chunk_terms(
    xc: jnp.ndarray, dtc: jnp.ndarray, A: jnp.ndarray, bc: jnp.ndarray, cc: jnp.ndarray
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Per-chunk (parallel) terms from gathered chunks.

    xc [NC, Q, H, P], dtc [NC, Q, H] (0 on padding slots), bc/cc [NC, Q, G, N], all f32.
    Returns ``(y_diag [NC, Q, H, P], own_state [NC, H, P, N], total_decay [NC, H],
    decay_in [NC, Q, H])``: the intra-chunk output, the chunk's end state from a zero start,
    ``exp(sum a)`` over the chunk, and ``exp(cumsum a)`` (decay from chunk start to token i).
    """
    nc, q, heads, p = xc.shape
    groups, n = bc.shape[2], bc.shape[3]
    k = heads // groups
    a = jnp.swapaxes(dtc * A[None, None, :], 1, 2)  # [NC, H, Q]
    seg = jnp.exp(_segsum(a)).reshape(nc, groups, k, q, q)  # L[i, j]
    cum = jnp.cumsum(a, axis=-1)  # [NC, H, Q]
    xdt = (xc * dtc[..., None]).reshape(nc, q, groups, k, p)
    cb = jnp.einsum("cign,cjgn->cgij", cc, bc, precision=_HI)
    y_diag = jnp.einsum("cgij,cgkij,cjgkp->cigkp", cb, seg, xdt, precision=_HI)
    to_end = seg[..., -1, :]  # [NC, G, K, Q]: decay from token j to the chunk end
    own = jnp.einsum("cgkj,cjgkp,cjgn->cgkpn", to_end, xdt, bc, precision=_HI)
    return (
        y_diag.reshape(nc, q, heads, p),
        own.reshape(nc, heads, p, n),
        jnp.exp(cum[..., -1]),
        jnp.swapaxes(jnp.exp(cum), 1, 2),
    )


def ssd_chunked(
    x: jnp.ndarray,
    dt: jnp.ndarray,
    A: jnp.ndarray,
    B: jnp.ndarray,
    C: jnp.ndarray,
    cu_seqlens: jnp.ndarray,
    initial_state: jnp.ndarray,
    *,
    chunk_size: int = 64,
    pair_chunk: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Chunked SSD over a packed batch.

    x [T, H, P]; dt [T, H] (> 0); A [H] (< 0); B, C [T, G, N]; cu_seqlens int32 [R + 1];
    initial_state f32 [R, H, P, N]. Returns ``(y [T, H, P] in x's dtype, final_state f32
    [R, H, P, N], chunk_states f32 [num_chunks, H, P, N])``. ``pair_chunk int32 [R]`` (policy
    ``pair``): row ``r`` with ``pair_chunk[r] >= 0`` starts from ``chunk_states[pair_chunk[r]]``
    (see :func:`radixflow_jax.kernels.layout.scan_chunks`).
    """
    check_shapes(x, dt, A, B, C)
    num_tokens = x.shape[0]
    layout = chunk_layout(jnp.asarray(cu_seqlens), num_tokens, chunk_size)
    gather = lambda v: gather_chunks(jnp.asarray(v, _F32), layout, chunk_size)  # noqa: E731
    xc, dtc, bc, cc = gather(x), gather(dt), gather(B), gather(C)
    y_diag, own, total_decay, decay_in = _chunk_terms(xc, dtc, jnp.asarray(A, _F32), bc, cc)
    step = lambda start, own_c, decay_c: decay_c[:, None, None] * start + own_c  # noqa: E731
    starts, ends = scan_chunks(step, (own, total_decay), layout, initial_state, pair_chunk)
    groups = bc.shape[2]
    nc, q, heads, p = xc.shape
    k = heads // groups
    starts_g = starts.reshape(nc, groups, k, p, -1)
    y_off = jnp.einsum("cign,cgkpn->cigkp", cc, starts_g, precision=_HI).reshape(nc, q, heads, p)
    y = y_diag + decay_in[..., None] * y_off
    out = scatter_chunks(y, layout, num_tokens).astype(x.dtype)
    return out, final_states(ends, layout, initial_state, pair_chunk), ends
