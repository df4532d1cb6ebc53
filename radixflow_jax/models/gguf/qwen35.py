"""``qwen35``: Qwen3.5 (Gated DeltaNet layers with gated full-attention layers), HF ``qwen3_5_text``.

Layout changes llama.cpp's converter makes (``Qwen3NextModel`` + ``_LinearAttentionVReorderBase``),
each undone exactly on reading:

* every RMSNorm weight but the GDN output norm is stored as ``w + 1`` (HF keeps zero-centred
  weights; llama.cpp multiplies by the stored weight): ``attn_norm``, ``post_attention_norm``,
  ``attn_q_norm``, ``attn_k_norm``, ``output_norm``. ``ssm_norm`` is stored as is.
* ``A_log`` is stored as ``ssm_a = -exp(A_log)``; ``dt_bias`` as ``ssm_dt.bias``.
* ``conv1d.weight`` ``[C, 1, K]`` is stored squeezed, ``[C, K]``.
* when there are fewer key heads than value heads, value heads are reordered from grouped-by-key-head
  (``[k0v0, k0v1, k1v0, k1v1]``) to tiled (``[k0v0, k1v0, k0v1, k1v1]``) in the V rows of
  ``attn_qkv`` and of ``ssm_conv1d``, the rows of ``attn_gate``, ``ssm_alpha``, ``ssm_beta``,
  ``ssm_a``, ``ssm_dt.bias`` and the columns of ``ssm_out``.
* no q/k permutation (NEOX RoPE); the attention ``q_proj`` holds query and output gate, as in HF.

``rope.dimension_sections`` (multimodal RoPE) does not change text positions and is not read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from radixflow_jax.models.config import ConfigError, ModelConfig
from radixflow_jax.models.gguf.family import ARR, ATTENTION, U32, Meta, NameTable, common_config, common_metadata
from radixflow_jax.models.gguf.family import head_dim_of, raise_config, table_family
from radixflow_jax.models.gguf.family import written_head_dim, written_rope_theta
from radixflow_jax.models.gguf.nextn import nextn_layers

ARCH = "qwen35"
MROPE_DEFAULT = [11, 11, 10, 0]
LAYER = {  # shared with qwen3next
    **ATTENTION,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
}
TABLE = NameTable(LAYER)


def gdn_dims(cfg: dict[str, Any]) -> tuple[int, int, int, int]:
    """``(key heads, value heads, key head dim, value head dim)`` of the GDN layers."""
    return (
        int(cfg["linear_num_key_heads"]),
        int(cfg["linear_num_value_heads"]),
        int(cfg["linear_key_head_dim"]),
        int(cfg["linear_value_head_dim"]),
    )


def _regroup(t: np.ndarray, axis: int, nk: int, nv: int, hd: int, *, to_tiled: bool) -> np.ndarray:
    """Value heads along ``axis`` (``nv * hd`` long) between grouped-by-key-head and tiled order."""
    if nk == nv:
        return t
    r = nv // nk
    t = np.moveaxis(t, axis, 0)
    shape = t.shape
    split = (nk, r, hd) if to_tiled else (r, nk, hd)
    t = t.reshape(*split, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.ascontiguousarray(np.moveaxis(t, 0, axis))


def _zero_centred(suffix: str) -> bool:
    return suffix.endswith("norm.weight") and suffix != "linear_attn.norm.weight"


def gdn_layout(key: str, t: np.ndarray, cfg: dict[str, Any], *, to_gguf: bool, regroup: bool = True) -> np.ndarray:
    """The converter's change to tensor ``key`` (``to_gguf``) or its inverse; ``regroup=False``
    (qwen3next) leaves the value-head order alone."""
    nk, nv, dk, dv = gdn_dims(cfg) if "linear_num_key_heads" in cfg else (1, 1, 0, 0)
    if not regroup:
        nk = nv
    suffix = key.split(".", 3)[-1] if key.startswith("model.layers.") else key
    if _zero_centred(suffix):
        return t + np.float32(1.0) if to_gguf else t - np.float32(1.0)
    if not suffix.startswith("linear_attn."):
        return t
    name = suffix[len("linear_attn.") :]
    if name == "conv1d.weight" and to_gguf:
        t = t.reshape(t.shape[0], t.shape[-1])
    if name in ("in_proj_qkv.weight", "conv1d.weight"):
        qk = 2 * nk * dk
        t = np.concatenate([t[:qk], _regroup(t[qk:], 0, nk, nv, dv, to_tiled=to_gguf)], axis=0)
    elif name == "in_proj_z.weight":
        t = _regroup(t, 0, nk, nv, dv, to_tiled=to_gguf)
    elif name in ("in_proj_a.weight", "in_proj_b.weight", "dt_bias"):
        t = _regroup(t, 0, nk, nv, 1, to_tiled=to_gguf)
    elif name == "A_log":
        t = (
            -np.exp(_regroup(t, 0, nk, nv, 1, to_tiled=True))
            if to_gguf
            else _regroup(np.log(-t), 0, nk, nv, 1, to_tiled=False)
        )
    elif name == "out_proj.weight":
        t = _regroup(t, 1, nk, nv, dv, to_tiled=to_gguf)
    if name == "conv1d.weight" and not to_gguf:
        t = t[:, None, :]
    return t.astype(np.float32, copy=False)


def gdn_config(f: Any, cfg: dict[str, Any]) -> None:
    """Adds the GDN and layer-pattern fields of ``f``'s metadata to ``cfg`` (shared with qwen3next)."""
    nv = f.arch_int("ssm.time_step_rank")
    inner = f.arch_int("ssm.inner_size")
    if inner % nv:
        raise_config(f, f"{f.arch}.ssm.inner_size", f"is not a multiple of ssm.time_step_rank={nv}")
    cfg.update(
        linear_num_key_heads=f.arch_int("ssm.group_count"),
        linear_num_value_heads=nv,
        linear_key_head_dim=f.arch_int("ssm.state_size"),
        linear_value_head_dim=inner // nv,
        linear_conv_kernel_dim=f.arch_int("ssm.conv_kernel"),
    )
    nextn = nextn_layers(f)  # MTP blocks after the trunk count in block_count (models/gguf/nextn.py)
    if nextn:
        if not 0 < nextn < cfg["num_hidden_layers"]:
            raise_config(f, f"{f.arch}.nextn_predict_layers", f"does not fit block_count={cfg['num_hidden_layers']}")
        cfg["num_hidden_layers"] -= nextn
        cfg["mtp_num_hidden_layers"] = nextn
    n = cfg["num_hidden_layers"]
    recurrent = f.get(f"{f.arch}.attention.recurrent_layers")
    if recurrent is None:
        interval = f.arch_int("full_attention_interval", 4)
        recurrent = [(i + 1) % interval != 0 for i in range(n)]
    elif nextn and len(recurrent) == n + nextn:
        recurrent = recurrent[:n]
    if len(recurrent) != n:
        raise_config(f, f"{f.arch}.attention.recurrent_layers", f"has {len(recurrent)} entries for {n} layers")
    cfg["layer_types"] = ["linear_attention" if r else "full_attention" for r in recurrent]
    rotary = f.arch_int("rope.dimension_count", cfg["head_dim"])
    cfg["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": f.arch_float("rope.freq_base", 10000.0),
        "partial_rotary_factor": rotary / cfg["head_dim"],
    }


def gdn_metadata(arch: str, cfg: dict[str, Any]) -> Meta:
    """The converter's ``Qwen3NextModel.set_gguf_parameters`` keys beyond the common ones."""
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"config.json: rope_type={rope.get('rope_type')!r}: only default RoPE is written to GGUF")
    nk, nv, dk, dv = gdn_dims(cfg)
    meta: Meta = [
        (f"{arch}.ssm.conv_kernel", int(cfg["linear_conv_kernel_dim"]), U32),
        (f"{arch}.ssm.state_size", dk, U32),
        (f"{arch}.ssm.group_count", nk, U32),
        (f"{arch}.ssm.time_step_rank", nv, U32),
        (f"{arch}.ssm.inner_size", dv * nv, U32),
    ]
    if cfg.get("layer_types") is not None:
        if len(cfg["layer_types"]) != cfg["num_hidden_layers"]:
            raise ConfigError("config.json: layer_types and num_hidden_layers disagree")
        meta.append((f"{arch}.attention.recurrent_layers", [t == "linear_attention" for t in cfg["layer_types"]], ARR))
    meta.append((f"{arch}.full_attention_interval", int(cfg.get("full_attention_interval", 4)), U32))
    rotary = int(head_dim_of(cfg) * rope.get("partial_rotary_factor", 0.25))
    meta.append((f"{arch}.rope.dimension_count", rotary, U32))
    return meta


def _hf_config(f: Any) -> dict[str, Any]:
    cfg = common_config(f, "qwen3_5_text", ["Qwen3_5ForCausalLM"])
    gdn_config(f, cfg)
    return cfg


def _layout(key: str, t: np.ndarray, cfg: dict[str, Any], to_gguf: bool) -> np.ndarray:
    return gdn_layout(key, t, cfg, to_gguf=to_gguf)


def _gguf_metadata(model: ModelConfig, cfg: dict[str, Any]) -> Meta:
    meta = common_metadata(ARCH, model, rope_theta=written_rope_theta(cfg), key_length=written_head_dim(model, cfg))
    sections = list((cfg.get("rope_parameters") or {}).get("mrope_section") or MROPE_DEFAULT)
    return meta + gdn_metadata(ARCH, cfg) + [(f"{ARCH}.rope.dimension_sections", (sections + [0] * 4)[:4], ARR)]


# text-only checkpoints: a ``Qwen3_5ForConditionalGeneration`` directory (nested ``text_config``,
# vision tower) is not written
QWEN35 = table_family(ARCH, ("Qwen3_5ForCausalLM",), _hf_config, _gguf_metadata, table=TABLE, layout=_layout)
to_gguf, from_gguf = QWEN35.to_gguf, QWEN35.from_gguf
