"""``granitehybrid``: Granite-4.0-H (Mamba2 and attention layers, shared GLU + routed experts),
HF ``granitemoehybrid``.

Layout changes llama.cpp's converter (``GraniteHybridModel`` = ``Mamba2Model`` + ``GraniteMoeModel``)
makes, undone on reading:

* Mamba2: ``ssm_a = -exp(A_log)`` and ``ssm_d = D``, both stored ``[heads, 1]``; ``conv1d.weight``
  ``[C, 1, K]`` squeezed to ``[C, K]``; the gated norm weight ``[inner]`` stored ``[groups,
  inner / groups]``; ``dt_bias`` as ``ssm_dt.bias``.
* attention: ``attn_q``/``attn_k`` rows permuted per head as for ``llama`` (``undo_permute``),
  whether or not the model uses RoPE.
* ``block_sparse_moe.input_linear`` ``[E, 2I, H]`` split into ``ffn_gate_exps``/``ffn_up_exps``,
  ``shared_mlp.input_linear`` ``[2S, H]`` into ``ffn_gate_shexp``/``ffn_up_shexp``.
* metadata: ``attention.head_count_kv`` is a per-layer array (0 on Mamba2 layers; the layer
  pattern is read from it), the muP multipliers are ``attention.scale``, ``embedding_scale``,
  ``residual_scale``, ``logit_scale``; RoPE is on iff ``rope.scaling.finetuned``; without RoPE the
  converter writes ``context_length = 2**20``.

Not stored, so not read back: ``mamba_chunk_size`` (a compute choice: our default).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from radixflow_jax.models.config import ConfigError, ModelConfig
from radixflow_jax.models.gguf.dense import permute_qk, unpermute_qk
from radixflow_jax.models.gguf.family import (
    F32,
    MAMBA2,
    PLAIN_ATTENTION,
    U32,
    Meta,
    NameTable,
    Splits,
    common_config,
    common_metadata,
    layer_array,
    mamba_layout,
    raise_config,
    ssm_metadata,
    table_family,
)

ARCH = "granitehybrid"
NO_ROPE_CONTEXT = 2**20
_LAYER = {
    **PLAIN_ATTENTION,
    "post_attention_layernorm.weight": "ffn_norm.weight",
    **MAMBA2,
    "block_sparse_moe.router.layer.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.output_linear.weight": "ffn_down_exps.weight",
    "shared_mlp.output_linear.weight": "ffn_down_shexp.weight",
}
TABLE = NameTable(_LAYER)
# fused HF tensor -> its two GGUF halves, and the axis they split on (by the HF module's name)
_SPLIT = {
    "block_sparse_moe.input_linear.weight": ("ffn_gate_exps.weight", "ffn_up_exps.weight"),
    "shared_mlp.input_linear.weight": ("ffn_gate_shexp.weight", "ffn_up_shexp.weight"),
}
_SPLIT_AXIS = {"block_sparse_moe": 1, "shared_mlp": 0}


def qk_mamba_layout(suffix: str, t: np.ndarray, cfg: dict[str, Any], groups: int, *, to_gguf: bool) -> np.ndarray:
    """The stored form of a Mamba2-hybrid layer tensor (``suffix`` below the layer, HF
    ``self_attn.*`` / ``mamba.*`` names) or its inverse: ``attn_q``/``attn_k`` rows permuted per head
    as for ``llama``, the Mamba2 tensors as :func:`family.mamba_layout`."""
    if suffix in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
        heads = int(cfg["num_attention_heads"])
        if ".k_proj" in suffix:
            heads = int(cfg.get("num_key_value_heads", heads))
        return permute_qk(t, heads) if to_gguf else unpermute_qk(t, heads)
    return mamba_layout(suffix, t, groups, to_gguf=to_gguf)


def layout(key: str, t: np.ndarray, cfg: dict[str, Any], to_gguf: bool) -> np.ndarray:
    """:func:`qk_mamba_layout` of HF tensor ``key`` (``model.layers.*``), groups ``mamba_n_groups``."""
    suffix = key.split(".", 3)[-1] if key.startswith("model.layers.") else key
    return qk_mamba_layout(suffix, t, cfg, int(cfg.get("mamba_n_groups", 1)), to_gguf=to_gguf)


def _split(key: str, t: np.ndarray, cfg: dict[str, Any]) -> list[np.ndarray]:
    return np.split(t, 2, axis=_SPLIT_AXIS[key.split(".")[-3]])


def _join(key: str, parts: list[np.ndarray], cfg: dict[str, Any]) -> np.ndarray:
    return np.concatenate(parts, axis=_SPLIT_AXIS[key.split(".")[-3]])


def _hf_config(f: Any) -> dict[str, Any]:
    kv = f.get(f"{ARCH}.attention.head_count_kv")
    if not isinstance(kv, list) or len(kv) != f.arch_int("block_count"):
        raise_config(f, f"{ARCH}.attention.head_count_kv", "must be a per-layer array (0 on Mamba2 layers)")
    cfg = common_config(f, "granitemoehybrid", ["GraniteMoeHybridForCausalLM"])
    del cfg["head_dim"]
    rope = bool(f.get(f"{ARCH}.rope.scaling.finetuned", False))
    heads, inner = f.arch_int("ssm.time_step_rank"), f.arch_int("ssm.inner_size")
    experts = f.arch_int("expert_count", 0)
    cfg.update(
        num_key_value_heads=max(kv),
        layer_types=["attention" if k else "mamba" for k in kv],
        shared_intermediate_size=f.arch_int("expert_shared_feed_forward_length"),
        num_local_experts=experts,
        position_embedding_type="rope" if rope else "nope",
        mamba_n_heads=heads,
        mamba_d_head=inner // heads,
        mamba_n_groups=f.arch_int("ssm.group_count"),
        mamba_d_state=f.arch_int("ssm.state_size"),
        mamba_d_conv=f.arch_int("ssm.conv_kernel"),
        mamba_expand=inner / cfg["hidden_size"],
        mamba_proj_bias=False,
        mamba_conv_bias=any(name.endswith(".ssm_conv1d.bias") for name in f.tensors),
        attention_multiplier=f.arch_float("attention.scale"),
        embedding_multiplier=f.arch_float("embedding_scale"),
        residual_multiplier=f.arch_float("residual_scale"),
        logits_scaling=f.arch_float("logit_scale"),
    )
    if experts:
        cfg["num_experts_per_tok"] = f.arch_int("expert_used_count")
    if rope:
        cfg["rope_theta"] = f.arch_float("rope.freq_base", 10000.0)
    if not float(cfg["mamba_expand"]).is_integer():
        raise_config(f, f"{ARCH}.ssm.inner_size", "is not a multiple of embedding_length")
    cfg["mamba_expand"] = int(cfg["mamba_expand"])
    return cfg


def _gguf_metadata(model: ModelConfig, cfg: dict[str, Any]) -> Meta:
    if cfg.get("mamba_proj_bias"):
        raise ConfigError("config.json: mamba_proj_bias=true has no granitehybrid GGUF tensor")
    att, mamba = model.attention, model.mamba
    assert att is not None and mamba is not None
    rope = cfg.get("position_embedding_type") == "rope"
    a = ARCH
    meta = common_metadata(
        a,
        model,
        rope_theta=float(cfg.get("rope_theta", 10000.0)) if rope else None,
        key_length=None,
        head_count_kv=layer_array(model, att.num_kv_heads),
        feed_forward_length=int(cfg["intermediate_size"]),  # the HF field, not the shared GLU's width
        context_length=None if rope else NO_ROPE_CONTEXT,
    )
    if model.moe is not None:
        meta += [(f"{a}.expert_count", model.moe.num_experts, U32), (f"{a}.expert_used_count", model.moe.top_k, U32)]
    meta += [
        (f"{a}.vocab_size", model.vocab_size, U32),
        (f"{a}.rope.dimension_count", model.hidden_size // att.num_heads, U32),
    ]
    for key, field in (
        ("attention.scale", "attention_multiplier"),
        ("embedding_scale", "embedding_multiplier"),
        ("residual_scale", "residual_multiplier"),
        ("logit_scale", "logits_scaling"),
    ):
        if cfg.get(field):
            meta.append((f"{a}.{key}", float(cfg[field]), F32))
    meta.append((f"{a}.expert_shared_feed_forward_length", model.intermediate_size, U32))
    return meta + ssm_metadata(a, mamba) + [(f"{a}.rope.scaling.finetuned", rope, "bool")]


SPLITS = Splits(_SPLIT, _split, _join)
GRANITE_HYBRID = table_family(
    ARCH, ("GraniteMoeHybridForCausalLM",), _hf_config, _gguf_metadata, table=TABLE, layout=layout, splits=SPLITS
)
