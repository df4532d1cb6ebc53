"""``llama`` and ``qwen3``: dense full-attention families.

Layout changes llama.cpp's converter makes, undone on reading:

* ``llama``: ``attn_q``/``attn_k`` rows are permuted per head for its interleaved RoPE
  (``reshape(h, 2, d/2, in).swapaxes(1, 2)``); :func:`unpermute_qk` is the exact inverse.
* ``qwen3``: none (NEOX RoPE, so no permutation); ``q_norm``/``k_norm`` become ``attn_q_norm``/``attn_k_norm``.

Invariant: the HF config dict names only HF fields; an unsupported RoPE scaling raises naming the key.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from radixflow_jax.models.config import ConfigError, ModelConfig
from radixflow_jax.models.gguf.family import ATTENTION, DENSE_MLP, F32, STR, Meta, NameTable, common_config
from radixflow_jax.models.gguf.family import common_metadata, raise_config, rope_theta, table_family
from radixflow_jax.models.gguf.family import written_head_dim, written_rope_theta
from radixflow_jax.models.safetensors_io import WeightsError

_TABLE = NameTable({**ATTENTION, **DENSE_MLP})


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row order: per head it stores rows ``[0, d/2, 1, d/2+1, ...]`` as
    ``[0, 1, ..., d-1]``; HF's rotate-half layout wants the halves back together.

    ``weight`` is ``[num_heads * d, in]``; the converter did ``reshape(h, 2, d/2, in).swapaxes(1, 2)``,
    so the inverse is ``reshape(h, d/2, 2, in).swapaxes(1, 2)``."""
    rows, cols = weight.shape
    if rows % (2 * num_heads):
        raise WeightsError(f"q/k weight with {rows} rows cannot be split into {num_heads} heads of even size")
    return weight.reshape(num_heads, rows // num_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def permute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """The converter's q/k permutation (inverse of :func:`unpermute_qk`)."""
    rows, cols = weight.shape
    if rows % (2 * num_heads):
        raise WeightsError(f"q/k weight with {rows} rows cannot be split into {num_heads} heads of even size")
    return weight.reshape(num_heads, 2, rows // num_heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _qk_heads(key: str, cfg: dict[str, Any]) -> int | None:
    if key.endswith("self_attn.q_proj.weight"):
        return int(cfg["num_attention_heads"])
    if key.endswith("self_attn.k_proj.weight"):
        return int(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    return None


def _llama_hf_config(f: Any) -> dict[str, Any]:
    cfg = common_config(f, "llama", ["LlamaForCausalLM"])
    del cfg["architectures"]
    rotary = f.arch_int("rope.dimension_count", cfg["head_dim"])
    if rotary != cfg["head_dim"]:
        raise_config(f, "llama.rope.dimension_count", f"!= head_dim {cfg['head_dim']} (partial RoPE)")
    cfg["rope_theta"] = f.arch_float("rope.freq_base", 10000.0)
    scaling = f.get("llama.rope.scaling.type", "none")
    if scaling == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(f.require("llama.rope.scaling.factor", float))}
    elif scaling != "none":
        raise ConfigError(f"{f.path}: GGUF llama.rope.scaling.type={scaling!r} is not supported (none, linear)")
    return cfg


def _common(arch: str, model: ModelConfig, cfg: dict[str, Any]) -> Meta:
    return common_metadata(arch, model, rope_theta=written_rope_theta(cfg), key_length=written_head_dim(model, cfg))


def _llama_gguf_metadata(model: ModelConfig, cfg: dict[str, Any]) -> Meta:
    assert model.attention is not None
    meta = _common("llama", model, cfg)
    meta += [
        ("llama.rope.dimension_count", model.attention.head_dim, "u32"),
        ("llama.vocab_size", model.vocab_size, "u32"),
    ]
    scaling = cfg.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        meta += [
            ("llama.rope.scaling.type", "linear", STR),
            ("llama.rope.scaling.factor", float(scaling["factor"]), F32),
        ]
    elif scaling:
        raise ConfigError(f"config.json: rope_scaling={scaling!r} is not written to GGUF (linear only)")
    return meta


def _llama_layout(key: str, t: np.ndarray, cfg: dict[str, Any], to_gguf: bool) -> np.ndarray:
    heads = _qk_heads(key, cfg)
    if not heads:
        return t
    return permute_qk(t, heads) if to_gguf else unpermute_qk(t, heads)


def _qwen3_hf_config(f: Any) -> dict[str, Any]:
    cfg = common_config(f, "qwen3", ["Qwen3ForCausalLM"])
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": f.arch_float("rope.freq_base", 10000.0)}
    if f.arch_int("rope.dimension_count", cfg["head_dim"]) != cfg["head_dim"]:
        raise_config(f, "qwen3.rope.dimension_count", "!= head_dim (partial RoPE)")
    cfg["attention_bias"] = False
    return cfg


def _qwen3_gguf_metadata(model: ModelConfig, cfg: dict[str, Any]) -> Meta:
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
        raise ConfigError(
            f"config.json: RoPE {rope or cfg.get('rope_scaling')!r}: only default RoPE is written for qwen3"
        )
    if cfg.get("attention_bias"):
        raise ConfigError("config.json: attention_bias=true is not supported for qwen3")
    rope_theta(cfg)
    return _common("qwen3", model, cfg)


LLAMA = table_family(
    "llama", ("LlamaForCausalLM",), _llama_hf_config, _llama_gguf_metadata, table=_TABLE, layout=_llama_layout
)
QWEN3 = table_family(
    "qwen3", ("Qwen3ForCausalLM",), _qwen3_hf_config, _qwen3_gguf_metadata, table=_TABLE, layout=lambda k, t, c, g: t
)
