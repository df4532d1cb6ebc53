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

from typing import Any

import numpy as np

from radixflow_jax.models.config import ConfigError, ModelConfig
from radixflow_jax.models.gguf.family import ATTENTION, U32, Meta, NameTable, Splits, common_config, common_metadata
from radixflow_jax.models.gguf.family import table_family, written_head_dim, written_rope_theta
from radixflow_jax.models.gguf.qwen35 import LAYER as QWEN35_LAYER
from radixflow_jax.models.gguf.qwen35 import gdn_config, gdn_dims, gdn_layout, gdn_metadata

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
_SHARED_GATE = "mlp.shared_expert_gate.weight"


def _qkvz_parts(cfg: dict[str, Any]) -> tuple[int, int, int, int]:
    nk, nv, dk, dv = gdn_dims(cfg)
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


def _join(key: str, parts: list[np.ndarray], cfg: dict[str, Any]) -> np.ndarray:
    first, second = parts
    if key.endswith(_GATE_UP):
        return np.concatenate([first, second], axis=1)
    nk, q, k, v = _qkvz_parts(cfg)
    cols = first.shape[-1]
    qs, ks, vs = np.split(first, [nk * q, nk * (q + k)], axis=0)
    heads = [x.reshape(nk, -1, cols) for x in (qs, ks, vs, second)]
    return np.concatenate(heads, axis=1).reshape(-1, cols)


def _layout(key: str, t: np.ndarray, cfg: dict[str, Any], to_gguf: bool) -> np.ndarray:
    """``qwen35.gdn_layout`` without the value-head regrouping; the shared expert gate read back as
    ``[1, H]`` from either stored form."""
    if not to_gguf and key.endswith(_SHARED_GATE) and t.ndim == 1:
        return t.reshape(1, -1)
    return gdn_layout(key, t, cfg, to_gguf=to_gguf, regroup=False)


def _hf_config(f: Any) -> dict[str, Any]:
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


def _gguf_metadata(model: ModelConfig, cfg: dict[str, Any]) -> Meta:
    meta = common_metadata(ARCH, model, rope_theta=written_rope_theta(cfg), key_length=written_head_dim(model, cfg))
    moe = model.moe
    if moe is not None:
        meta += [(f"{ARCH}.expert_count", moe.num_experts, U32), (f"{ARCH}.expert_used_count", moe.top_k, U32)]
    if cfg.get("moe_intermediate_size") is not None:
        meta.append((f"{ARCH}.expert_feed_forward_length", int(cfg["moe_intermediate_size"]), U32))
    if cfg.get("shared_expert_intermediate_size") is not None:
        meta.append((f"{ARCH}.expert_shared_feed_forward_length", int(cfg["shared_expert_intermediate_size"]), U32))
    if moe is not None and not moe.norm_topk:
        raise ConfigError("config.json: norm_topk_prob=false has no qwen3next GGUF key (llama.cpp normalises top-k)")
    return meta + gdn_metadata(ARCH, cfg)


SPLITS = Splits(_SPLIT, _split, _join)
QWEN3NEXT = table_family(
    ARCH, ("Qwen3NextForCausalLM",), _hf_config, _gguf_metadata, table=TABLE, layout=_layout, splits=SPLITS
)
to_gguf, from_gguf = QWEN3NEXT.to_gguf, QWEN3NEXT.from_gguf
