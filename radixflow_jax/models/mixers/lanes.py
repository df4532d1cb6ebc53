"""Verify lanes (speculative decoding): what a recurrent layer keeps of each prefill row's first
``steps`` tokens so that, once the step knows how many drafted tokens were accepted, the state
after any of those tokens can be written (``runner/rollback.py``), instead of only the state at
the end of the span.

Both mixers' recurrences have a per-head scalar decay and a rank-one update per token,
``S_t = exp(d_t) S_{t-1} + l_t r_t^T`` (Mamba2: ``d = dt A``, ``l = dt x``, ``r = B``; Gated
DeltaNet: ``d = g``, ``l = k``, ``r = u = beta (v - (exp(g) S_{t-1})^T k)``). So with
``G_j = d_0 + ... + d_j``, the state after ``a`` tokens is

    ``S = exp(G_{a-1}) S_0 + sum_{i < a} exp(G_{a-1} - G_i) l_i r_i^T``

and a lane holds only ``S_0`` (the state the row started from, already read), the vectors ``l``,
``r`` and ``G`` (:class:`VerifyLanes`): no state is materialised per drafted token, and
:func:`lane_state` writes one state per row. Gated DeltaNet's ``u_i`` needs ``S_{i-1}^T k_i``,
which is ``exp(G_{i-1}) S_0^T k_i`` plus the earlier tokens' rank-one terms: one product of
``S_0`` with the row's keys (:func:`delta_lane_terms`). The decays stay in log space (a ratio of
cumulated decays could underflow to 0/0). Lanes of rows that are not verify rows, and steps past
a row's span, hold values nobody reads."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from radixflow_jax.kernels import ops

_HI = jax.lax.Precision.HIGHEST
LaneTerms = Callable[[tuple[jax.Array, ...], jax.Array], tuple[jax.Array, jax.Array, jax.Array]]


class VerifyLanes(NamedTuple):
    """A layer's lanes over ``Rp`` prefill rows and ``S`` steps: ``conv [S, Rp, K-1, C]`` (the conv
    state after ``s + 1`` tokens at ``[s, r]``), ``ssm0 [Rp, H, A, B]`` (the state each row started
    from), ``left [Rp, S, H, A]``, ``right [Rp, S, H, B]``, ``decay [Rp, S, H]`` (``G``, cumulated
    log decays)."""

    conv: jax.Array
    ssm0: jax.Array
    left: jax.Array
    right: jax.Array
    decay: jax.Array


def verify_lanes(
    conv_in: jax.Array,
    cu: jax.Array,
    conv0: jax.Array,
    ssm0: jax.Array,
    inputs: tuple[jax.Array, ...],
    terms: LaneTerms,
    steps: int,
) -> VerifyLanes:
    """The lanes of the prefill region: ``conv_in [Tp, C]`` and the kernel ``inputs`` (each
    ``[Tp, ...]``) of its tokens, ``cu [Rp+1]`` its row bounds, ``conv0 / ssm0 [Rp, ...]`` the states
    its rows start from; ``terms(inputs of each row's first tokens, each [Rp, S, ...], ssm0) ->
    (left, right, log decay per token)``."""
    num_rows, last = cu.shape[0] - 1, conv_in.shape[0] - 1
    starts, lens = cu[:-1].astype(jnp.int32), (cu[1:] - cu[:-1]).astype(jnp.int32)
    s = jnp.arange(steps, dtype=jnp.int32)
    tokens = jnp.clip(starts[:, None] + s[None, :], 0, last)  # [Rp, S]
    left, right, decay = terms(tuple(x[tokens] for x in inputs), ssm0)
    rows = jnp.tile(jnp.arange(num_rows, dtype=jnp.int32), steps)
    offsets = jnp.minimum(jnp.repeat(s + 1, num_rows), lens[rows])
    conv = ops.conv_states_at(conv_in, cu, conv0, rows, offsets)
    return VerifyLanes(conv.reshape((steps, num_rows) + conv.shape[1:]), ssm0, left, right, jnp.cumsum(decay, axis=1))


def lane_state(lanes: VerifyLanes, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(conv, ssm)`` of each row after ``step[r] + 1`` tokens (``0 <= step < S``)."""
    rows = jnp.arange(step.shape[0])
    at = lanes.decay[rows, step]  # [Rp, H]: G_{a-1}
    i = jnp.arange(lanes.decay.shape[1])
    within = (i[None, :] <= step[:, None])[..., None]  # [Rp, S, 1]
    coeff = jnp.where(within, jnp.exp(jnp.minimum(at[:, None, :] - lanes.decay, 0.0)), 0.0)
    ssm = jnp.exp(at)[..., None, None] * lanes.ssm0.astype(jnp.float32) + jnp.einsum(
        "rih,riha,rihb->rhab", coeff, lanes.left, lanes.right, precision=_HI
    )
    return lanes.conv[step, rows], ssm


def delta_lane_terms(
    inputs: tuple[jax.Array, ...], ssm0: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Gated DeltaNet: ``inputs = (q, k, v, g, beta)`` of each row's first tokens, ``[Rp, S, ...]``;
    ``ssm0 [Rp, Hv, dk, dv]``. ``u_i = beta_i (v_i - (exp(g_i) S_{i-1})^T k_i)`` with
    ``(exp(g_i) S_{i-1})^T k_i = exp(G_i) S_0^T k_i + sum_{l < i} exp(G_i - G_l) (k_l . k_i) u_l``."""
    _, k, v, g, beta = (x.astype(jnp.float32) for x in inputs)
    k = jnp.repeat(k, v.shape[-2] // k.shape[-2], axis=-2)  # key heads interleaved up to the value heads
    big = jnp.cumsum(g, axis=1)  # [Rp, S, H]
    first = jnp.einsum("rhkv,rihk->rihv", ssm0.astype(jnp.float32), k, precision=_HI)  # S_0^T k_i
    dots = jnp.einsum("rlhk,rihk->rhil", k, k, precision=_HI)  # (k_l . k_i)
    us: list[jax.Array] = []
    for i in range(k.shape[1]):
        acc = jnp.exp(big[:, i])[..., None] * first[:, i]
        for l, u in enumerate(us):
            acc = acc + (jnp.exp(big[:, i] - big[:, l]) * dots[:, :, i, l])[..., None] * u
        us.append(beta[:, i][..., None] * (v[:, i] - acc))
    return k, jnp.stack(us, axis=1), g


def ssd_lane_terms(a: jax.Array) -> LaneTerms:
    """Mamba2 with ``A [H]``: ``inputs = (x, dt, B, C)`` of each row's first tokens; ``l = dt x``,
    ``r = B`` (each group's ``B`` repeated over its heads), log decay ``dt A``."""

    def terms(inputs: tuple[jax.Array, ...], ssm0: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        del ssm0  # the update does not read the state
        x, dt, b, _ = inputs
        dt = dt.astype(jnp.float32)
        heads = jnp.repeat(b.astype(jnp.float32), x.shape[-2] // b.shape[-2], axis=-2)
        return dt[..., None] * x.astype(jnp.float32), heads, dt * a.astype(jnp.float32)

    return terms
