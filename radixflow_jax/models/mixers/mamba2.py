"""Mamba2 (SSD) mixer (Bamba, Nemotron-H, Granite-4.0-H, Falcon-H1).

Per token: ``in_proj(x * in_multiplier) * segment multipliers -> [z | xBC | dt]``; depthwise causal
conv (+bias) + SiLU over xBC with the row's carried conv state; ``x | B | C`` with B, C per group
(head h uses group h // (H/G)); ``dt = clamp(softplus(dt + dt_bias), *dt_limit)``,
``A = -exp(A_log)``; SSD scan with the row's carried state; ``y + D x``; the output gate per
``MambaConfig.gated_norm`` (group RMSNorm of ``y * silu(z)``, ``silu(z) *`` group RMSNorm of ``y``, or
plain ``y * silu(z)``); ``out_proj``. The multipliers are Falcon-H1's ``ssm_in_multiplier`` and
``ssm_multipliers`` (its ``mup_vector``); at 1.0 they are skipped.

The clamp applies on both the chunked and the decode path (the reference clamps only the chunked
path; with the default limits the two agree because softplus is positive).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from radixflow_jax.kernels import ops
from radixflow_jax.models.config import MambaConfig
from radixflow_jax.models.layers import Linear
from radixflow_jax.models.mixers.lanes import ssd_lane_terms
from radixflow_jax.models.mixers.recurrent import DepthwiseConv1d, MixSpec, RecurrentKernels, RecurrentMixer


class GroupGatedRMSNorm(nnx.Module):
    """Gate first: ``w * rmsnorm_per_group(y * silu(gate))``; otherwise
    ``w * rmsnorm_per_group(y) * silu(gate)``. Computed in float32."""

    def __init__(self, dim: int, groups: int, eps: float, *, gate_first: bool = True, dtype: jnp.dtype):
        self.groups = groups
        self.eps = eps
        self.gate_first = gate_first
        self.weight = nnx.Param(jnp.ones((dim,), dtype))

    def __call__(self, y: jax.Array, gate: jax.Array) -> jax.Array:
        g = jax.nn.silu(gate.astype(jnp.float32))
        h = y.astype(jnp.float32) * g if self.gate_first else y.astype(jnp.float32)
        grouped = h.reshape(h.shape[:-1] + (self.groups, -1))
        grouped = grouped * jax.lax.rsqrt(jnp.mean(grouped * grouped, axis=-1, keepdims=True) + self.eps)
        out = self.weight[...].astype(jnp.float32) * grouped.reshape(h.shape)
        return out if self.gate_first else out * g


class Mamba2(RecurrentMixer):
    def __init__(
        self,
        cfg: MambaConfig,
        hidden: int,
        *,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
        in_multiplier: float = 1.0,
        segment_multipliers: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0),
    ):
        self.cfg = cfg
        self.in_multiplier = in_multiplier
        self.segment_multipliers = tuple(segment_multipliers)
        h = cfg.num_heads
        self.in_proj = Linear(hidden, cfg.inner_dim + cfg.conv_dim + h, bias=cfg.proj_bias, dtype=dtype, rngs=rngs)
        self.conv1d = DepthwiseConv1d(cfg.conv_dim, cfg.conv_kernel, bias=cfg.conv_bias, dtype=dtype, rngs=rngs)
        self.dt_bias = nnx.Param(jnp.ones((h,), dtype))
        self.A_log = nnx.Param(jnp.log(jnp.arange(1, h + 1, dtype=jnp.float32)).astype(dtype))
        self.D = nnx.Param(jnp.ones((h,), dtype))
        self.norm = (
            None
            if cfg.gated_norm == "none"
            else GroupGatedRMSNorm(
                cfg.inner_dim, cfg.n_groups, cfg.norm_eps, gate_first=cfg.gated_norm == "gate_first", dtype=dtype
            )
        )
        self.out_proj = Linear(cfg.inner_dim, hidden, bias=cfg.out_proj_bias, dtype=dtype, rngs=rngs)

    def _segment_vector(self) -> np.ndarray:
        """Falcon-H1's ``mup_vector``: one multiplier per ``in_proj`` segment ``z | x | B | C | dt``
        (in the rows' stripe order)."""
        cfg = self.cfg
        gs = cfg.n_groups * cfg.state_size
        sizes = (cfg.inner_dim, cfg.inner_dim, gs, gs, cfg.num_heads)
        vec = np.concatenate([np.full(n, m, np.float32) for n, m in zip(sizes, self.segment_multipliers)])
        return vec[proj_permutation(cfg, cfg.proj_stripes)]

    def _split(self, proj: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``z`` and ``dt`` in HF (head) order, xBC in the conv channels' stripe order."""
        cfg = self.cfg
        s, t = cfg.proj_stripes, proj.shape[0]
        zi, gi = cfg.inner_dim // s, cfg.n_groups * cfg.state_size // s
        striped = proj.reshape(t, s, -1)  # stripe r: [z_r | x_r | B_r | C_r | dt_r]
        z = striped[..., :zi].reshape(t, cfg.inner_dim)
        xbc = striped[..., zi : 2 * zi + 2 * gi].reshape(t, cfg.conv_dim)
        return z, xbc, striped[..., 2 * zi + 2 * gi :].reshape(t, cfg.num_heads)

    def _xbc(self, xbc: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``x [T, H, P]``, ``B``, ``C [T, G, N]`` from the conv output (stripe r: ``[x_r | B_r | C_r]``)."""
        cfg = self.cfg
        s, t = cfg.proj_stripes, xbc.shape[0]
        xi, gi = cfg.inner_dim // s, cfg.n_groups * cfg.state_size // s
        striped = xbc.reshape(t, s, -1)
        xs = striped[..., :xi].reshape(t, cfg.num_heads, cfg.head_dim)
        b = striped[..., xi : xi + gi].reshape(t, cfg.n_groups, cfg.state_size)
        return xs, b, striped[..., xi + gi :].reshape(t, cfg.n_groups, cfg.state_size)

    def _project(self, x: jax.Array) -> jax.Array:
        if self.in_multiplier != 1.0:
            x = x * self.in_multiplier
        proj = self.in_proj(x)
        if any(m != 1.0 for m in self.segment_multipliers):
            proj = proj * jnp.asarray(self._segment_vector(), proj.dtype)
        return proj

    def _gate(self, y: jax.Array, z: jax.Array) -> jax.Array:
        if self.norm is None:
            return y * jax.nn.silu(z.astype(jnp.float32))
        return self.norm(y, z)

    def spec(self, x: jax.Array) -> MixSpec:
        cfg = self.cfg
        num_tokens = x.shape[0]
        z, xbc_in, dt_raw = self._split(self._project(x))
        dt_raw = dt_raw.astype(jnp.float32)
        dt = jax.nn.softplus(dt_raw + self.dt_bias[...].astype(jnp.float32))
        dt = jnp.clip(dt, cfg.dt_limit[0], cfg.dt_limit[1])
        a = -jnp.exp(self.A_log[...].astype(jnp.float32))

        def prepare(xbc: jax.Array) -> tuple[jax.Array, ...]:
            xs, b, c = self._xbc(xbc)
            return xs, dt, b, c

        def chunked(
            xs: tuple[jax.Array, ...], cu: jax.Array, s: jax.Array, pc: jax.Array | None
        ) -> tuple[jax.Array, jax.Array, jax.Array]:
            return ops.ssd_chunked(xs[0], xs[1], a, xs[2], xs[3], cu, s, chunk_size=cfg.chunk_size, pair_chunk=pc)

        def finish(core: jax.Array, xbc: jax.Array) -> jax.Array:
            xs = self._xbc(xbc)[0]
            y = core.astype(jnp.float32) + self.D[...].astype(jnp.float32)[:, None] * xs.astype(jnp.float32)
            return self._gate(y.reshape(num_tokens, cfg.inner_dim), z).astype(x.dtype)

        decode = lambda xs, s: ops.ssd_decode(xs[0], xs[1], a, xs[2], xs[3], s)  # noqa: E731
        kernels = RecurrentKernels(decode=decode, chunked=chunked, lane_terms=ssd_lane_terms(a))
        return MixSpec(conv_in=xbc_in, prepare=prepare, kernels=kernels, finish=finish)


def proj_permutation(cfg: MambaConfig, stripes: int) -> np.ndarray:
    """``perm`` with ``striped = hf[perm]`` over the ``in_proj`` rows: stripe r is
    ``[z_r | x_r | B_r | C_r | dt_r]`` for heads ``r*H/s ..`` and groups ``r*G/s ..``."""
    inner, gs, h = cfg.inner_dim, cfg.n_groups * cfg.state_size, cfg.num_heads
    zi, gi, hi = inner // stripes, gs // stripes, h // stripes
    starts_sizes = ((0, zi), (inner, zi), (2 * inner, gi), (2 * inner + gs, gi), (2 * inner + 2 * gs, hi))
    return np.concatenate([np.arange(a + r * n, a + (r + 1) * n) for r in range(stripes) for a, n in starts_sizes])


def conv_permutation(cfg: MambaConfig, stripes: int) -> np.ndarray:
    """``perm`` over the xBC conv channels: stripe r is ``[x_r | B_r | C_r]``."""
    inner, gs = cfg.inner_dim, cfg.n_groups * cfg.state_size
    xi, gi = inner // stripes, gs // stripes
    starts_sizes = ((0, xi), (inner, gi), (inner + gs, gi))
    return np.concatenate([np.arange(a + r * n, a + (r + 1) * n) for r in range(stripes) for a, n in starts_sizes])
