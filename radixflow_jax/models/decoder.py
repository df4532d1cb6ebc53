"""One decoder layer of any supported family (:class:`DecoderLayer`), shared by the trunk
(``models/hybrid.py``) and the MTP head (``models/mtp.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from radixflow_jax.models.batch import Batch
from radixflow_jax.models.config import ModelConfig
from radixflow_jax.models.fused_mlp import FusedMoe, GluMlp
from radixflow_jax.models.layers import Mlp, Relu2Mlp, RMSNorm, SparseMoe
from radixflow_jax.models.mixers.attention import Attention, KvPages
from radixflow_jax.models.mixers.gdn import GatedDeltaNet
from radixflow_jax.models.mixers.lanes import VerifyLanes
from radixflow_jax.models.mixers.mamba2 import Mamba2
from radixflow_jax.models.mixers.recurrent import Emits

RecState = tuple[jax.Array, jax.Array]


def _mlp(cfg: ModelConfig, kind: str, *, dtype: jnp.dtype, rngs: nnx.Rngs) -> nnx.Module | None:
    """The MLP at ``mlp`` (for ``glu_moe`` the shared GLU; the routed part is built apart)."""
    if kind == "moe":
        assert cfg.moe is not None
        return SparseMoe(cfg.moe, cfg.hidden_size, dtype=dtype, rngs=rngs)
    if kind == "dense":
        mult = cfg.multipliers
        return Mlp(
            cfg.hidden_size,
            cfg.intermediate_size,
            dtype=dtype,
            rngs=rngs,
            gate_multiplier=mult.mlp_gate,
            down_multiplier=mult.mlp_down,
        )
    if kind == "relu2":
        return Relu2Mlp(cfg.hidden_size, cfg.intermediate_size, dtype=dtype, rngs=rngs)
    if kind in ("glu", "glu_moe"):
        return GluMlp(cfg.hidden_size, cfg.intermediate_size, dtype=dtype, rngs=rngs)
    return None


def _mixer(cfg: ModelConfig, kind: str, *, dtype: jnp.dtype, rngs: nnx.Rngs) -> nnx.Module | None:
    mult = cfg.multipliers
    if kind == "attention":
        assert cfg.attention is not None
        return Attention(
            cfg.attention, cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs, key_multiplier=mult.key
        )
    if kind == "gdn":
        assert cfg.gdn is not None
        return GatedDeltaNet(cfg.gdn, cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    if kind == "mamba":
        assert cfg.mamba is not None
        return Mamba2(
            cfg.mamba, cfg.hidden_size, dtype=dtype, rngs=rngs, in_multiplier=mult.ssm_in, segment_multipliers=mult.ssm
        )
    return None


def scaled(x: jax.Array, factor: float) -> jax.Array:
    return x * factor if factor != 1.0 else x


def _rows(x: jax.Array, row_last: jax.Array | None) -> jax.Array:
    """``x`` at each row's last token (``row_last``), or all of ``x`` when it is None."""
    return x if row_last is None else x[row_last]


class DecoderLayer(nnx.Module):
    """One layer. Two-norm layout: ``x + r * mixer(norm(x))`` then ``x + r * mlp(norm(x))`` with
    ``r`` the residual multiplier; a ``parallel`` layer's mixer output is
    ``ssm_out * mamba(h) + attention_out * attention(attention_in * h)``. Block layout
    (``cfg.block_layout``): ``x + mixer(norm(x))`` where the mixer may also be an MLP.

    Attribute names are fixed (absent parts are None); a family's checkpoint names for them are
    mapped at load time (``config.CheckpointNames``). Two-norm layout: ``input_layernorm``, then
    ``self_attn`` (attention, ``parallel``) and/or ``linear_attn`` (GDN) or ``mamba`` (Mamba2,
    ``parallel``), then ``post_attention_layernorm`` and ``mlp`` (for ``glu_moe`` the shared GLU, with
    the routed experts at ``block_sparse_moe``). Block layout: ``norm`` and ``mixer``.

    ``has_kv`` / ``has_state``: whether the layer consumes one KV entry / one conv+SSM state entry
    of the model cache (both for ``parallel``)."""

    def __init__(self, cfg: ModelConfig, index: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.mixer_kind = cfg.mixers[index]
        self.mlp_kind = cfg.mlps[index]
        self.block = cfg.block_layout
        self.mult = cfg.multipliers
        self.has_kv = self.mixer_kind in ("attention", "parallel")
        self.has_state = self.mixer_kind in ("gdn", "mamba", "parallel")

        def norm() -> RMSNorm:
            return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, style=cfg.norm_style, dtype=dtype)

        # each attribute is assigned once: a Module is NNX data, None a static absent part
        kind, mlp_kind, two_norm = self.mixer_kind, self.mlp_kind, not self.block
        self.norm = norm() if self.block else None
        block_mixer = _mixer(cfg, kind, dtype=dtype, rngs=rngs) if kind != "none" else None
        self.mixer = (block_mixer or _mlp(cfg, mlp_kind, dtype=dtype, rngs=rngs)) if self.block else None
        self.input_layernorm = norm() if two_norm else None
        self.self_attn = _mixer(cfg, "attention", dtype=dtype, rngs=rngs) if two_norm and self.has_kv else None
        self.linear_attn = _mixer(cfg, "gdn", dtype=dtype, rngs=rngs) if two_norm and kind == "gdn" else None
        mamba = two_norm and kind in ("mamba", "parallel")
        self.mamba = _mixer(cfg, "mamba", dtype=dtype, rngs=rngs) if mamba else None
        self.post_attention_layernorm = norm() if two_norm and mlp_kind != "none" else None
        self.mlp = _mlp(cfg, mlp_kind, dtype=dtype, rngs=rngs) if two_norm else None
        routed = cfg.moe if two_norm and mlp_kind == "glu_moe" else None
        self.block_sparse_moe = FusedMoe(routed, cfg.hidden_size, dtype=dtype, rngs=rngs) if routed else None

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        batch: Batch,
        kv: KvPages | None,
        rec: RecState | None,
        num_decode: int,
        emits: Emits | None = None,
        row_last: jax.Array | None = None,
        lane_steps: int = 0,
    ) -> tuple[jax.Array, KvPages | None, RecState | None, VerifyLanes | None]:
        """``kv``: this layer's ``(k_pages, v_pages)`` iff ``has_kv``; ``rec``: its ``(conv, ssm)``
        pools iff ``has_state``. Returns the new hidden states and the updated entries. With
        ``row_last [R]`` (each row's last token; rows without tokens: any index) only those tokens'
        hidden states come back, ``[R, hidden]``, equal to the full result's rows ``row_last`` for
        rows with tokens: the pools still get every token's KV and state, attention queries and
        everything after the mixers (projections out, the MLP) run on the ``R`` tokens only. The
        last entry: a recurrent layer's verify lanes with ``lane_steps`` (``models/mixers/lanes.py``)."""
        if self.block:
            assert self.norm is not None and self.mixer is not None
            if row_last is not None and not (self.has_kv or self.has_state):  # an MLP block: token by token
                x, row_last = _rows(x, row_last), None
            h = self.norm(x)
            lanes = None
            if self.has_kv:
                h, kv = self.mixer(h, positions, batch, kv, num_decode, row_last)
                return _rows(x, row_last) + h, kv, rec, None
            if self.has_state:
                assert rec is not None
                h, conv, ssm, lanes = self.mixer(h, batch, rec[0], rec[1], num_decode, emits, lane_steps)
                rec = (conv, ssm)
            else:
                h = self.mixer(h)
            return _rows(x + h, row_last), kv, rec, lanes
        mult = self.mult
        assert self.input_layernorm is not None
        h = self.input_layernorm(x)
        mixed = lanes = None
        recurrent = self.linear_attn if self.linear_attn is not None else self.mamba
        if recurrent is not None:
            assert rec is not None
            out, conv, ssm, lanes = recurrent(h, batch, rec[0], rec[1], num_decode, emits, lane_steps)
            rec = (conv, ssm)
            mixed = scaled(_rows(out, row_last), mult.ssm_out)
        if self.self_attn is not None:
            out, kv = self.self_attn(scaled(h, mult.attention_in), positions, batch, kv, num_decode, row_last)
            out = scaled(out, mult.attention_out)
            mixed = out if mixed is None else mixed + out
        assert mixed is not None
        x = _rows(x, row_last) + scaled(mixed, mult.residual)
        if self.mlp is not None:
            assert self.post_attention_layernorm is not None
            h = self.post_attention_layernorm(x)
            out = self.mlp(h)
            if self.block_sparse_moe is not None:
                out = self.block_sparse_moe(h) + out
            x = x + scaled(out, mult.residual)
        return x, kv, rec, lanes
