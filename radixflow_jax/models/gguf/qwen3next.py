"""``qwen3next``: Qwen3-Next (Gated DeltaNet + gated attention, MoE MLPs), HF ``qwen3_next``.

Layout changes llama.cpp's converter (``Qwen3NextModel``, ``Qwen2MoeModel``) makes, undone on reading:

* the RMSNorm offsets, ``ssm_a = -exp(A_log)``, ``ssm_dt.bias`` and the squeezed ``ssm_conv1d`` as
  for ``qwen35`` (``qwen35.gdn_layout``), but value heads keep their HF order (no regrouping).
* ``in_proj_qkvz`` ``[nk * (2 dk + 2 r dv), H]`` (per key head ``[q, k, v, z]``) is split into
  ``attn_qkv`` (all q heads, all k heads, all v heads) and ``attn_gate`` (all z heads); reading
  interleaves them back per key head. ``in_proj_ba`` is stored as is (``ssm_ba``).
* routed experts are stacked: ``ffn_gate_exps``/``ffn_up_exps`` ``[E, I, H]`` and ``ffn_down_exps``
  ``[E, H, I]`` (read back as the fused HF ``mlp.experts.gate_up_proj``/``down_proj``); the router is
  ``ffn_gate_inp``, the shared expert ``ffn_*_shexp`` and its gate ``ffn_gate_inp_shexp``.

A block without ``ffn_gate_inp`` is a dense-MLP block (``mlp_only_layers``).
``ffn_gate_inp_shexp`` is ``[1, H]`` as the converter writes it, but ``llama-quantize`` writes it 1-D
``[H]`` (ggml drops a trailing extent of 1); both read back as HF's ``[1, H]``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

from radixflow_jax.models.gguf.family import ATTENTION, U32, Family, Meta, NameTable, common_config, common_metadata
from radixflow_jax.models.gguf.family import head_dim_of, only
from radixflow_jax.models.gguf.qwen35 import _LAYER as QWEN35_LAYER
from radixflow_jax.models.gguf.qwen35 import _dims, gdn_config, gdn_layout, gdn_metadata
from radixflow_jax.models.safetensors_io import WeightsError

ARCH = "qwen3next"
_LAYER = {
    **{k: v for k, v in QWEN35_LAYER.items() if not k.startswith("linear_attn.in_proj_")},
    **ATTENTION,
    "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
}
TABLE = NameTable(_LAYER)
_QKVZ = "linear_attn.in_proj_qkvz.weight"
_GATE_UP = "mlp.experts.gate_up_proj"
_SPLIT = {_QKVZ: ("attn_qkv.weight", "attn_gate.weight"), _GATE_UP: ("ffn_gate_exps.weight", "ffn_up_exps.weight")}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
_SHARED_GATE = "mlp.shared_expert_gate.weight"


def _qkvz_parts(cfg: dict[str, Any]) -> tuple[int, int, int, int]:
    nk, nv, dk, dv = _dims(cfg)
    return nk, dk, dk, nv // nk * dv  # per key head: q, k, and v (= z) widths


def _split(key: str, t: np.ndarray, cfg: dict[str, Any]) -> list[np.ndarray]:
    if key.endswith(_GATE_UP):
        half = t.shape[1] // 2
        return [t[:, :half], t[:, half:]]
    nk, q, k, v = _qkvz_parts(cfg)
    heads = t.reshape(nk, q + k + 2 * v, t.shape[-1])
    qs, ks, vs, zs = np.split(heads, [q, q + k, q + k + v], axis=1)
    qkv = np.concatenate([x.reshape(-1, t.shape[-1]) for x in (qs, ks, vs)], axis=0)
    return [qkv, zs.reshape(-1, t.shape[-1])]


def _join(key: str, first: np.ndarray, second: np.ndarray, cfg: dict[str, Any]) -> np.ndarray:
    if key.endswith(_GATE_UP):
        return np.concatenate([first, second], axis=1)
    nk, q, k, v = _qkvz_parts(cfg)
    cols = first.shape[-1]
    qs, ks, vs = np.split(first, [nk * q, nk * (q + k)], axis=0)
    heads = [x.reshape(nk, -1, cols) for x in (qs, ks, vs, second)]
    return np.concatenate(heads, axis=1).reshape(-1, cols)


def _layer_key(key: str) -> tuple[str, str] | None:
    m = re.match(r"^model\.layers\.(\d+)\.(.+)$", key)
    return (m[1], m[2]) if m else None


def to_gguf(key: str, array: np.ndarray, cfg: dict[str, Any]) -> list[tuple[str, np.ndarray]]:
    parts = _layer_key(key)
    if parts and parts[1] in _SPLIT:
        names = _SPLIT[parts[1]]
        return [(f"blk.{parts[0]}.{n}", a) for n, a in zip(names, _split(key, array, cfg))]
    return [(TABLE.gguf(key), gdn_layout(key, array, cfg, to_gguf=True, regroup=False))]


def hf_key(name: str) -> str:
    m = _BLOCK.match(name)
    if m:
        for key, names in _SPLIT.items():
            if m[2] in names:
                return f"model.layers.{m[1]}.{key}"
    return TABLE.hf(name)


def gguf_names(key: str, cfg: dict[str, Any]) -> tuple[str, ...]:
    parts = _layer_key(key)
    if parts and parts[1] in _SPLIT:
        return tuple(f"blk.{parts[0]}.{n}" for n in _SPLIT[parts[1]])
    return (TABLE.gguf(key),)


def from_gguf(key: str, parts: Mapping[str, np.ndarray], cfg: dict[str, Any]) -> np.ndarray:
    names = gguf_names(key, cfg)
    if len(names) == 2:
        missing = [n for n in names if n not in parts]
        if missing:
            raise WeightsError(f"GGUF tensor '{missing[0]}' is missing (needed for '{key}')")
        return _join(key, parts[names[0]], parts[names[1]], cfg)
    array = only(parts)
    if key.endswith(_SHARED_GATE) and array.ndim == 1:
        return array.reshape(1, -1)
    return gdn_layout(key, array, cfg, to_gguf=False, regroup=False)


def _config(f: Any) -> dict[str, Any]:
    cfg = common_config(f, "qwen3_next", ["Qwen3NextForCausalLM"])
    gdn_config(f, cfg)
    routed = [b for b in range(cfg["num_hidden_layers"]) if f"blk.{b}.ffn_gate_inp.weight" in f.tensors]
    cfg.update(
        num_experts=f.arch_int("expert_count"),
        num_experts_per_tok=f.arch_int("expert_used_count"),
        moe_intermediate_size=f.arch_int("expert_feed_forward_length"),
        shared_expert_intermediate_size=f.arch_int("expert_shared_feed_forward_length", 0),
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[b for b in range(cfg["num_hidden_layers"]) if b not in routed],
    )
    return cfg


def _metadata(cfg: dict[str, Any]) -> Meta:
    meta = common_metadata(ARCH, cfg, head_dim_of(cfg))
    if cfg.get("num_experts"):
        meta += [
            (f"{ARCH}.expert_count", int(cfg["num_experts"]), U32),
            (f"{ARCH}.expert_used_count", int(cfg["num_experts_per_tok"]), U32),
        ]
    if cfg.get("moe_intermediate_size") is not None:
        meta.append((f"{ARCH}.expert_feed_forward_length", int(cfg["moe_intermediate_size"]), U32))
    if cfg.get("shared_expert_intermediate_size") is not None:
        meta.append((f"{ARCH}.expert_shared_feed_forward_length", int(cfg["shared_expert_intermediate_size"]), U32))
    if cfg.get("norm_topk_prob") is False:
        from radixflow_jax.models.config import ConfigError

        raise ConfigError("config.json: norm_topk_prob=false has no qwen3next GGUF key (llama.cpp normalises top-k)")
    return meta + gdn_metadata(ARCH, cfg)


QWEN3NEXT = Family(ARCH, ("Qwen3NextForCausalLM",), _config, _metadata, to_gguf, hf_key, from_gguf, gguf_names)
