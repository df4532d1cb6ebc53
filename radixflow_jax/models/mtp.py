"""Multi-token prediction (MTP) layers: the draft head that Qwen3.5 and Qwen3-Next checkpoints ship.

Such a checkpoint holds, beside the trunk, ``mtp_layers`` more decoder layers (HF ``mtp.*``; GGUF:
blocks ``n .. n + nextn_predict_layers - 1`` after the ``n`` trunk blocks, with ``nextn.*`` tensors).
One MTP step at position ``t`` (HF names; :class:`MtpHead` keeps them as its attribute names):

    e = pre_fc_norm_embedding(embed_tokens(token[t + 1]))   # the trunk's embedding table
    h = pre_fc_norm_hidden(hidden[t])                        # the trunk's hidden after its final norm
    x = fc(concat(e, h))                                     # [2H] -> [H]: the embedding half first
    x = layers[0](x)                                         # a full-attention decoder layer, own KV
    m[t] = norm(x)                                           # GGUF: nextn.shared_head_norm
    logits[t] = lm_head(m[t])                                # the trunk's head: a guess at token[t + 2]

Drafting ``k`` tokens runs the layer ``k`` times, the later steps with ``m`` of the step before in
place of the trunk's hidden (as llama.cpp's ``draft-mtp`` and vLLM do). Every norm here is the
trunk's style (zero-centred for these families). Invariant: the MTP layer's attention reads only
KV that MTP steps wrote, at the positions of the tokens they consumed; its pool is separate from
the trunk's.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

import jax
import jax.numpy as jnp
from flax import nnx

from radixflow_jax.kernels.batch import positions_from_batch
from radixflow_jax.models.batch import Batch
from radixflow_jax.models.config import ConfigError, ModelConfig
from radixflow_jax.models.decoder import DecoderLayer
from radixflow_jax.models.layers import Linear, RMSNorm
from radixflow_jax.models.mixers.attention import KvPages

MTP_FAMILIES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
_LAYER_KEY = re.compile(r"^mtp\.layers\.(\d+)\.")


def mtp_layer_count(keys: Iterable[str]) -> int:
    """How many MTP layers a checkpoint with these tensor keys holds (``mtp.layers.{j}.*``)."""
    return max((int(m[1]) + 1 for k in keys if (m := _LAYER_KEY.match(k))), default=0)


def mtp_layer_config(cfg: ModelConfig) -> ModelConfig:
    """The config of one MTP layer as a one-layer model: full attention with the trunk's attention
    config and the MLP kind of the trunk's attention layers (MoE for Qwen3-Next, dense for
    Qwen3.5). Pools for the MTP layers are built from it (``init_cache``: one KV entry)."""
    if cfg.model_type not in MTP_FAMILIES:
        raise ConfigError(f"model_type={cfg.model_type!r} has no MTP layers; they exist for {', '.join(MTP_FAMILIES)}")
    if not cfg.attention_layers:
        raise ConfigError("MTP layers need the trunk's attention config")
    mlp = cfg.mlps[cfg.attention_layers[0]]
    return dataclasses.replace(
        cfg, num_layers=1, mixers=("attention",), mlps=(mlp,), gdn=None, mamba=None, mtp_layers=0
    )


class MtpHead(nnx.Module):
    """``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``, ``fc``, ``layers`` (``cfg.mtp_layers``
    decoder layers), ``norm``: HF's ``mtp.`` names, so a parameter's path is its checkpoint key."""

    def __init__(self, cfg: ModelConfig, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        layer_cfg = mtp_layer_config(cfg)
        hidden = cfg.hidden_size

        def norm() -> RMSNorm:
            return RMSNorm(hidden, cfg.rms_norm_eps, style=cfg.norm_style, dtype=dtype)

        self.pre_fc_norm_embedding = norm()
        self.pre_fc_norm_hidden = norm()
        self.fc = Linear(2 * hidden, hidden, bias=False, dtype=dtype, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(layer_cfg, 0, dtype=dtype, rngs=rngs) for _ in range(cfg.mtp_layers)])
        self.norm = norm()

    def __call__(
        self,
        embeds: jax.Array,
        hidden: jax.Array,
        batch: Batch,
        kv: KvPages,
        *,
        num_decode: int = 0,
        layer: int = 0,
    ) -> tuple[jax.Array, KvPages]:
        """``embeds [T, H]`` (the trunk's embeddings of each slot's *next* token) and ``hidden [T, H]``
        (the trunk's final-norm hidden state at each slot, or ``m`` of an earlier MTP step) ->
        ``(m [T, H], kv)``: the step's normed output (project it with the trunk's ``logits``) and
        MTP layer ``layer``'s pool with every slot's KV written at the batch's positions."""
        _, positions, _ = positions_from_batch(batch.cu_seqlens, batch.kv_lens, embeds.shape[0])
        e = self.pre_fc_norm_embedding(embeds)
        h = self.pre_fc_norm_hidden(hidden.astype(embeds.dtype))
        x = self.fc(jnp.concatenate([e, h], axis=-1))
        x, kv_out, _, _ = self.layers[layer](x, positions, batch, kv, None, num_decode)
        assert kv_out is not None
        return self.norm(x), kv_out
