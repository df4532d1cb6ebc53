"""Verify lanes (speculative decoding): the recurrent state of each prefill row after each of its
first ``steps`` tokens, so that a verify row's state can be kept at its last accepted token
(``runner/rollback.py``) instead of only at the end of its span.

The chunked scan materialises states only on the chunk grid; a verify row needs them at every
drafted position. :func:`verify_lanes` re-runs the first ``steps`` tokens of every prefill row with
the mixer's one-step update (the decode kernel, the arithmetic plain decoding uses for those
tokens) from the state the row started from, one *lane* per row. That costs ``steps`` one-step
updates per prefill row and layer, and is traced only in a variant's verify form
(``Variant.num_verify``). Lanes of rows that are not verify rows, and steps past a row's span, hold
states nobody reads."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from radixflow_jax.kernels import ops


class VerifyLanes(NamedTuple):
    """``conv [S, Rp, K-1, C]`` and ``ssm [S, Rp, ...]``: prefill row ``r``'s state after ``s + 1``
    tokens of its span at ``[s, r]``."""

    conv: jax.Array
    ssm: jax.Array


def verify_lanes(
    conv_in: jax.Array,
    cu: jax.Array,
    conv0: jax.Array,
    ssm0: jax.Array,
    inputs: tuple[jax.Array, ...],
    decode: Callable[[tuple[jax.Array, ...], jax.Array], tuple[jax.Array, jax.Array]],
    steps: int,
) -> VerifyLanes:
    """The lanes of the prefill region: ``conv_in [Tp, C]`` and the kernel ``inputs`` (each
    ``[Tp, ...]``) of its tokens, ``cu [Rp+1]`` its row bounds, ``conv0 / ssm0 [Rp, ...]`` the states
    its rows start from, ``decode(inputs of one token per row, ssm) -> (out, new ssm)``."""
    num_rows, last = cu.shape[0] - 1, conv_in.shape[0] - 1
    starts, lens = cu[:-1].astype(jnp.int32), (cu[1:] - cu[:-1]).astype(jnp.int32)

    def one(ssm: jax.Array, s: jax.Array) -> tuple[jax.Array, jax.Array]:
        token = jnp.clip(starts + s, 0, last)
        _, new = decode(tuple(x[token] for x in inputs), ssm)
        return new, new

    _, ssm = jax.lax.scan(one, ssm0, jnp.arange(steps, dtype=jnp.int32))
    rows = jnp.tile(jnp.arange(num_rows, dtype=jnp.int32), steps)
    offsets = jnp.minimum(jnp.repeat(jnp.arange(1, steps + 1, dtype=jnp.int32), num_rows), lens[rows])
    conv = ops.conv_states_at(conv_in, cu, conv0, rows, offsets)
    return VerifyLanes(conv.reshape((steps, num_rows) + conv.shape[1:]), ssm)
