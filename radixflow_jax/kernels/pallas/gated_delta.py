"""Pallas chunked gated delta rule (same contract as :func:`radixflow_jax.kernels.gated_delta.gated_delta_chunked`).

Split of the work:
  * jnp, parallel over chunks and heads: the layout gather (:mod:`radixflow_jax.kernels.layout`),
    the in-chunk cumulative log-decay ``G`` and the WY / UT transform: with the strictly lower
    triangular ``A_ij = beta_i exp(G_i - G_j) k_i . k_j``, solve ``(I + A) [U | W] =
    [beta V | beta exp(G) K]`` so a chunk's corrected values are ``U - W S0`` for its start state
    ``S0``. This needs no state, so it is one batched triangular solve.
  * Pallas, sequential over each row's chunks, per (value head, dv block): the decayed chunk
    body of :mod:`.decayed_scan` with query ``scale q``, key ``k``, log-decay ``G`` and the
    corrected values ``Uc = U - W S0`` (``extra = W``), the state ``[dk, dv]``::

        O     = (scale q e^G) S0 + ((scale q k^T) o e^{G_i - G_j})_{j<=i} Uc
        S_end = e^{G_last} S0 + (k e^{G_last - G})^T Uc    [dk, bv]

    The running state never leaves the kernel between chunks; it restarts from
    ``initial_state[row]`` at each row's first chunk.

The scan itself is :func:`.chunk_scan.chunk_scan` (``backend="tpu"``: grid ``(Hv, dv blocks,
chunks)``, state in VMEM scratch, reset/row flags by scalar prefetch; ``backend="gpu"``: grid
``(R + 1, Hv, dv blocks)``, one program per row looping over its chunks).

Invariants (as the reference): q/k arrive L2-normalised; value head ``j`` reads key head
``j // (Hv // Hk)``; math in float32; ``out`` in ``v.dtype``; states float32; padding tokens give
0 and touch no state; unused chunks hold a finite placeholder (the carried state on ``"tpu"``,
zeros on ``"gpu"``); a zero-length row's final state is its initial state.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from radixflow_jax.kernels.layout import ChunkLayout, chunk_layout, gather_chunks
from radixflow_jax.kernels.pallas.common import Backend, check_pow2, pick_block, resolve_backend
from radixflow_jax.kernels.pallas.decayed_scan import decayed_scan

_F32 = jnp.float32
_HI = jax.lax.Precision.HIGHEST


class _Chunked(NamedTuple):
    """Kernel-facing per-chunk arrays, head-major so blocks are ``[C, d]`` tiles."""

    q: jnp.ndarray  # [Hk, N, C, dk] input dtype
    k: jnp.ndarray  # [Hk, N, C, dk] input dtype
    g: jnp.ndarray  # [Hv, N, C] f32 cumulative log-decay in the chunk
    w: jnp.ndarray  # [Hv, N, C, dk] f32 (I + A)^-1 beta e^G K
    u: jnp.ndarray  # [Hv, N, C, dv] f32 (I + A)^-1 beta V


def _heads_first(x: jnp.ndarray) -> jnp.ndarray:
    """``[N, C, H, ...] -> [H, N, C, ...]``."""
    return jnp.moveaxis(x, 2, 0)


def _prepare(
    q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, g: jnp.ndarray, beta: jnp.ndarray, layout: ChunkLayout, chunk: int
) -> _Chunked:
    """Gathers chunks and runs the state-free UT transform for every (chunk, value head) at once."""
    num_k_heads, num_v_heads = q.shape[1], v.shape[1]
    if num_v_heads % num_k_heads:
        raise ValueError(f"Hv={num_v_heads} is not a multiple of Hk={num_k_heads}")
    group = num_v_heads // num_k_heads
    qc = _heads_first(gather_chunks(q, layout, chunk))
    kc = _heads_first(gather_chunks(k, layout, chunk))
    vc = _heads_first(gather_chunks(v.astype(_F32), layout, chunk))  # [Hv, N, C, dv]
    gcum = jnp.cumsum(_heads_first(gather_chunks(g.astype(_F32), layout, chunk)), axis=-1)  # [Hv, N, C]
    bc = _heads_first(gather_chunks(beta.astype(_F32), layout, chunk))  # [Hv, N, C]
    kv = jnp.repeat(kc.astype(_F32), group, axis=0)  # [Hv, N, C, dk]
    kk = jnp.repeat(jnp.einsum("hnid,hnjd->hnij", kc.astype(_F32), kc.astype(_F32), precision=_HI), group, axis=0)
    strict = jnp.tril(jnp.ones((chunk, chunk), bool), k=-1)
    diff = gcum[..., :, None] - gcum[..., None, :]
    lower = jnp.where(strict, bc[..., :, None] * kk * jnp.exp(jnp.where(strict, diff, 0.0)), 0.0)
    system = lower + jnp.eye(chunk, dtype=_F32)
    rhs = jnp.concatenate([bc[..., None] * vc, (bc * jnp.exp(gcum))[..., None] * kv], axis=-1)
    solved = solve_triangular(system, rhs, lower=True, unit_diagonal=True)
    dv = v.shape[-1]
    return _Chunked(qc, kc, gcum, solved[..., dv:], solved[..., :dv])


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
    backend: Backend | None = None,
    interpret: bool = False,
    block_v: int | None = None,
    pair_chunk: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Chunked gated delta rule over a packed batch, recurrence in Pallas.

    Returns ``(out [T, Hv, dv] in v.dtype, final_state [R, Hv, dk, dv] f32,
    chunk_states [num_chunks, Hv, dk, dv] f32)``. ``block_v`` splits ``dv`` across grid programs
    (default: all of ``dv``); ``backend``/``interpret`` pick the lowering variant (module docstring).
    ``pair_chunk``: the reference's contract (``kernels/gated_delta.py``), served as ``chunk_scan`` says.
    """
    backend = resolve_backend(backend, interpret)
    num_tokens, dk, dv = v.shape[0], q.shape[-1], v.shape[-1]
    scale = dk**-0.5 if scale is None else float(scale)
    block_v = pick_block(dv, block_v)
    check_pow2(backend, chunk_size=chunk_size, dk=dk, block_v=block_v)
    cu = jnp.asarray(cu_seqlens, jnp.int32)
    layout = chunk_layout(cu, num_tokens, chunk_size)
    chunked = _prepare(q, k, v, g, beta, layout, chunk_size)
    return decayed_scan(
        chunked.q,
        chunked.k,
        chunked.u,
        chunked.g,
        chunked.w,
        jnp.asarray(initial_state, _F32),
        layout,
        num_tokens=num_tokens,
        scale=scale,
        value_major=False,
        gated=False,
        group=v.shape[1] // q.shape[1],
        block=block_v,
        out_dtype=v.dtype,
        backend=backend,
        interpret=interpret,
        name="gated_delta_chunked",
        pair_chunk=pair_chunk,
    )
