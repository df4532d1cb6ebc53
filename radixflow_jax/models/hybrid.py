"""The decoder-only hybrid language model (one class for every supported architecture).

``HybridLM.model`` mirrors the HF ``model.`` prefix (``embed_tokens``, ``layers``, ``norm``) and
``HybridLM.lm_head`` the HF ``lm_head`` (absent when embeddings are tied). A call processes one
packed ragged batch (see ``models/batch.py``) and returns the final hidden states and the updated
pools; :meth:`HybridLM.logits` projects selected hidden states to float32 logits. The model-level
multipliers (embedding, logits) and the layer-level ones (residual, parallel-branch scales) are
applied here; the others inside the modules (see ``config.Multipliers``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from radixflow_jax.kernels import ops
from radixflow_jax.kernels.batch import positions_from_batch
from radixflow_jax.models.batch import Batch, ModelCache
from radixflow_jax.models.config import ModelConfig
from radixflow_jax.models.decoder import DecoderLayer, scaled
from radixflow_jax.models.layers import Embedding, Linear, RMSNorm
from radixflow_jax.models.mixers.attention import KvPages
from radixflow_jax.models.mixers.lanes import VerifyLanes
from radixflow_jax.models.mixers.recurrent import Emits
from radixflow_jax.models.mtp import MtpHead

class Backbone(nnx.Module):
    """``embed_tokens``, ``layers``, ``norm`` (the final norm): HF's ``model.`` (fixed names; a
    family's checkpoint names for them are mapped at load time)."""

    def __init__(self, cfg: ModelConfig, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, i, dtype=dtype, rngs=rngs) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, style=cfg.norm_style, dtype=dtype)


class HybridLM(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, dtype: jnp.dtype = jnp.float32, rngs: nnx.Rngs):
        self.config = cfg
        self.model = Backbone(cfg, dtype=dtype, rngs=rngs)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype, rngs=rngs)
        )
        # HF's ``mtp.``: the draft head (``models/mtp.py``), built after the trunk so that the trunk
        # draws the same random weights with or without it
        self.mtp = MtpHead(cfg, dtype=dtype, rngs=rngs) if cfg.mtp_layers else None

    def __call__(
        self,
        tokens: jax.Array,
        batch: Batch,
        cache: ModelCache,
        *,
        num_decode: int = 0,
        emits: Emits | None = None,
        row_last: jax.Array | None = None,
    ) -> tuple[jax.Array, ModelCache]:
        """``tokens [T]`` -> ``(hidden [T, hidden] after the final norm, updated cache)``; ``emits``
        names the checkpoints to write (every recurrent layer writes its part). ``row_last [R]``
        (each row's last token, as ``runner/inputs`` builds ``logits_index``; rows without tokens:
        any index): the hidden states of those tokens only, ``[R, hidden]``, equal to the full
        result's rows ``row_last`` for rows with tokens. The last layer then runs its attention
        queries, output projections and MLP on ``R`` tokens instead of ``T``: a prefill round
        samples one token per row, and in ``benchmarks/vs_transformers.py``'s model the last
        layer's MLP alone is about 9 % of a token's matmul FLOPs."""
        hidden, cache, _ = self.forward(tokens, batch, cache, num_decode=num_decode, emits=emits, row_last=row_last)
        return hidden, cache

    def forward(
        self,
        tokens: jax.Array,
        batch: Batch,
        cache: ModelCache,
        *,
        num_decode: int = 0,
        emits: Emits | None = None,
        row_last: jax.Array | None = None,
        lane_steps: int = 0,
    ) -> tuple[jax.Array, ModelCache, tuple[VerifyLanes, ...]]:
        """:meth:`__call__`, and with ``lane_steps`` every recurrent layer's verify lanes in layer
        order (``models/mixers/lanes.py``; empty without)."""
        _, positions, _ = positions_from_batch(batch.cu_seqlens, batch.kv_lens, tokens.shape[0])
        x = scaled(self.model.embed_tokens(tokens), self.config.multipliers.embedding)
        kv, conv, ssm = list(cache.kv), list(cache.conv), list(cache.ssm)
        att_i = rec_i = 0
        last = len(self.model.layers) - 1
        lanes: list[VerifyLanes] = []
        for i, layer in enumerate(self.model.layers):
            layer_kv = kv[att_i] if layer.has_kv else None
            layer_rec = (conv[rec_i], ssm[rec_i]) if layer.has_state else None
            narrow = row_last if i == last else None
            x, layer_kv, layer_rec, layer_lanes = layer(
                x, positions, batch, layer_kv, layer_rec, num_decode, emits, narrow, lane_steps
            )
            if layer.has_kv:
                assert layer_kv is not None
                kv[att_i] = layer_kv
                att_i += 1
            if layer.has_state:
                assert layer_rec is not None
                conv[rec_i], ssm[rec_i] = layer_rec
                rec_i += 1
                if layer_lanes is not None:
                    lanes.append(layer_lanes)
        return self.model.norm(x), cache._replace(kv=tuple(kv), conv=tuple(conv), ssm=tuple(ssm)), tuple(lanes)

    def mtp_step(
        self, next_tokens: jax.Array, hidden: jax.Array, batch: Batch, kv: KvPages, **options: int
    ) -> tuple[jax.Array, KvPages]:
        """One MTP step (``models/mtp.py``) over a packed batch: ``next_tokens [T]`` (each slot's
        next token), ``hidden [T, H]`` (the trunk's :meth:`forward` output at each slot, or ``m`` of
        the step before) -> ``(m [T, H], kv)``; :meth:`logits` of ``m`` guess the token after.
        ``options``: :class:`MtpHead`'s ``num_decode`` and ``layer``."""
        if self.mtp is None:
            raise ValueError("this model was loaded without MTP layers (load(..., mtp=True))")
        embeds = scaled(self.model.embed_tokens(next_tokens), self.config.multipliers.embedding)
        return self.mtp(embeds, hidden, batch, kv, **options)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits of ``hidden [..., hidden_size]``, times ``lm_head`` and divided by
        ``logits_scaling`` (in the model dtype, where the references apply them)."""
        if self.lm_head is None:
            logits = ops.linear(hidden, self.model.embed_tokens.weight[...])  # tied: the embedding's [vocab, hidden]
        else:
            logits = self.lm_head(hidden)
        mult = self.config.multipliers
        logits = scaled(logits, mult.lm_head)
        if mult.logits_scaling != 1.0:
            logits = logits / mult.logits_scaling
        return logits.astype(jnp.float32)
