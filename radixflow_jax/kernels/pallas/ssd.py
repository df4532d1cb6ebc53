"""Pallas chunked Mamba2 SSD (same contract as :func:`radixflow_jax.kernels.ssd.ssd_chunked`).

Per head ``h`` (B/C group ``h // (H // G)``) with state ``S`` in ``R^{P x N}``::

    S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T,     y_t = S_t C_t

Split of the work:
  * jnp, parallel: the layout gather (:mod:`radixflow_jax.kernels.layout`) into head-major
    ``[H, chunks, C, ...]`` tiles and the in-chunk cumulative log-decay ``a = cumsum(dt A)``.
  * Pallas, one chunk per step, per (head, P block): the decayed chunk body of
    :mod:`.decayed_scan` with query ``C``, key ``B``, log-decay ``a`` and the values
    ``X = dt * x`` (``[C, bp]``, gated in the kernel), the state ``[P, N]`` (``value_major``)::

        Y     = ((C B^T) o e^{a_i - a_j})_{j<=i} X + e^{a} (C S0^T)      [C, bp]
        S_end = e^{a_last} S0 + (X e^{a_last - a})^T B                    [bp, N]

    B/C tiles are read per group through the ``index_map`` (never repeated per head in memory).
    The scan is :func:`.chunk_scan.chunk_scan` (``backend="tpu"``: chunk axis ``"arbitrary"``,
    state in VMEM scratch, reset/row flags by scalar prefetch; ``backend="gpu"``: one program per
    row looping over its chunks).

Invariants (as the reference): no ``D`` skip term and no gate; ``dt > 0`` already softplus'ed,
``A < 0``; math in float32; ``y`` in ``x``'s dtype; states float32; padding tokens give 0 and
touch no state; a zero-length row's final state is its initial state; unused chunks hold a
finite placeholder.
"""

from __future__ import annotations

import jax.numpy as jnp

from radixflow_jax.kernels.layout import chunk_layout, gather_chunks
from radixflow_jax.kernels.pallas.common import Backend, check_pow2, pick_block, resolve_backend
from radixflow_jax.kernels.pallas.decayed_scan import decayed_scan
from radixflow_jax.kernels.ssd import check_shapes

_F32 = jnp.float32


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
    backend: Backend | None = None,
    interpret: bool = False,
    block_p: int | None = None,
    pair_chunk: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Chunked SSD over a packed batch, recurrence in Pallas.

    x [T, H, P]; dt [T, H]; A [H]; B, C [T, G, N]; cu_seqlens int32 [R + 1]; initial_state f32
    [R, H, P, N]. Returns ``(y [T, H, P] in x's dtype, final_state f32 [R, H, P, N],
    chunk_states f32 [num_chunks, H, P, N])``. ``block_p`` splits ``P`` across grid programs.
    ``pair_chunk``: the reference's contract (``kernels/ssd.py``), served as ``chunk_scan`` says.
    """
    check_shapes(x, dt, A, B, C)
    backend = resolve_backend(backend, interpret)
    num_tokens, heads, p = x.shape
    group = heads // B.shape[-2]
    block_p = pick_block(p, block_p)
    check_pow2(backend, chunk_size=chunk_size, block_p=block_p, state_dim=B.shape[-1])
    layout = chunk_layout(jnp.asarray(cu_seqlens, jnp.int32), num_tokens, chunk_size)

    def tiles(v: jnp.ndarray) -> jnp.ndarray:  # [T, H, ...] -> [H, chunks, C, ...]
        return jnp.moveaxis(gather_chunks(v, layout, chunk_size), 2, 0)

    dtc = tiles(jnp.asarray(dt, _F32))  # [H, NC, C]
    return decayed_scan(
        tiles(C),
        tiles(B),
        tiles(x),
        jnp.cumsum(dtc * jnp.asarray(A, _F32)[:, None, None], axis=-1),
        dtc,
        jnp.asarray(initial_state, _F32),
        layout,
        num_tokens=num_tokens,
        scale=1.0,
        value_major=True,
        gated=True,
        group=group,
        block=block_p,
        out_dtype=x.dtype,
        backend=backend,
        interpret=interpret,
        name="ssd_chunked",
        pair_chunk=pair_chunk,
    )
