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
from radixflow_jax.models.layers import Embedding, Linear, Mlp, RMSNorm, SparseMoe
from radixflow_jax.models.mixers.attention import Attention
from radixflow_jax.models.mixers.gdn import GatedDeltaNet


class DecoderLayer(nnx.Module):
    """Pre-norm block: ``x + mixer(norm(x))`` then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: ModelConfig, index: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.mixer_kind = cfg.mixers[index]
        zc = cfg.zero_centered_norm
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=zc, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=zc, dtype=dtype)
        if self.mixer_kind == "attention":
            assert cfg.attention is not None
            self.self_attn = Attention(cfg.attention, cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
        else:
            assert cfg.gdn is not None
            self.linear_attn = GatedDeltaNet(cfg.gdn, cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
        mlp_kind = cfg.mlps[index]
        if mlp_kind == "moe":
            assert cfg.moe is not None
            self.mlp = SparseMoe(cfg.moe, cfg.hidden_size, dtype=dtype, rngs=rngs)
        elif mlp_kind == "dense":
            self.mlp = Mlp(cfg.hidden_size, cfg.intermediate_size, dtype=dtype, rngs=rngs)
        else:
            self.mlp = None

    def mlp_block(self, x: jax.Array) -> jax.Array:
        if self.mlp is None:
            return x
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, i, dtype=dtype, rngs=rngs) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=cfg.zero_centered_norm, dtype=dtype)


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
        x = self.model.embed_tokens(tokens)
        kv, conv, ssm = list(cache.kv), list(cache.conv), list(cache.ssm)
        att_i = rec_i = 0
        for layer in self.model.layers:
            h = layer.input_layernorm(x)
            if layer.mixer_kind == "attention":
                h, kv[att_i] = layer.self_attn(h, positions, batch, kv[att_i])
                att_i += 1
            else:
                h, conv[rec_i], ssm[rec_i] = layer.linear_attn(h, batch, conv[rec_i], ssm[rec_i], num_decode)
                rec_i += 1
            x = layer.mlp_block(x + h)
        return self.model.norm(x), ModelCache(kv=tuple(kv), conv=tuple(conv), ssm=tuple(ssm))

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits of ``hidden [..., hidden_size]``."""
        if self.lm_head is None:
            w = self.model.embed_tokens.weight[...]
            return (hidden @ w.T).astype(jnp.float32)
        return self.lm_head(hidden).astype(jnp.float32)
