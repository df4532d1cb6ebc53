"""The one chunk body of the Pallas scans: a linear recurrence whose state decays by a per-token factor.

Both chunked kernels (:mod:`.gated_delta`, :mod:`.ssd`) scan the same recurrence over a state
``S`` that pairs a key axis (``dk``) with a value axis (``dv``). Per chunk of ``C`` tokens, with
query ``Q [C, dk]``, key ``K [C, dk]``, values ``V [C, dv]`` and the in-chunk cumulative
log-decay ``a [C]`` (``a_last`` its last entry), from the chunk's start state ``S0``::

    O     = ((Q K^T) o e^{a_i - a_j})_{j<=i} V + (e^{a} Q) S0        [C, dv]
    S_end = e^{a_last} S0 + (K e^{a_last - a})^T V                    [dk, dv]

What differs between the two, and is a parameter here:
  * the decay form: the caller passes ``a``, the cumulative sum of ``g`` (gated delta) or of
    ``dt A`` (SSD), computed in jnp;
  * grouped heads: query and key tiles have ``H / group`` heads, head ``h`` reading ``h // group``
    (gated delta's key heads, SSD's B/C groups) through the ``index_map``, never repeated in memory;
  * the query scale (gated delta's ``scale``; SSD's 1, which leaves ``Q`` unchanged bit for bit);
  * the values: SSD's are ``dt x``, gated per token in the kernel (``gated``, ``extra = dt``);
    gated delta's are the WY-corrected ``U - W S0``, which need the start state and so are formed
    in the kernel (``extra = W``);
  * the state's orientation: ``[dk, dv]`` (gated delta) or ``[dv, dk]`` (``value_major``, SSD's
    ``[P, N]``), the products transposed to match.

The scan is :func:`.chunk_scan.chunk_scan`; the value axis is split into ``dv / block`` column
blocks, each scanned by its own grid program. Invariants: math in float32 (``Precision.HIGHEST``);
the output in ``out_dtype``; states float32; padding tokens give 0 and touch no state; a
zero-length row's final state is its initial state; unused chunks hold a finite placeholder.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from radixflow_jax.kernels.layout import ChunkLayout, final_states, scatter_chunks
from radixflow_jax.kernels.pallas.chunk_scan import ChunkInput, chunk_scan
from radixflow_jax.kernels.pallas.common import Backend, decay_matrix, last_of_column, mm, mm_nt, mm_tn

_F32 = jnp.float32


def _chunk_body(
    query: jnp.ndarray,
    key: jnp.ndarray,
    acol: jnp.ndarray,
    arow: jnp.ndarray,
    values: jnp.ndarray,
    extra: jnp.ndarray,
    state: jnp.ndarray,
    *,
    scale: float,
    value_major: bool,
    gated: bool,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """One chunk on loaded values: query/key ``[C, dk]``, ``acol [C, 1]``, ``arow [1, C]``, values
    ``[C, bv]``, then the gate ``[C, 1]`` (``gated``) or the correction ``W [C, dk]`` (otherwise),
    then the start state (``[dk, bv]``, or ``[bv, dk]`` when ``value_major``). Returns
    ``(out [C, bv] f32, end state f32)`` as the module docstring's formula."""
    read = mm_nt if value_major else mm  # read(x [C, dk], S) = x S in the [dk, dv] orientation: [C, bv]
    q = query.astype(_F32) * scale
    k = key.astype(_F32)
    v = values.astype(_F32) * extra if gated else values - read(extra, state)
    scores = mm_nt(q, k) * decay_matrix(acol, arow)
    out = mm(scores, v) + jnp.exp(acol) * read(q, state)
    alast = last_of_column(acol)  # [1, 1]
    decay = jnp.exp(alast - acol)  # [C, 1]: each token's weight in the end state
    update = mm_tn(v * decay, k) if value_major else mm_tn(k * decay, v)
    return out, jnp.exp(alast) * state + update


def decayed_scan(
    query: jnp.ndarray,
    key: jnp.ndarray,
    values: jnp.ndarray,
    log_decay: jnp.ndarray,
    extra: jnp.ndarray,
    initial_state: jnp.ndarray,
    layout: ChunkLayout,
    *,
    num_tokens: int,
    scale: float,
    value_major: bool,
    gated: bool,
    group: int,
    block: int,
    out_dtype: jnp.dtype,
    backend: Backend,
    interpret: bool,
    name: str,
    pair_chunk: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Scans the module's recurrence over chunk tiles and scatters the output back to tokens.

    ``query, key [H / group, N, C, dk]`` and ``values [H, N, C, dv]`` (any float dtype),
    ``log_decay [H, N, C]`` float32 cumulative in the chunk, ``extra`` the gate ``[H, N, C]`` when
    ``gated`` else the correction ``W [H, N, C, dk]`` float32, ``initial_state [R, H, ...]`` float32
    in the state's orientation; ``block`` divides ``dv``. Returns ``(out [num_tokens, H, dv] in
    out_dtype, final_state [R, H, ...], chunk_states [N, H, ...])``, ``pair_chunk`` served as
    :func:`.chunk_scan.chunk_scan` says."""
    dv = values.shape[-1]
    inputs = [
        ChunkInput(query, head_div=group),
        ChunkInput(key, head_div=group),
        ChunkInput(log_decay[..., None]),
        ChunkInput(log_decay[..., None, :]),
        ChunkInput(values, split_axis=-1),
        ChunkInput(extra[..., None] if gated else extra),
    ]
    body = functools.partial(_chunk_body, scale=scale, value_major=value_major, gated=gated)
    out, states = chunk_scan(
        body,
        inputs,
        initial_state,
        layout,
        out_width=dv,
        out_dtype=out_dtype,
        state_split_axis=-2 if value_major else -1,
        num_blocks=dv // block,
        backend=backend,
        interpret=interpret,
        name=name,
        pair_chunk=pair_chunk,
    )
    out = scatter_chunks(jnp.moveaxis(out, 0, 2), layout, num_tokens)
    return out, final_states(states, layout, initial_state, pair_chunk), states
