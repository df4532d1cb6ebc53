"""Granite-4.0-H's MLPs, kept in their fused on-disk layout (Flax NNX).

``GluMlp`` (``shared_mlp``): ``input_linear [2I, H]`` yields ``gate | up`` (first half, second
half), ``output_linear(silu(gate) * up)``. ``FusedMoe`` (``block_sparse_moe``): a bias-free router
``router.layer [E, H]``; top-k of the float32 router logits, softmax over those k (cast back to the
input dtype); experts stored as the checkpoint's 3-D tensors ``input_linear [E, 2I, H]`` and
``output_linear [E, H, I]``, applied with ``ragged_dot_general`` contracting their last axis, so
parameter paths and shapes equal the checkpoint's keys and shapes (no loader special case).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from radixflow_jax.models.config import MoeConfig
from radixflow_jax.models.layers import Linear, _normal, group_by_expert

_CONTRACT_LAST = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(([1], [2]), ([], [])), lhs_ragged_dimensions=[0], rhs_group_dimensions=[0]
)


class GluMlp(nnx.Module):
    """``output_linear(silu(gate) * up)`` with ``gate | up = input_linear(x)`` split in halves."""

    def __init__(self, hidden: int, inter: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.input_linear = Linear(hidden, 2 * inter, bias=False, dtype=dtype, rngs=rngs)
        self.output_linear = Linear(inter, hidden, bias=False, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        gate, up = jnp.split(self.input_linear(x), 2, axis=-1)
        return self.output_linear(jax.nn.silu(gate) * up)


class StackedLinear(nnx.Module):
    """Per-expert ``[E, out, in]`` weight (HF layout) applied to rows grouped by expert."""

    def __init__(self, num: int, in_features: int, out_features: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.weight = nnx.Param(_normal(rngs, (num, out_features, in_features), dtype))

    def __call__(self, xs: jax.Array, sizes: jax.Array) -> jax.Array:
        """``xs [N, in]`` sorted by expert, ``sizes [E]`` rows per expert -> ``[N, out]``."""
        return jax.lax.ragged_dot_general(xs, self.weight[...], sizes, _CONTRACT_LAST)


class ExpertRouter(nnx.Module):
    """Granite's bias-free expert router, ``layer [E, H]`` (checkpoint ``router.layer``); the
    top-k and softmax are :class:`FusedMoe`'s."""

    def __init__(self, num: int, hidden: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.layer = Linear(hidden, num, bias=False, dtype=dtype, rngs=rngs)


class FusedMoe(nnx.Module):
    """Routed SwiGLU experts; the caller adds the shared :class:`GluMlp`."""

    def __init__(self, cfg: MoeConfig, hidden: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.top_k = cfg.top_k
        self.router = ExpertRouter(cfg.num_experts, hidden, dtype=dtype, rngs=rngs)
        self.input_linear = StackedLinear(cfg.num_experts, hidden, 2 * cfg.intermediate_size, dtype=dtype, rngs=rngs)
        self.output_linear = StackedLinear(cfg.num_experts, cfg.intermediate_size, hidden, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        logits = self.router.layer(x).astype(jnp.float32)
        top, idx = jax.lax.top_k(logits, self.top_k)
        weights = jax.nn.softmax(top, axis=-1).astype(x.dtype)
        order, token_of, sizes = group_by_expert(idx, self.router.layer.weight.shape[0])
        gate, up = jnp.split(self.input_linear(x[token_of], sizes), 2, axis=-1)
        y = self.output_linear(jax.nn.silu(gate) * up, sizes)
        y = y * weights.reshape(-1)[order][:, None]
        return jnp.zeros_like(x).at[token_of].add(y)
