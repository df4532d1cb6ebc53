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

from typing import Any, Mapping

import numpy as np

from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.gguf.family import ARR, F32, U32, Family, Meta, NameTable, common_config, only, raise_config
from radixflow_jax.models.gguf.family import rope_theta
from radixflow_jax.models.gguf.granite import _LAYER as GRANITE_LAYER
from radixflow_jax.models.gguf.granite import ARCH, _layout

_LAYER = {
    **{k: v for k, v in GRANITE_LAYER.items() if k.startswith(("mamba.", "self_attn.", "input_"))},
    "pre_ff_layernorm.weight": "ffn_norm.weight",
    "feed_forward.gate_proj.weight": "ffn_gate.weight",
    "feed_forward.up_proj.weight": "ffn_up.weight",
    "feed_forward.down_proj.weight": "ffn_down.weight",
}
TABLE = NameTable(
    _LAYER,
    top={
        "model.embed_tokens.weight": "token_embd.weight",
        "lm_head.weight": "output.weight",
        "model.final_layernorm.weight": "output_norm.weight",
    },
)


def is_bamba(f: Any) -> bool:
    """A ``granitehybrid`` file is Bamba when it has none of Granite's muP keys."""
    return f"{ARCH}.embedding_scale" not in f.metadata and f"{ARCH}.residual_scale" not in f.metadata


def _head_dim(cfg: dict[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def _config(f: Any) -> dict[str, Any]:
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


def _metadata(cfg: dict[str, Any]) -> Meta:
    if cfg.get("mamba_proj_bias") or (cfg.get("num_experts") or 1) != 1:
        raise ConfigError("config.json: mamba_proj_bias or num_experts != 1 has no bamba GGUF layout")
    n, heads = int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    attn = set(cfg.get("attn_layer_indices") or [])
    kv = int(cfg.get("num_key_value_heads", heads))
    rope = cfg.get("rope_parameters") or {}
    rotary = int(cfg.get("attn_rotary_emb") or _head_dim(cfg) * rope.get("partial_rotary_factor", 1.0))
    a = ARCH
    return [
        (f"{a}.block_count", n, U32),
        (f"{a}.context_length", int(cfg["max_position_embeddings"]), U32),
        (f"{a}.embedding_length", int(cfg["hidden_size"]), U32),
        (f"{a}.feed_forward_length", int(cfg["intermediate_size"]), U32),
        (f"{a}.attention.head_count", heads, U32),
        (f"{a}.attention.head_count_kv", [kv if i in attn else 0 for i in range(n)], ARR),
        (f"{a}.rope.freq_base", float(rope_theta(cfg)), F32),
        (f"{a}.attention.layer_norm_rms_epsilon", float(cfg.get("rms_norm_eps", 1e-5)), F32),
        (f"{a}.vocab_size", int(cfg["vocab_size"]), U32),
        (f"{a}.rope.dimension_count", rotary, U32),
        (f"{a}.ssm.conv_kernel", int(cfg["mamba_d_conv"]), U32),
        (f"{a}.ssm.state_size", int(cfg["mamba_d_state"]), U32),
        (f"{a}.ssm.group_count", int(cfg.get("mamba_n_groups", 1)), U32),
        (f"{a}.ssm.inner_size", int(cfg.get("mamba_expand", 2) * cfg["hidden_size"]), U32),
        (f"{a}.ssm.time_step_rank", int(cfg["mamba_n_heads"]), U32),
        (f"{a}.rope.scaling.finetuned", True, "bool"),
    ]


def to_gguf(key: str, array: np.ndarray, cfg: dict[str, Any]) -> list[tuple[str, np.ndarray]]:
    return [(TABLE.gguf(key), _layout(key, array, cfg, to_gguf=True).astype(np.float32, copy=False))]


def from_gguf(key: str, parts: Mapping[str, np.ndarray], cfg: dict[str, Any]) -> np.ndarray:
    return _layout(key, only(parts), cfg, to_gguf=False).astype(np.float32, copy=False)


BAMBA = Family(
    ARCH,
    ("BambaForCausalLM",),
    _config,
    _metadata,
    to_gguf,
    TABLE.hf,
    from_gguf,
    lambda key, cfg: (TABLE.gguf(key),),
    accepts=is_bamba,
)
