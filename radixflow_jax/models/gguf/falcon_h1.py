"""``falcon-h1``: Falcon-H1 (attention and Mamba2 in parallel in every layer), HF ``falcon_h1``.

llama.cpp's converter (``FalconH1Model``) stores the Mamba2 tensors as for ``granitehybrid``
(``granite.mamba_layout``), no q/k permutation, and folds every muP multiplier into the weights:
``token_embd`` x ``embedding_multiplier``, ``output`` x ``lm_head_multiplier``, ``attn_q``/``attn_v`` x
``attention_in_multiplier``, ``attn_k`` x that x ``key_multiplier``, ``attn_output`` x
``attention_out_multiplier``, ``ssm_in`` x ``ssm_in_multiplier`` with its z/x/B/C/dt row blocks x
``ssm_multipliers``, ``ssm_out`` x ``ssm_out_multiplier``, ``ffn_gate``/``ffn_down`` x
``mlp_multipliers``. Each multiplier scales a linear map, so reading back the stored weights with
every multiplier 1 is the same model (to float32 rounding); the split between weight and multiplier
is not stored and is not recovered. ``pre_ff_layernorm`` is stored as ``ffn_norm`` (no ``.weight``).

Not read: a Mamba2 gated norm (``ssm_norm``; the converter does not store ``mamba_norm_before_gate``)
raises ``ConfigError``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.gguf.family import ATTENTION, F32, U32, Family, Meta, NameTable, common_config, only
from radixflow_jax.models.gguf.family import raise_config, rope_theta
from radixflow_jax.models.gguf.granite import _LAYER as GRANITE_LAYER
from radixflow_jax.models.gguf.granite import mamba_layout

ARCH = "falcon-h1"
_LAYER = {
    **{k: v for k, v in GRANITE_LAYER.items() if k.startswith("mamba.")},
    **{k: v for k, v in ATTENTION.items() if "_norm." not in k or k.startswith("input_")},
    "pre_ff_layernorm.weight": "ffn_norm",
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
_ONES = {
    "embedding_multiplier": 1.0,
    "lm_head_multiplier": 1.0,
    "attention_in_multiplier": 1.0,
    "attention_out_multiplier": 1.0,
    "key_multiplier": 1.0,
    "ssm_in_multiplier": 1.0,
    "ssm_out_multiplier": 1.0,
    "ssm_multipliers": [1.0] * 5,
    "mlp_multipliers": [1.0, 1.0],
}


def _multiplier(key: str, cfg: dict[str, Any]) -> float | None:
    """The scalar the converter multiplies HF tensor ``key`` by (``None``: none, or per row)."""
    c = {**_ONES, **{k: cfg[k] for k in _ONES if cfg.get(k) is not None}}
    table = (
        ("feed_forward.down_proj", c["mlp_multipliers"][1]),
        ("feed_forward.gate_proj", c["mlp_multipliers"][0]),
        ("k_proj", c["key_multiplier"] * c["attention_in_multiplier"]),
        ("q_proj", c["attention_in_multiplier"]),
        ("v_proj", c["attention_in_multiplier"]),
        ("o_proj", c["attention_out_multiplier"]),
        ("mamba.out_proj", c["ssm_out_multiplier"]),
        ("lm_head", c["lm_head_multiplier"]),
        ("embed_tokens", c["embedding_multiplier"]),
    )
    return next((float(m) for part, m in table if f"{part}." in key), None)


def _in_proj(t: np.ndarray, cfg: dict[str, Any]) -> np.ndarray:
    """``in_proj`` x ``ssm_in_multiplier``, then its z, x, B, C, dt row blocks x ``ssm_multipliers``."""
    inner, gs = int(cfg["mamba_d_ssm"]), int(cfg.get("mamba_n_groups", 1)) * int(cfg["mamba_d_state"])
    t = t * np.float32(cfg.get("ssm_in_multiplier", 1.0))
    bounds = [0, inner, 2 * inner, 2 * inner + gs, 2 * inner + 2 * gs, t.shape[0]]
    mults = cfg.get("ssm_multipliers") or [1.0] * 5
    for (lo, hi), m in zip(zip(bounds, bounds[1:]), mults):
        t[lo:hi] *= np.float32(m)
    return t


def to_gguf(key: str, array: np.ndarray, cfg: dict[str, Any]) -> list[tuple[str, np.ndarray]]:
    suffix = key.split(".", 3)[-1] if key.startswith("model.layers.") else key
    if suffix == "mamba.in_proj.weight":
        array = _in_proj(array, cfg)
    elif (m := _multiplier(key, cfg)) is not None:
        array = array * np.float32(m)
    array = mamba_layout(suffix, array, int(cfg.get("mamba_n_groups", 1)), to_gguf=True)
    return [(TABLE.gguf(key), array.astype(np.float32, copy=False))]


def from_gguf(key: str, parts: Mapping[str, np.ndarray], cfg: dict[str, Any]) -> np.ndarray:
    suffix = key.split(".", 3)[-1] if key.startswith("model.layers.") else key
    return mamba_layout(suffix, only(parts), int(cfg.get("mamba_n_groups", 1)), to_gguf=False).astype(np.float32)


def _config(f: Any) -> dict[str, Any]:
    if any(name.endswith(".ssm_norm.weight") for name in f.tensors):
        raise ConfigError(
            f"{f.path}: GGUF tensor 'ssm_norm.weight' (a Mamba2 gated norm) is not supported for "
            "falcon-h1: its order relative to the gate is not stored"
        )
    cfg = common_config(f, "falcon_h1", ["FalconH1ForCausalLM"])
    heads, inner = f.arch_int("ssm.time_step_rank"), f.arch_int("ssm.inner_size")
    if inner % heads:
        raise_config(f, f"{ARCH}.ssm.inner_size", "is not a multiple of ssm.time_step_rank")
    cfg.update(_ONES)
    cfg.update(
        mamba_d_ssm=inner,
        mamba_n_heads=heads,
        mamba_d_head=inner // heads,
        mamba_n_groups=f.arch_int("ssm.group_count"),
        mamba_d_state=f.arch_int("ssm.state_size"),
        mamba_d_conv=f.arch_int("ssm.conv_kernel"),
        mamba_proj_bias=False,
        mamba_rms_norm=False,
        mamba_conv_bias=any(name.endswith(".ssm_conv1d.bias") for name in f.tensors),
        projectors_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": f.arch_float("rope.freq_base", 10000.0)},
    )
    return cfg


def _metadata(cfg: dict[str, Any]) -> Meta:
    for field in ("mamba_rms_norm", "mamba_proj_bias", "projectors_bias", "tie_word_embeddings"):
        if cfg.get(field):  # a tied head cannot carry both multipliers folded in
            raise ConfigError(f"config.json: {field}=true is not written to falcon-h1 GGUF")
    inner, heads = int(cfg["mamba_d_ssm"]), int(cfg["mamba_n_heads"])
    a = ARCH
    return [
        (f"{a}.context_length", int(cfg.get("max_position_embeddings", 0)), U32),
        (f"{a}.embedding_length", int(cfg["hidden_size"]), U32),
        (f"{a}.feed_forward_length", int(cfg["intermediate_size"]), U32),
        (f"{a}.attention.head_count", int(cfg["num_attention_heads"]), U32),
        (f"{a}.block_count", int(cfg["num_hidden_layers"]), U32),
        (f"{a}.ssm.conv_kernel", int(cfg.get("mamba_d_conv", 4)), U32),
        (f"{a}.ssm.inner_size", inner, U32),
        (f"{a}.ssm.state_size", int(cfg["mamba_d_state"]), U32),
        (f"{a}.ssm.time_step_rank", inner // int(cfg.get("mamba_d_head") or inner // heads), U32),
        (f"{a}.ssm.group_count", int(cfg.get("mamba_n_groups", 1)), U32),
        (f"{a}.attention.layer_norm_rms_epsilon", float(cfg.get("rms_norm_eps", 1e-5)), F32),
        (f"{a}.vocab_size", int(cfg["vocab_size"]), U32),
        (f"{a}.attention.head_count_kv", int(cfg["num_key_value_heads"]), U32),
        (f"{a}.attention.key_length", int(cfg["head_dim"]), U32),
        (f"{a}.attention.value_length", int(cfg["head_dim"]), U32),
        (f"{a}.rope.freq_base", float(rope_theta(cfg)), F32),
    ]


FALCON_H1 = Family(
    ARCH,
    ("FalconH1ForCausalLM",),
    _config,
    _metadata,
    to_gguf,
    TABLE.hf,
    from_gguf,
    lambda key, cfg: (TABLE.gguf(key),),
)
