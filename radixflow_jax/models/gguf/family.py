"""What a model family contributes to GGUF reading and writing, and the name tables they share.

A :class:`Family` is pure functions, one pair per direction:

* ``hf_config(f)``: the GGUF metadata -> the HF ``config.json`` dict (parsed by ``parse_hf_config``);
  ``gguf_metadata(model, cfg)``: the parsed :class:`ModelConfig` (and, for the few fields it does not
  hold, the HF config dict) -> the ``(key, value, kind)`` list llama.cpp's converter writes.
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

from radixflow_jax.models.config import MambaConfig, ModelConfig
from radixflow_jax.models.safetensors_io import WeightsError

U32, F32, STR, ARR = "u32", "f32", "str", "array"  # metadata kinds (``ARR``: list of bool/int/float/str)
Meta = list[tuple[str, Any, str]]
TensorPairs = list[tuple[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Family:
    arch: str  # general.architecture
    hf_architectures: tuple[str, ...]  # the HF ``architectures`` entries the converter maps to ``arch``
    hf_config: Callable[[Any], dict[str, Any]]
    gguf_metadata: Callable[[ModelConfig, dict[str, Any]], Meta]
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
# the dense MLP of the Mamba2 hybrids (``feed_forward.*``; its norm is named by the family)
FEED_FORWARD = {
    "feed_forward.gate_proj.weight": "ffn_gate.weight",
    "feed_forward.up_proj.weight": "ffn_up.weight",
    "feed_forward.down_proj.weight": "ffn_down.weight",
}
# attention without q/k norms (the Mamba2 hybrids)
PLAIN_ATTENTION = {k: v for k, v in ATTENTION.items() if "_norm." not in k or k.startswith("input_")}
# ``Mamba2Model``'s names of a ``mamba.*`` layer tensor
MAMBA2 = {
    "mamba.in_proj.weight": "ssm_in.weight",
    "mamba.conv1d.weight": "ssm_conv1d.weight",
    "mamba.conv1d.bias": "ssm_conv1d.bias",
    "mamba.dt_bias": "ssm_dt.bias",
    "mamba.A_log": "ssm_a",
    "mamba.D": "ssm_d",
    "mamba.norm.weight": "ssm_norm.weight",
    "mamba.out_proj.weight": "ssm_out.weight",
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


def feed_forward_table(ffn_norm: str) -> NameTable:
    """Bamba's and Falcon-H1's names (``GraniteHybridModel``'s layout with a dense ``feed_forward``
    MLP and ``final_layernorm``); ``ffn_norm``: the GGUF name of ``pre_ff_layernorm.weight``."""
    layer = {**MAMBA2, **PLAIN_ATTENTION, **FEED_FORWARD, "pre_ff_layernorm.weight": ffn_norm}
    top = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight"}
    return NameTable(layer, top={**top, "model.final_layernorm.weight": "output_norm.weight"})


def only(parts: Mapping[str, np.ndarray]) -> np.ndarray:
    """The single GGUF array a one-to-one HF tensor is made of."""
    if len(parts) != 1:
        raise WeightsError(f"expected one GGUF tensor, got {sorted(parts)}")
    return next(iter(parts.values()))


def common_metadata(
    arch: str,
    model: ModelConfig,
    *,
    rope_theta: float | None,
    key_length: int | None,
    head_count_kv: int | list[int] | None = None,
    feed_forward_length: int | list[int] | None = None,
    context_length: int | None = None,
    eps_key: str = "layer_norm_rms_epsilon",
) -> Meta:
    """The keys llama.cpp's base text model writes for every family (``TextModel.set_gguf_parameters``),
    from the parsed config. ``rope_theta`` / ``key_length``: written when not None (the converter
    writes them only when ``config.json`` has them: :func:`written_rope_theta`, :func:`written_head_dim`);
    the per-layer arrays and the other arguments: a family's own form of those keys."""
    att = model.attention
    assert att is not None
    kv: int | list[int] = att.num_kv_heads if head_count_kv is None else head_count_kv
    ff: int | list[int] = model.intermediate_size if feed_forward_length is None else feed_forward_length
    meta: Meta = [
        (f"{arch}.block_count", model.num_layers, U32),
        (f"{arch}.context_length", model.max_position_embeddings if context_length is None else context_length, U32),
        (f"{arch}.embedding_length", model.hidden_size, U32),
        (f"{arch}.feed_forward_length", ff, ARR if isinstance(ff, list) else U32),
        (f"{arch}.attention.head_count", att.num_heads, U32),
        (f"{arch}.attention.head_count_kv", kv, ARR if isinstance(kv, list) else U32),
    ]
    if rope_theta is not None:
        meta.append((f"{arch}.rope.freq_base", float(rope_theta), F32))
    meta.append((f"{arch}.attention.{eps_key}", float(model.rms_norm_eps), F32))
    if key_length is not None:
        meta += [(f"{arch}.attention.key_length", key_length, U32), (f"{arch}.attention.value_length", key_length, U32)]
    return meta


def ssm_metadata(arch: str, mamba: MambaConfig) -> Meta:
    """``Mamba2Model``'s ``ssm.*`` keys."""
    return [
        (f"{arch}.ssm.conv_kernel", mamba.conv_kernel, U32),
        (f"{arch}.ssm.state_size", mamba.state_size, U32),
        (f"{arch}.ssm.group_count", mamba.n_groups, U32),
        (f"{arch}.ssm.inner_size", mamba.inner_dim, U32),
        (f"{arch}.ssm.time_step_rank", mamba.num_heads, U32),
    ]


def layer_array(model: ModelConfig, value: int, *, mixer: str = "attention") -> list[int]:
    """A per-layer metadata array: ``value`` on the layers whose mixer is ``mixer``, 0 elsewhere."""
    return [value if m == mixer else 0 for m in model.mixers]


def written_rope_theta(cfg: dict[str, Any]) -> float | None:
    """``rope_theta`` when ``config.json`` has one (the converter writes ``rope.freq_base`` only then)."""
    return rope_theta(cfg) if "rope_theta" in (cfg.get("rope_parameters") or {}) or "rope_theta" in cfg else None


def written_head_dim(model: ModelConfig, cfg: dict[str, Any]) -> int | None:
    """The head width when ``config.json`` names ``head_dim`` (the converter writes ``key_length`` only then)."""
    return model.attention.head_dim if cfg.get("head_dim") is not None and model.attention is not None else None


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


Layout = Callable[[str, np.ndarray, dict[str, Any], bool], np.ndarray]
Split = Callable[[str, np.ndarray, dict[str, Any]], list[np.ndarray]]
Join = Callable[[str, list[np.ndarray], dict[str, Any]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class Splits:
    """HF layer tensors the converter stores as several GGUF tensors: ``names`` maps a layer suffix
    to its GGUF names (below ``blk.{i}.``), ``split(key, array, cfg)`` makes those arrays and
    ``join(key, arrays, cfg)`` undoes it exactly."""

    names: Mapping[str, tuple[str, ...]]
    split: Split
    join: Join


def table_family(
    arch: str,
    hf_architectures: tuple[str, ...],
    hf_config: Callable[[Any], dict[str, Any]],
    gguf_metadata: Callable[[ModelConfig, dict[str, Any]], Meta],
    *,
    table: NameTable,
    layout: Layout,
    splits: Splits | None = None,
    accepts: Callable[[Any], bool] = lambda f: True,
) -> Family:
    """A family whose HF tensors map to GGUF tensors by ``table`` (names) and ``layout(key, array,
    cfg, to_gguf)`` and its inverse (arrays, stored as float32), except the ``splits``."""
    hf_layer = re.compile(rf"^{re.escape(table.layers)}\.(\d+)\.(.+)$")
    split_names = splits.names if splits is not None else {}

    def split_of(key: str) -> tuple[str, tuple[str, ...]] | None:
        m = hf_layer.match(key)
        return (m[1], split_names[m[2]]) if m and m[2] in split_names else None

    def gguf_names(key: str, cfg: dict[str, Any]) -> tuple[str, ...]:
        found = split_of(key)
        return tuple(f"blk.{found[0]}.{n}" for n in found[1]) if found else (table.gguf(key),)

    def hf_key(name: str) -> str:
        m = _GGUF_LAYER.match(name)
        for key, names in split_names.items():
            if m and m[2] in names:
                return f"{table.layers}.{m[1]}.{key}"
        return table.hf(name)

    def to_gguf(key: str, array: np.ndarray, cfg: dict[str, Any]) -> TensorPairs:
        if splits is not None and split_of(key):
            return list(zip(gguf_names(key, cfg), splits.split(key, array, cfg)))
        return [(table.gguf(key), layout(key, array, cfg, True).astype(np.float32, copy=False))]

    def from_gguf(key: str, parts: Mapping[str, np.ndarray], cfg: dict[str, Any]) -> np.ndarray:
        if splits is not None and split_of(key):
            names = gguf_names(key, cfg)
            missing = [n for n in names if n not in parts]
            if missing:
                raise WeightsError(f"GGUF tensor '{missing[0]}' is missing (needed for '{key}')")
            return splits.join(key, [parts[n] for n in names], cfg)
        return layout(key, only(parts), cfg, False).astype(np.float32, copy=False)

    return Family(
        arch=arch,
        hf_architectures=hf_architectures,
        hf_config=hf_config,
        gguf_metadata=gguf_metadata,
        to_gguf=to_gguf,
        hf_key=hf_key,
        from_gguf=from_gguf,
        gguf_names=gguf_names,
        accepts=accepts,
    )


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
