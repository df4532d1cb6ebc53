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

import re
from typing import Any, Mapping

import numpy as np

from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.gguf.dense import permute_qk, unpermute_qk
from radixflow_jax.models.gguf.family import (
    ARR,
    ATTENTION,
    F32,
    U32,
    Family,
    Meta,
    NameTable,
    common_config,
    only,
    raise_config,
)
from radixflow_jax.models.safetensors_io import WeightsError

ARCH = "granitehybrid"
NO_ROPE_CONTEXT = 2**20
_LAYER = {
    **{k: v for k, v in ATTENTION.items() if "_norm." not in k or k.startswith("input_")},
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mamba.in_proj.weight": "ssm_in.weight",
    "mamba.conv1d.weight": "ssm_conv1d.weight",
    "mamba.conv1d.bias": "ssm_conv1d.bias",
    "mamba.dt_bias": "ssm_dt.bias",
    "mamba.A_log": "ssm_a",
    "mamba.D": "ssm_d",
    "mamba.norm.weight": "ssm_norm.weight",
    "mamba.out_proj.weight": "ssm_out.weight",
    "block_sparse_moe.router.layer.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.output_linear.weight": "ffn_down_exps.weight",
    "shared_mlp.output_linear.weight": "ffn_down_shexp.weight",
}
TABLE = NameTable(_LAYER)
# fused HF tensor -> (its two GGUF halves, the axis they split on)
_SPLIT = {
    "block_sparse_moe.input_linear.weight": (("ffn_gate_exps.weight", "ffn_up_exps.weight"), 1),
    "shared_mlp.input_linear.weight": (("ffn_gate_shexp.weight", "ffn_up_shexp.weight"), 0),
}
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def _kv_heads(cfg: dict[str, Any]) -> int:
    return int(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))


def _layout(key: str, t: np.ndarray, cfg: dict[str, Any], *, to_gguf: bool) -> np.ndarray:
    suffix = key.split(".", 3)[-1] if key.startswith("model.layers.") else key
    if suffix in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
        heads = int(cfg["num_attention_heads"]) if ".q_proj" in suffix else _kv_heads(cfg)
        return permute_qk(t, heads) if to_gguf else unpermute_qk(t, heads)
    return mamba_layout(suffix, t, int(cfg.get("mamba_n_groups", 1)), to_gguf=to_gguf)


def mamba_layout(suffix: str, t: np.ndarray, groups: int, *, to_gguf: bool) -> np.ndarray:
    """``Mamba2Model``'s stored forms of a ``mamba.*`` tensor (``suffix`` below the layer), or their
    inverse: squeezed conv, ``-exp(A_log)`` and ``D`` as ``[heads, 1]``, the norm as ``[groups, -1]``."""
    if suffix == "mamba.conv1d.weight":
        return t.reshape(t.shape[0], t.shape[-1]) if to_gguf else t[:, None, :]
    if suffix == "mamba.A_log":
        return -np.exp(t).reshape(-1, 1) if to_gguf else np.log(-t).reshape(-1)
    if suffix == "mamba.D":
        return t.reshape(-1, 1) if to_gguf else t.reshape(-1)
    if suffix == "mamba.norm.weight":
        return t.reshape(groups, -1) if to_gguf else t.reshape(-1)
    return t


def _split_of(key: str) -> tuple[str, tuple[tuple[str, str], int]] | None:
    m = _HF_LAYER.match(key)
    return (m[1], _SPLIT[m[2]]) if m and m[2] in _SPLIT else None


def to_gguf(key: str, array: np.ndarray, cfg: dict[str, Any]) -> list[tuple[str, np.ndarray]]:
    split = _split_of(key)
    if split:
        (first, second), axis = split[1]
        a, b = np.split(array, 2, axis=axis)
        return [(f"blk.{split[0]}.{first}", a), (f"blk.{split[0]}.{second}", b)]
    return [(TABLE.gguf(key), _layout(key, array, cfg, to_gguf=True).astype(np.float32, copy=False))]


def hf_key(name: str) -> str:
    m = _BLOCK.match(name)
    if m:
        for key, (names, _) in _SPLIT.items():
            if m[2] in names:
                return f"model.layers.{m[1]}.{key}"
    return TABLE.hf(name)


def gguf_names(key: str, cfg: dict[str, Any]) -> tuple[str, ...]:
    split = _split_of(key)
    return tuple(f"blk.{split[0]}.{n}" for n in split[1][0]) if split else (TABLE.gguf(key),)


def from_gguf(key: str, parts: Mapping[str, np.ndarray], cfg: dict[str, Any]) -> np.ndarray:
    split = _split_of(key)
    if split:
        names = gguf_names(key, cfg)
        missing = [n for n in names if n not in parts]
        if missing:
            raise WeightsError(f"GGUF tensor '{missing[0]}' is missing (needed for '{key}')")
        return np.concatenate([parts[n] for n in names], axis=split[1][1])
    return _layout(key, only(parts), cfg, to_gguf=False).astype(np.float32, copy=False)


def _config(f: Any) -> dict[str, Any]:
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


def _metadata(cfg: dict[str, Any]) -> Meta:
    if cfg.get("mamba_proj_bias"):
        raise ConfigError("config.json: mamba_proj_bias=true has no granitehybrid GGUF tensor")
    types = cfg.get("layer_types") or []
    n, hidden, heads = int(cfg["num_hidden_layers"]), int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    if len(types) != n:
        raise ConfigError("config.json: layer_types and num_hidden_layers disagree (granitehybrid)")
    rope = cfg.get("position_embedding_type") == "rope"
    a = ARCH
    meta: Meta = [
        (f"{a}.block_count", n, U32),
        (f"{a}.context_length", int(cfg["max_position_embeddings"]) if rope else NO_ROPE_CONTEXT, U32),
        (f"{a}.embedding_length", hidden, U32),
        (f"{a}.feed_forward_length", int(cfg["intermediate_size"]), U32),
        (f"{a}.attention.head_count", heads, U32),
        (f"{a}.attention.head_count_kv", [_kv_heads(cfg) if t == "attention" else 0 for t in types], ARR),
    ]
    if rope:
        meta.append((f"{a}.rope.freq_base", float(cfg.get("rope_theta", 10000.0)), F32))
    meta.append((f"{a}.attention.layer_norm_rms_epsilon", float(cfg["rms_norm_eps"]), F32))
    if cfg.get("num_local_experts"):
        meta += [
            (f"{a}.expert_count", int(cfg["num_local_experts"]), U32),
            (f"{a}.expert_used_count", int(cfg["num_experts_per_tok"]), U32),
        ]
    meta += [(f"{a}.vocab_size", int(cfg["vocab_size"]), U32), (f"{a}.rope.dimension_count", hidden // heads, U32)]
    for key, field in (
        ("attention.scale", "attention_multiplier"),
        ("embedding_scale", "embedding_multiplier"),
        ("residual_scale", "residual_multiplier"),
        ("logit_scale", "logits_scaling"),
    ):
        if cfg.get(field):
            meta.append((f"{a}.{key}", float(cfg[field]), F32))
    inner = int(cfg.get("mamba_expand", 2) * hidden)
    meta += [
        (f"{a}.expert_shared_feed_forward_length", int(cfg["shared_intermediate_size"]), U32),
        (f"{a}.ssm.conv_kernel", int(cfg["mamba_d_conv"]), U32),
        (f"{a}.ssm.state_size", int(cfg["mamba_d_state"]), U32),
        (f"{a}.ssm.group_count", int(cfg.get("mamba_n_groups", 1)), U32),
        (f"{a}.ssm.inner_size", inner, U32),
        (f"{a}.ssm.time_step_rank", int(cfg["mamba_n_heads"]), U32),
        (f"{a}.rope.scaling.finetuned", rope, "bool"),
    ]
    return meta


GRANITE_HYBRID = Family(
    ARCH, ("GraniteMoeHybridForCausalLM",), _config, _metadata, to_gguf, hf_key, from_gguf, gguf_names
)
