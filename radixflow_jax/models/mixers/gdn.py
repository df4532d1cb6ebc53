"""Gated DeltaNet mixer (Qwen3-Next packed projections, Qwen3.5 split projections).

Per token: project to q|k|v (+ z, b, a); depthwise causal conv (no bias) + SiLU over q|k|v with the
row's carried conv state; L2-normalise q and k per head; ``beta = sigmoid(b)``,
``g = -exp(A_log) * softplus(a + dt_bias)``; gated delta rule with the row's carried recurrent
state; gated RMSNorm with ``z``; ``out_proj``.

Rows ``[:num_decode]`` take the one-step updates; the remaining rows go through the chunked scan
(the split, the slot write-back and checkpoint emission are :func:`recurrent.recurrent_mix`). Each
real row reads its state from ``state_slots[r]`` and writes the state after its span back to the
same slot (copy-on-write of checkpoints happens before the model runs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from radixflow_jax.kernels import ops
from radixflow_jax.models.config import GdnConfig
from radixflow_jax.models.layers import GatedRMSNorm, Linear
from radixflow_jax.models.mixers.lanes import delta_lane_terms
from radixflow_jax.models.mixers.recurrent import DepthwiseConv1d, MixSpec, RecurrentKernels, RecurrentMixer


def l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)



class GatedDeltaNet(RecurrentMixer):
    def __init__(self, cfg: GdnConfig, hidden: int, eps: float, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.cfg = cfg
        hv = cfg.num_v_heads
        if cfg.packed:
            self.in_proj_qkvz = Linear(hidden, 2 * cfg.key_dim + 2 * cfg.value_dim, bias=False, dtype=dtype, rngs=rngs)
            self.in_proj_ba = Linear(hidden, 2 * hv, bias=False, dtype=dtype, rngs=rngs)
        else:
            self.in_proj_qkv = Linear(hidden, cfg.conv_dim, bias=False, dtype=dtype, rngs=rngs)
            self.in_proj_z = Linear(hidden, cfg.value_dim, bias=False, dtype=dtype, rngs=rngs)
            self.in_proj_b = Linear(hidden, hv, bias=False, dtype=dtype, rngs=rngs)
            self.in_proj_a = Linear(hidden, hv, bias=False, dtype=dtype, rngs=rngs)
        self.conv1d = DepthwiseConv1d(cfg.conv_dim, cfg.conv_kernel, bias=False, dtype=dtype, rngs=rngs)
        self.dt_bias = nnx.Param(jnp.ones((hv,), dtype))
        self.A_log = nnx.Param(jnp.log(jnp.linspace(1.0, 16.0, hv)).astype(dtype))
        self.norm = GatedRMSNorm(cfg.head_v_dim, eps, dtype=dtype)
        self.out_proj = Linear(cfg.value_dim, hidden, bias=False, dtype=dtype, rngs=rngs)

    def _project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """Returns ``(qkv [T, conv_dim], z [T, Hv, dv], b [T, Hv], a [T, Hv])`` in HF channel order."""
        cfg = self.cfg
        num_tokens = x.shape[0]
        if not cfg.packed:
            z = self.in_proj_z(x).reshape(num_tokens, cfg.num_v_heads, cfg.head_v_dim)
            return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)
        ratio = cfg.num_v_heads // cfg.num_k_heads
        dk, dv = cfg.head_k_dim, cfg.head_v_dim
        qkvz = self.in_proj_qkvz(x).reshape(num_tokens, cfg.num_k_heads, 2 * dk + 2 * ratio * dv)
        q, k = qkvz[..., :dk], qkvz[..., dk : 2 * dk]
        v = qkvz[..., 2 * dk : 2 * dk + ratio * dv]
        z = qkvz[..., 2 * dk + ratio * dv :].reshape(num_tokens, cfg.num_v_heads, dv)
        ba = self.in_proj_ba(x).reshape(num_tokens, cfg.num_k_heads, 2 * ratio)
        b = ba[..., :ratio].reshape(num_tokens, cfg.num_v_heads)
        a = ba[..., ratio:].reshape(num_tokens, cfg.num_v_heads)
        s = cfg.qkv_stripes  # stripe r: [q_r | k_r | v_r] (s == 1: HF order)
        qkv = jnp.concatenate(
            [q.reshape(num_tokens, s, -1), k.reshape(num_tokens, s, -1), v.reshape(num_tokens, s, -1)], axis=-1
        )
        return qkv.reshape(num_tokens, cfg.conv_dim), z, b, a

    def spec(self, x: jax.Array) -> MixSpec:
        cfg = self.cfg
        num_tokens = x.shape[0]
        qkv_in, z, b, a = self._project(x)
        beta = jax.nn.sigmoid(b.astype(jnp.float32))
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(
            a.astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
        )

        def prepare(qkv: jax.Array) -> tuple[jax.Array, ...]:
            s = cfg.qkv_stripes
            kd = cfg.key_dim // s
            striped = qkv.reshape(num_tokens, s, -1)  # channels of stripe r: [q_r | k_r | v_r]
            q = l2norm(striped[..., :kd].reshape(num_tokens, cfg.num_k_heads, cfg.head_k_dim))
            k = l2norm(striped[..., kd : 2 * kd].reshape(num_tokens, cfg.num_k_heads, cfg.head_k_dim))
            v = striped[..., 2 * kd :].reshape(num_tokens, cfg.num_v_heads, cfg.head_v_dim)
            return q, k, v, g, beta

        def chunked(
            xs: tuple[jax.Array, ...], cu: jax.Array, s: jax.Array, pc: jax.Array | None
        ) -> tuple[jax.Array, jax.Array, jax.Array]:
            return ops.gated_delta_chunked(*xs, cu, s, chunk_size=cfg.chunk_size, pair_chunk=pc)

        kernels = RecurrentKernels(
            decode=lambda xs, s: ops.gated_delta_decode(*xs, s),
            chunked=chunked,
            lane_terms=delta_lane_terms,
            decode_in_place=lambda xs, pool, base, real: ops.gated_delta_decode_window(*xs, pool, base, real),
        )
        finish = lambda core, _: self.norm(core, z).reshape(num_tokens, cfg.value_dim)  # noqa: E731
        return MixSpec(conv_in=qkv_in, prepare=prepare, kernels=kernels, finish=finish)
