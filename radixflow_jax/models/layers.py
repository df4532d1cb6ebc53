"""Building blocks shared by all architectures (Flax NNX).

Weights keep the HF on-disk layout (``Linear.weight`` is ``[out, in]``) and the HF attribute names,
so a parameter's NNX path joined by dots is its checkpoint key (see ``models/weights.py``). Norms
compute in float32 and cast back exactly where the reference implementation does, so float32 runs
match ``transformers`` to rounding.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from radixflow_jax.kernels import ops
from radixflow_jax.models.config import MoeConfig, NormStyle, RopeConfig


def _normal(rngs: nnx.Rngs, shape: tuple[int, ...], dtype: jnp.dtype, std: float = 0.02) -> jax.Array:
    return (jax.random.normal(rngs.params(), shape, jnp.float32) * std).astype(dtype)


class Linear(nnx.Module):
    """``y = x @ weight.T (+ bias)`` with ``weight`` stored ``[out_features, in_features]``."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.weight = nnx.Param(_normal(rngs, (out_features, in_features), dtype))
        self.bias = nnx.Param(jnp.zeros((out_features,), dtype)) if bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = ops.linear(x, self.weight[...])
        return y + self.bias[...] if self.bias is not None else y


class Embedding(nnx.Module):
    def __init__(self, num: int, dim: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.weight = nnx.Param(_normal(rngs, (num, dim), dtype))

    def __call__(self, ids: jax.Array) -> jax.Array:
        return self.weight[...][ids]


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis, in the reference's rounding order per ``style``:
    ``zero_centered``: ``norm(x) * (1 + w)`` in float32 (Qwen3-Next, Qwen3.5; weight starts at 0);
    ``llama``: ``w * norm(x).astype(dtype)`` (Llama, Qwen3, Bamba);
    ``float32_weight``: ``(w * norm(x)).astype(dtype)`` in float32 (Nemotron-H)."""

    def __init__(self, dim: int, eps: float, *, style: NormStyle, dtype: jnp.dtype):
        self.eps = eps
        self.style = style
        self.weight = nnx.Param(jnp.zeros((dim,), dtype) if style == "zero_centered" else jnp.ones((dim,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        w = self.weight[...]
        if self.style == "zero_centered":
            return (normed * (1.0 + w.astype(jnp.float32))).astype(x.dtype)
        if self.style == "float32_weight":
            return (w.astype(jnp.float32) * normed).astype(x.dtype)
        return w * normed.astype(x.dtype)


class GatedRMSNorm(nnx.Module):
    """``w * norm(x) * silu(gate)`` per head (the Gated DeltaNet output norm; weight starts at 1)."""

    def __init__(self, dim: int, eps: float, *, dtype: jnp.dtype):
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((dim,), dtype))

    def __call__(self, x: jax.Array, gate: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        y = self.weight[...] * normed.astype(x.dtype)
        return (y * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype)


def rope_inv_freq(rope: RopeConfig) -> np.ndarray:
    """Inverse frequencies (float32, as the reference computes them) with the configured scaling."""
    dim = rope.rotary_dim
    exponent = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    inv = (np.float32(1.0) / (np.float32(rope.theta) ** exponent)).astype(np.float32)
    if rope.kind == "linear":
        return (inv / np.float32(rope.factor)).astype(np.float32)
    if rope.kind == "llama3":
        low_wl = rope.original_max_position / rope.low_freq_factor
        high_wl = rope.original_max_position / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wl, inv / rope.factor, inv)
        smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    return inv


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate-half RoPE on the first ``2 * len(inv_freq)`` channels of ``x[T, H, D]``."""
    rot = 2 * inv_freq.shape[0]
    freqs = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    cos = jnp.cos(emb).astype(x.dtype)[:, None, :]
    sin = jnp.sin(emb).astype(x.dtype)[:, None, :]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = jnp.concatenate([-x_rot[..., half:], x_rot[..., :half]], axis=-1)
    return jnp.concatenate([x_rot * cos + rotated * sin, x_pass], axis=-1)


class Mlp(nnx.Module):
    """SwiGLU MLP: ``down(silu(gate(x) * gate_multiplier) * up(x)) * down_multiplier`` (the
    multipliers are Falcon-H1's ``mlp_multipliers``; at 1.0 they are skipped)."""

    def __init__(
        self,
        hidden: int,
        inter: int,
        *,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
        gate_multiplier: float = 1.0,
        down_multiplier: float = 1.0,
    ):
        self.gate_proj = Linear(hidden, inter, bias=False, dtype=dtype, rngs=rngs)
        self.up_proj = Linear(hidden, inter, bias=False, dtype=dtype, rngs=rngs)
        self.down_proj = Linear(inter, hidden, bias=False, dtype=dtype, rngs=rngs)
        self.gate_multiplier = gate_multiplier
        self.down_multiplier = down_multiplier

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = self.gate_proj(x)
        if self.gate_multiplier != 1.0:
            gate = gate * self.gate_multiplier
        y = self.down_proj(jax.nn.silu(gate) * self.up_proj(x))
        return y * self.down_multiplier if self.down_multiplier != 1.0 else y


class Relu2Mlp(nnx.Module):
    """Squared-ReLU MLP (Nemotron-H): ``down(relu(up(x)) ** 2)``."""

    def __init__(self, hidden: int, inter: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.up_proj = Linear(hidden, inter, bias=False, dtype=dtype, rngs=rngs)
        self.down_proj = Linear(inter, hidden, bias=False, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jnp.square(jax.nn.relu(self.up_proj(x))))


def group_by_expert(experts: jax.Array, num_experts: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``experts [T, k]`` -> ``(order, token_of, sizes)``: the (token, slot) pairs sorted by expert
    (stable), the token of each sorted pair, and the pair count per expert (for ``ragged_dot``)."""
    top_k = experts.shape[1]
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    return order, order // top_k, sizes


class Experts(nnx.Module):
    """Stacked SwiGLU experts, input-major for ``ragged_dot``: gate/up ``[E, H, I]``, down ``[E, I, H]``.

    The loader assembles these from per-expert checkpoint keys or fused ``gate_up_proj`` tensors."""

    def __init__(self, num: int, hidden: int, inter: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.gate_proj = nnx.Param(_normal(rngs, (num, hidden, inter), dtype))
        self.up_proj = nnx.Param(_normal(rngs, (num, hidden, inter), dtype))
        self.down_proj = nnx.Param(_normal(rngs, (num, inter, hidden), dtype))

    def __call__(self, x: jax.Array, experts: jax.Array, weights: jax.Array) -> jax.Array:
        """``x[T, H]``; ``experts``/``weights`` ``[T, k]``: sum over k of ``w * expert(x)``."""
        order, token_of, sizes = group_by_expert(experts, self.gate_proj.shape[0])
        xs = x[token_of]
        h = jax.nn.silu(jax.lax.ragged_dot(xs, self.gate_proj[...], sizes)) * jax.lax.ragged_dot(
            xs, self.up_proj[...], sizes
        )
        y = jax.lax.ragged_dot(h, self.down_proj[...], sizes)
        y = y * weights.reshape(-1)[order][:, None].astype(y.dtype)
        return jnp.zeros_like(x).at[token_of].add(y)


class TopKRouter(nnx.Module):
    """Softmax (float32) over experts, top-k, optionally renormalised; weight ``[E, H]``."""

    def __init__(self, cfg: MoeConfig, hidden: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.top_k = cfg.top_k
        self.norm_topk = cfg.norm_topk
        self.weight = nnx.Param(_normal(rngs, (cfg.num_experts, hidden), dtype))

    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = x @ self.weight[...].T
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        top, idx = jax.lax.top_k(probs, self.top_k)
        if self.norm_topk:
            top = top / jnp.sum(top, axis=-1, keepdims=True)
        return idx, top.astype(x.dtype)


class SparseMoe(nnx.Module):
    """Routed experts plus an optional shared expert gated by ``sigmoid(shared_expert_gate(x))``."""

    def __init__(self, cfg: MoeConfig, hidden: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.gate = TopKRouter(cfg, hidden, dtype=dtype, rngs=rngs)
        self.experts = Experts(cfg.num_experts, hidden, cfg.intermediate_size, dtype=dtype, rngs=rngs)
        if cfg.shared_intermediate_size:
            self.shared_expert = Mlp(hidden, cfg.shared_intermediate_size, dtype=dtype, rngs=rngs)
            self.shared_expert_gate = Linear(hidden, 1, bias=False, dtype=dtype, rngs=rngs)
        else:
            self.shared_expert = None
            self.shared_expert_gate = None

    def __call__(self, x: jax.Array) -> jax.Array:
        idx, weights = self.gate(x)
        out = self.experts(x, idx, weights)
        if self.shared_expert is not None:
            out = out + jax.nn.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
