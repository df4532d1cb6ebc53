"""Bamba: a ``granitehybrid`` GGUF file without the Granite muP keys, HF ``bamba``.

llama.cpp's converter handles ``BambaForCausalLM`` with its Granite-4.0-H class, so the stored forms
are ``granite``'s: the Mamba2 tensors (``granite.mamba_layout``), ``attn_q``/``attn_k`` rows permuted
over the whole head, a per-layer ``attention.head_count_kv`` array (0 on Mamba2 layers; the
attention layers are read from it), ``rope.scaling.finetuned = true`` (RoPE on). Dense MLPs are
``ffn_gate``/``ffn_up``/``ffn_down``, ``pre_ff_layernorm`` is ``ffn_norm``.

One difference from the converter, on purpose: ``rope.dimension_count`` is the rotary width,
``head_dim * partial_rotary_factor``. The converter reads that width only from ``attn_rotary_emb``
(older Bamba configs) and otherwise writes the whole head, which for a config with
``partial_rotary_factor < 1`` (transformers' field) is another model. Reading takes
``partial_rotary_factor = rope.dimension_count / head_dim``.
"""

from __future__ import annotations

from typing import Any

from radixflow_jax.models.config import ConfigError, ModelConfig
from radixflow_jax.models.gguf.family import U32, Meta, common_config, common_metadata, feed_forward_table, layer_array
from radixflow_jax.models.gguf.family import raise_config, rope_theta, ssm_metadata, table_family
from radixflow_jax.models.gguf.granite import ARCH, layout

TABLE = feed_forward_table("ffn_norm.weight")


def is_bamba(f: Any) -> bool:
    """A ``granitehybrid`` file is Bamba when it has none of Granite's muP keys."""
    return f"{ARCH}.embedding_scale" not in f.metadata and f"{ARCH}.residual_scale" not in f.metadata


def _hf_config(f: Any) -> dict[str, Any]:
    kv = f.get(f"{ARCH}.attention.head_count_kv")
    if not isinstance(kv, list) or len(kv) != f.arch_int("block_count"):
        raise_config(f, f"{ARCH}.attention.head_count_kv", "must be a per-layer array (0 on Mamba2 layers)")
    cfg = common_config(f, "bamba", ["BambaForCausalLM"])
    heads, inner = f.arch_int("ssm.time_step_rank"), f.arch_int("ssm.inner_size")
    if inner % heads or inner % cfg["hidden_size"]:
        raise_config(f, f"{ARCH}.ssm.inner_size", "must be a multiple of ssm.time_step_rank and embedding_length")
    rotary = f.arch_int("rope.dimension_count", cfg["head_dim"])
    cfg.update(
        attn_layer_indices=[i for i, k in enumerate(kv) if k],
        mamba_n_heads=heads,
        mamba_d_head=inner // heads,
        mamba_n_groups=f.arch_int("ssm.group_count"),
        mamba_d_state=f.arch_int("ssm.state_size"),
        mamba_d_conv=f.arch_int("ssm.conv_kernel"),
        mamba_expand=inner // cfg["hidden_size"],
        mamba_conv_bias=any(name.endswith(".ssm_conv1d.bias") for name in f.tensors),
        mamba_proj_bias=False,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": f.arch_float("rope.freq_base", 10000.0),
            "partial_rotary_factor": rotary / cfg["head_dim"],
        },
    )
    return cfg


def _gguf_metadata(model: ModelConfig, cfg: dict[str, Any]) -> Meta:
    if cfg.get("mamba_proj_bias") or (cfg.get("num_experts") or 1) != 1:
        raise ConfigError("config.json: mamba_proj_bias or num_experts != 1 has no bamba GGUF layout")
    att, mamba = model.attention, model.mamba
    assert att is not None and mamba is not None
    rotary = int(cfg.get("attn_rotary_emb") or (att.rope.rotary_dim if att.rope is not None else att.head_dim))
    kv = layer_array(model, att.num_kv_heads)
    meta = common_metadata(ARCH, model, rope_theta=rope_theta(cfg), key_length=None, head_count_kv=kv)
    meta += [(f"{ARCH}.vocab_size", model.vocab_size, U32), (f"{ARCH}.rope.dimension_count", rotary, U32)]
    return meta + ssm_metadata(ARCH, mamba) + [(f"{ARCH}.rope.scaling.finetuned", True, "bool")]


BAMBA = table_family(
    ARCH, ("BambaForCausalLM",), _hf_config, _gguf_metadata, table=TABLE, layout=layout, accepts=is_bamba
)
