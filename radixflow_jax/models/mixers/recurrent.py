"""Pieces shared by the recurrent mixers (Gated DeltaNet, Mamba2): the depthwise causal conv and
its split into decode rows (one-step update) and prefill rows (packed scan).

Rows ``[:num_decode]`` own the first ``num_decode`` token slots, one token each; the rest of the
rows form a packed ragged batch over the remaining slots (see ``models/batch.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from radixflow_jax.kernels import ops
from radixflow_jax.models.batch import Batch


class DepthwiseConv1d(nnx.Module):
    """Holds the HF ``conv1d.weight [C, 1, K]`` (and optional bias) of a depthwise causal conv."""

    def __init__(self, channels: int, kernel: int, *, bias: bool, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.weight = nnx.Param((jax.random.normal(rngs.params(), (channels, 1, kernel)) * 0.2).astype(dtype))
        self.bias = nnx.Param(jnp.zeros((channels,), dtype)) if bias else None

    def kernel(self) -> jax.Array:
        return self.weight[...][:, 0, :]

    def bias_or_none(self) -> jax.Array | None:
        return self.bias[...] if self.bias is not None else None


def run_conv(
    conv: DepthwiseConv1d, x: jax.Array, batch: Batch, state: jax.Array, num_decode: int
) -> tuple[jax.Array, jax.Array]:
    """Causal conv + SiLU over packed ``x [T, C]``; ``state [R, K-1, C]`` -> ``(y [T, C], new [R, ...])``."""
    num_rows = batch.state_slots.shape[0]
    ys, states = [], []
    if num_decode:
        y, s = ops.causal_conv1d_update(x[:num_decode], conv.kernel(), conv.bias_or_none(), state[:num_decode])
        ys.append(y)
        states.append(s)
    if num_rows > num_decode:
        cu = batch.cu_seqlens[num_decode:] - num_decode
        y, s = ops.causal_conv1d(x[num_decode:], conv.kernel(), conv.bias_or_none(), cu, state[num_decode:])
        ys.append(y)
        states.append(s)
    elif x.shape[0] > num_decode:
        ys.append(jnp.zeros_like(x[num_decode:]))
    return jnp.concatenate(ys, axis=0), jnp.concatenate(states, axis=0)
