"""What a model family contributes to GGUF reading and writing, and the name tables they share.

A :class:`Family` is four pure functions, one pair per direction:

* ``config(f)``: the GGUF metadata -> the HF ``config.json`` dict (parsed by ``parse_hf_config``);
  ``metadata(cfg)``: the HF config dict -> the ``(key, value, kind)`` list llama.cpp's converter writes.
* ``to_gguf(key, array, cfg)``: one HF tensor -> the GGUF tensors the converter makes of it (names,
  ``[out, in]`` arrays with its layout changes applied); ``hf_key(name)``: the HF tensor a GGUF tensor
  belongs to, and ``from_gguf(key, parts, cfg)``: those GGUF arrays -> the HF tensor, undoing
  ``to_gguf`` exactly (up to float32 rounding where the stored form is ``-exp(A_log)`` or ``w + 1``).

Invariants: functions hold no state; a name a family cannot map raises ``WeightsError`` naming it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from radixflow_jax.models.safetensors_io import WeightsError

U32, F32, STR, ARR = "u32", "f32", "str", "array"  # metadata kinds (``ARR``: list of bool/int/float/str)
Meta = list[tuple[str, Any, str]]
TensorPairs = list[tuple[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Family:
    arch: str  # general.architecture
    hf_architectures: tuple[str, ...]  # the HF ``architectures`` entries the converter maps to ``arch``
    config: Callable[[Any], dict[str, Any]]
    metadata: Callable[[dict[str, Any]], Meta]
    to_gguf: Callable[[str, np.ndarray, dict[str, Any]], TensorPairs]
    hf_key: Callable[[str], str]
    from_gguf: Callable[[str, Mapping[str, np.ndarray], dict[str, Any]], np.ndarray]
    gguf_names: Callable[[str, dict[str, Any]], tuple[str, ...]]  # HF key -> the GGUF names it is made of
    # whether a file of ``arch`` is this family's (two families share ``granitehybrid``); the first
    # family of the arch that accepts the file reads it
    accepts: Callable[[Any], bool] = lambda f: True


TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
ATTENTION = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
DENSE_MLP = {
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GGUF_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


@dataclasses.dataclass(frozen=True)
class NameTable:
    """A one-to-one renaming of HF keys to GGUF names: top-level and per-layer suffixes
    (HF ``{layers}.{i}.{suffix}`` <-> GGUF ``blk.{i}.{name}``)."""

    layer: Mapping[str, str]
    top: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(TOP))
    layers: str = "model.layers"

    def gguf(self, key: str) -> str:
        if key in self.top:
            return self.top[key]
        m = re.match(rf"^{re.escape(self.layers)}\.(\d+)\.(.+)$", key)
        if m and m[2] in self.layer:
            return f"blk.{m[1]}.{self.layer[m[2]]}"
        raise WeightsError(f"HF tensor '{key}' has no GGUF name in this family")

    def hf(self, name: str) -> str:
        for key, value in self.top.items():
            if value == name:
                return key
        m = _GGUF_LAYER.match(name)
        if m:
            for key, value in self.layer.items():
                if value == m[2]:
                    return f"{self.layers}.{m[1]}.{key}"
        raise WeightsError(f"GGUF tensor '{name}' is not supported for this architecture")


def only(parts: Mapping[str, np.ndarray]) -> np.ndarray:
    """The single GGUF array a one-to-one HF tensor is made of."""
    if len(parts) != 1:
        raise WeightsError(f"expected one GGUF tensor, got {sorted(parts)}")
    return next(iter(parts.values()))


def common_metadata(arch: str, cfg: dict[str, Any], head_dim: int) -> Meta:
    """The keys llama.cpp's base text model writes for every family (``TextModel.set_gguf_parameters``)."""
    meta: Meta = [
        (f"{arch}.block_count", int(cfg["num_hidden_layers"]), U32),
        (f"{arch}.context_length", int(cfg["max_position_embeddings"]), U32),
        (f"{arch}.embedding_length", int(cfg["hidden_size"]), U32),
        (f"{arch}.feed_forward_length", int(cfg["intermediate_size"]), U32),
        (f"{arch}.attention.head_count", int(cfg["num_attention_heads"]), U32),
        (f"{arch}.attention.head_count_kv", int(cfg.get("num_key_value_heads", cfg["num_attention_heads"])), U32),
    ]
    if "rope_theta" in (cfg.get("rope_parameters") or {}) or "rope_theta" in cfg:  # written only when present
        meta.append((f"{arch}.rope.freq_base", float(rope_theta(cfg)), F32))
    meta.append((f"{arch}.attention.layer_norm_rms_epsilon", float(cfg["rms_norm_eps"]), F32))
    if cfg.get("head_dim") is not None:
        meta += [(f"{arch}.attention.key_length", head_dim, U32), (f"{arch}.attention.value_length", head_dim, U32)]
    return meta


def rope_theta(cfg: dict[str, Any]) -> float:
    params = cfg.get("rope_parameters") or {}
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def head_dim_of(cfg: dict[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def common_config(f: Any, model_type: str, architectures: Sequence[str]) -> dict[str, Any]:
    """The HF fields every family's metadata carries (inverse of :func:`common_metadata`)."""
    heads = f.arch_int("attention.head_count")
    hidden = f.arch_int("embedding_length")
    head_dim = f.arch_int("attention.key_length", hidden // heads if heads else 0)
    if f.arch_int("attention.value_length", head_dim) != head_dim:
        raise_config(f, f"{f.arch}.attention.value_length", "differs from key_length")
    tokens = f.get("tokenizer.ggml.tokens")
    return {
        "model_type": model_type,
        "architectures": list(architectures),
        "vocab_size": f.get(f"{f.arch}.vocab_size", len(tokens) if tokens else None),
        "hidden_size": hidden,
        "num_hidden_layers": f.arch_int("block_count"),
        "intermediate_size": f.arch_int("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": _kv_heads(f, heads),
        "head_dim": head_dim,
        "rms_norm_eps": f.arch_float("attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": f.arch_int("context_length", 8192),
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in f.tensors,
        "bos_token_id": f.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": f.get("tokenizer.ggml.eos_token_id"),
    }


def _kv_heads(f: Any, heads: int) -> int:
    """``attention.head_count_kv``: one number, or a per-layer array (0 on layers without attention)."""
    value = f.get(f"{f.arch}.attention.head_count_kv")
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return max(value)
    return f.arch_int("attention.head_count_kv", heads)


def raise_config(f: Any, key: str, why: str) -> None:
    from radixflow_jax.models.config import ConfigError

    raise ConfigError(f"{f.path}: GGUF {key}={f.get(key)!r} {why}")
