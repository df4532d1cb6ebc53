"""The decoder-only hybrid language model (one class for every supported architecture).

``HybridLM.model`` mirrors the HF ``model.`` prefix (``embed_tokens``, ``layers``, ``norm``) and
``HybridLM.lm_head`` the HF ``lm_head`` (absent when embeddings are tied). A call processes one
packed ragged batch (see ``models/batch.py``) and returns the final hidden states and the updated
pools; :meth:`HybridLM.logits` projects selected hidden states to float32 logits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from radixflow_jax.kernels.batch import positions_from_batch
from radixflow_jax.models.batch import Batch, ModelCache
from radixflow_jax.models.config import ModelConfig
from radixflow_jax.models.layers import Embedding, Linear, Mlp, Relu2Mlp, RMSNorm, SparseMoe
from radixflow_jax.models.mixers.attention import Attention
from radixflow_jax.models.mixers.gdn import GatedDeltaNet
from radixflow_jax.models.mixers.mamba2 import Mamba2


def _mlp(cfg: ModelConfig, kind: str, *, dtype: jnp.dtype, rngs: nnx.Rngs) -> nnx.Module | None:
    if kind == "moe":
        assert cfg.moe is not None
        return SparseMoe(cfg.moe, cfg.hidden_size, dtype=dtype, rngs=rngs)
    if kind == "dense":
        return Mlp(cfg.hidden_size, cfg.intermediate_size, dtype=dtype, rngs=rngs)
    if kind == "relu2":
        return Relu2Mlp(cfg.hidden_size, cfg.intermediate_size, dtype=dtype, rngs=rngs)
    return None


def _mixer(cfg: ModelConfig, kind: str, *, dtype: jnp.dtype, rngs: nnx.Rngs) -> nnx.Module | None:
    if kind == "attention":
        assert cfg.attention is not None
        return Attention(cfg.attention, cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    if kind == "gdn":
        assert cfg.gdn is not None
        return GatedDeltaNet(cfg.gdn, cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    if kind == "mamba":
        assert cfg.mamba is not None
        return Mamba2(cfg.mamba, cfg.hidden_size, dtype=dtype, rngs=rngs)
    return None


class DecoderLayer(nnx.Module):
    """One layer. Two-norm layout: ``x + mixer(norm(x))`` then ``x + mlp(norm(x))``; block layout
    (``naming.block``): ``x + mixer(norm(x))`` where the mixer may also be an MLP. Attribute names
    come from ``cfg.naming`` so parameter paths equal checkpoint keys."""

    def __init__(self, cfg: ModelConfig, index: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        names = cfg.naming
        self.mixer_kind = cfg.mixers[index]
        self.mlp_kind = cfg.mlps[index]
        self.block = names.block

        def norm() -> RMSNorm:
            return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, style=cfg.norm_style, dtype=dtype)

        if self.block:
            self.norm = norm()
            if self.mixer_kind == "none":
                self.mixer = _mlp(cfg, self.mlp_kind, dtype=dtype, rngs=rngs)
            else:
                self.mixer = _mixer(cfg, self.mixer_kind, dtype=dtype, rngs=rngs)
            self.mixer_name, self.mlp_name = "mixer", None
            return
        self.mixer_name = {"attention": names.attention, "gdn": names.gdn, "mamba": names.mamba}[self.mixer_kind]
        setattr(self, names.pre_mixer_norm, norm())
        setattr(self, self.mixer_name, _mixer(cfg, self.mixer_kind, dtype=dtype, rngs=rngs))
        self.mlp_name = names.mlp if self.mlp_kind != "none" else None
        if self.mlp_name is not None:
            setattr(self, names.pre_mlp_norm, norm())
            setattr(self, names.mlp, _mlp(cfg, self.mlp_kind, dtype=dtype, rngs=rngs))
        self.pre_mixer_norm, self.pre_mlp_norm = names.pre_mixer_norm, names.pre_mlp_norm

    def __call__(
        self, x: jax.Array, positions: jax.Array, batch: Batch, state: tuple[jax.Array, ...], num_decode: int
    ) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        """``state``: ``(k_pages, v_pages)`` for attention, ``(conv, ssm)`` for recurrent mixers, ``()``."""
        pre = self.norm if self.block else getattr(self, self.pre_mixer_norm)
        mixer = getattr(self, self.mixer_name)
        h = pre(x)
        if self.mixer_kind == "attention":
            h, state = mixer(h, positions, batch, state)
        elif self.mixer_kind in ("gdn", "mamba"):
            h, conv, ssm = mixer(h, batch, state[0], state[1], num_decode)
            state = (conv, ssm)
        else:
            h = mixer(h)
        x = x + h
        if self.mlp_name is not None and not self.block:
            x = x + getattr(self, self.mlp_name)(getattr(self, self.pre_mlp_norm)(x))
        return x, state


class Backbone(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.embed_name, self.final_norm_name = cfg.naming.embed, cfg.naming.final_norm
        setattr(self, self.embed_name, Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype, rngs=rngs))
        self.layers = nnx.List([DecoderLayer(cfg, i, dtype=dtype, rngs=rngs) for i in range(cfg.num_layers)])
        setattr(self, self.final_norm_name, RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, style=cfg.norm_style, dtype=dtype))

    @property
    def embedding(self) -> Embedding:
        return getattr(self, self.embed_name)

    @property
    def final_norm(self) -> RMSNorm:
        return getattr(self, self.final_norm_name)


class HybridLM(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, dtype: jnp.dtype = jnp.float32, rngs: nnx.Rngs):
        self.config = cfg
        self.model = Backbone(cfg, dtype=dtype, rngs=rngs)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype, rngs=rngs)
        )

    def __call__(
        self, tokens: jax.Array, batch: Batch, cache: ModelCache, *, num_decode: int = 0
    ) -> tuple[jax.Array, ModelCache]:
        """``tokens [T]`` -> ``(hidden [T, hidden] after the final norm, updated cache)``."""
        _, positions, _ = positions_from_batch(batch.cu_seqlens, batch.kv_lens, tokens.shape[0])
        x = self.model.embedding(tokens)
        kv, conv, ssm = list(cache.kv), list(cache.conv), list(cache.ssm)
        att_i = rec_i = 0
        for layer in self.model.layers:
            if layer.mixer_kind == "attention":
                x, kv[att_i] = layer(x, positions, batch, kv[att_i], num_decode)
                att_i += 1
            elif layer.mixer_kind in ("gdn", "mamba"):
                x, (conv[rec_i], ssm[rec_i]) = layer(x, positions, batch, (conv[rec_i], ssm[rec_i]), num_decode)
                rec_i += 1
            else:
                x, _ = layer(x, positions, batch, (), num_decode)
        return self.model.final_norm(x), ModelCache(kv=tuple(kv), conv=tuple(conv), ssm=tuple(ssm))

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits of ``hidden [..., hidden_size]``."""
        if self.lm_head is None:
            w = self.model.embedding.weight[...]
            return (hidden @ w.T).astype(jnp.float32)
        return self.lm_head(hidden).astype(jnp.float32)
