"""Parse a HF ``config.json`` dict into a :class:`ModelConfig`: the entry point for every family.

The GDN hybrids and the dense controls are parsed here; the Mamba2 families live in
``hf_config_ssm`` / ``hf_config_mup``; all of them read fields through ``hf_fields``. GGUF metadata
reaches this parser as the equivalent ``config.json`` dict (``models/gguf/``).

Every value the model math depends on is read explicitly; a missing required field, a value out of
range, or a feature we do not implement raises :class:`ConfigError` naming the field. Nothing is
silently ignored except fields that do not change inference (dropout, init ranges, ...).
"""

from __future__ import annotations

from typing import Any, Callable

from radixflow_jax.models import hf_config_mup, hf_config_ssm
from radixflow_jax.models.config import ConfigError, GdnConfig, ModelConfig, MoeConfig
from radixflow_jax.models.hf_fields import check_act, eos_ids, positive, read_attention

_GDN_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
_DENSE_TYPES = ("qwen3", "llama")


def supported_model_types() -> tuple[str, ...]:
    ssm = ("bamba", "nemotron_h", "granitemoehybrid", "falcon_h1")
    return _GDN_TYPES + ("qwen3_5", "qwen3_5_moe") + ssm + _DENSE_TYPES


def _layer_types(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    types = cfg.get("layer_types")
    if types is None:
        interval = cfg.get("full_attention_interval", 4)
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    if len(types) != n:
        raise ConfigError(f"config.json: layer_types has {len(types)} entries, num_hidden_layers={n}")
    mapping = {"linear_attention": "gdn", "full_attention": "attention"}
    for i, t in enumerate(types):
        if t not in mapping:
            raise ConfigError(f"config.json: layer_types[{i}]={t!r} is not supported (linear_attention, full_attention)")
    return tuple(mapping[t] for t in types)


def _moe(cfg: dict[str, Any], shared_default: int = 0) -> MoeConfig:
    num = positive(cfg, "num_experts")
    top_k = positive(cfg, "num_experts_per_tok")
    if top_k > num:
        raise ConfigError(f"config.json: num_experts_per_tok={top_k} exceeds num_experts={num}")
    shared = cfg.get("shared_expert_intermediate_size", shared_default) or 0
    return MoeConfig(
        num_experts=num,
        top_k=top_k,
        intermediate_size=positive(cfg, "moe_intermediate_size"),
        norm_topk=bool(cfg.get("norm_topk_prob", True)),
        shared_intermediate_size=int(shared),
    )


def _common(cfg: dict[str, Any]) -> dict[str, Any]:
    check_act(cfg)
    return dict(
        model_type=cfg["model_type"],
        vocab_size=positive(cfg, "vocab_size"),
        hidden_size=positive(cfg, "hidden_size"),
        num_layers=positive(cfg, "num_hidden_layers"),
        intermediate_size=positive(cfg, "intermediate_size"),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=positive(cfg, "max_position_embeddings", 8192),
        eos_token_ids=eos_ids(cfg),
        bos_token_id=cfg.get("bos_token_id"),
    )


def _parse_gdn_family(cfg: dict[str, Any]) -> ModelConfig:
    common = _common(cfg)
    n = common["num_layers"]
    mixers = _layer_types(cfg, n)
    mtype = cfg["model_type"]
    if mtype == "qwen3_next":
        num_experts = cfg.get("num_experts", 0) or 0
        sparse_step = cfg.get("decoder_sparse_step", 1) or 1
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        mlps = tuple(
            "moe" if num_experts > 0 and i not in mlp_only and (i + 1) % sparse_step == 0 else "dense"
            for i in range(n)
        )
        moe = _moe(cfg) if "moe" in mlps else None
    elif mtype == "qwen3_5_moe_text":
        mlps = ("moe",) * n
        moe = _moe({**cfg, "norm_topk_prob": True})
    else:
        mlps = ("dense",) * n
        moe = None
    gdn = GdnConfig(
        num_k_heads=positive(cfg, "linear_num_key_heads"),
        num_v_heads=positive(cfg, "linear_num_value_heads"),
        head_k_dim=positive(cfg, "linear_key_head_dim"),
        head_v_dim=positive(cfg, "linear_value_head_dim"),
        conv_kernel=positive(cfg, "linear_conv_kernel_dim", 4),
        packed=mtype == "qwen3_next",
    )
    if "attention" not in mixers:
        raise ConfigError("config.json: layer_types has no full_attention layer")
    return ModelConfig(
        **common,
        mixers=mixers,
        mlps=mlps,  # type: ignore[arg-type]
        norm_style="zero_centered",
        attention=read_attention(cfg, "rms_zc", output_gate=True),
        gdn=gdn if "gdn" in mixers else None,
        moe=moe,
    )


def _parse_dense(cfg: dict[str, Any]) -> ModelConfig:
    common = _common(cfg)
    n = common["num_layers"]
    if cfg["model_type"] == "llama":
        if cfg.get("mlp_bias"):
            raise ConfigError("config.json: mlp_bias=true is not supported")
        if (cfg.get("pretraining_tp") or 1) != 1:
            raise ConfigError("config.json: pretraining_tp != 1 is not supported")
    return ModelConfig(
        **common,
        mixers=("attention",) * n,
        mlps=("dense",) * n,
        norm_style="llama",
        attention=read_attention(cfg, "rms" if cfg["model_type"] == "qwen3" else "none", output_gate=False),
        gdn=None,
        moe=None,
    )


def _composite(cfg: dict[str, Any]) -> ModelConfig:
    """Qwen3.5 vision-language checkpoints: serve the text part (``text_config``)."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise ConfigError(f"config.json: model_type={cfg['model_type']!r} needs a 'text_config' object")
    text = dict(text)
    text.setdefault("model_type", cfg["model_type"] + "_text")
    for key in ("tie_word_embeddings", "eos_token_id", "bos_token_id"):
        if key not in text and key in cfg:
            text[key] = cfg[key]
    parsed = parse_hf_config(text)
    import dataclasses

    names = dataclasses.replace(parsed.checkpoint_names, prefix="model.language_model.")
    return dataclasses.replace(parsed, checkpoint_names=names)


_PARSERS: dict[str, Callable[[dict[str, Any]], ModelConfig]] = {
    **{t: _parse_gdn_family for t in _GDN_TYPES},
    **{t: _parse_dense for t in _DENSE_TYPES},
    "qwen3_5": _composite,
    "qwen3_5_moe": _composite,
}


def parse_hf_config(cfg: dict[str, Any]) -> ModelConfig:
    """Builds a :class:`ModelConfig` from a parsed ``config.json``; raises :class:`ConfigError`."""
    mtype = cfg.get("model_type")
    if mtype is None:
        raise ConfigError("config.json: required field 'model_type' is missing")
    parser = {
        **_PARSERS,
        "bamba": hf_config_ssm.parse_bamba,
        "nemotron_h": hf_config_ssm.parse_nemotron_h,
        "granitemoehybrid": hf_config_mup.parse_granite,
        "falcon_h1": hf_config_mup.parse_falcon_h1,
    }.get(mtype)
    if parser is None:
        raise ConfigError(
            f"config.json: model_type={mtype!r} is not supported; supported: {', '.join(supported_model_types())}"
        )
    return parser(cfg)
