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

from typing import Any

import numpy as np

from radixflow_jax.models.config import ConfigError, ModelConfig
from radixflow_jax.models.gguf.family import U32, Meta, common_config, common_metadata, feed_forward_table
from radixflow_jax.models.gguf.family import mamba_layout, raise_config, rope_theta, ssm_metadata, table_family

ARCH = "falcon-h1"
TABLE = feed_forward_table("ffn_norm")  # the converter drops the ``.weight``
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


def _layout(key: str, array: np.ndarray, cfg: dict[str, Any], to_gguf: bool) -> np.ndarray:
    """The multipliers folded in (writing only: they are not recovered) and the Mamba2 stored forms."""
    suffix = key.split(".", 3)[-1] if key.startswith("model.layers.") else key
    if to_gguf and suffix == "mamba.in_proj.weight":
        array = _in_proj(array, cfg)
    elif to_gguf and (m := _multiplier(key, cfg)) is not None:
        array = array * np.float32(m)
    return mamba_layout(suffix, array, int(cfg.get("mamba_n_groups", 1)), to_gguf=to_gguf)


def _hf_config(f: Any) -> dict[str, Any]:
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


def _gguf_metadata(model: ModelConfig, cfg: dict[str, Any]) -> Meta:
    for field in ("mamba_rms_norm", "mamba_proj_bias", "projectors_bias", "tie_word_embeddings"):
        if cfg.get(field):  # a tied head cannot carry both multipliers folded in
            raise ConfigError(f"config.json: {field}=true is not written to falcon-h1 GGUF")
    att, mamba = model.attention, model.mamba
    assert att is not None and mamba is not None
    meta = common_metadata(ARCH, model, rope_theta=rope_theta(cfg), key_length=att.head_dim)
    return meta + [(f"{ARCH}.vocab_size", model.vocab_size, U32)] + ssm_metadata(ARCH, mamba)


FALCON_H1 = table_family(ARCH, ("FalconH1ForCausalLM",), _hf_config, _gguf_metadata, table=TABLE, layout=_layout)
