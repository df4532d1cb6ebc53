"""Parse the Mamba2 hybrids with scalar multipliers (Granite-4.0-H, Falcon-H1) from ``config.json``.

Same rules as :mod:`radixflow_jax.models.hf_config`: every value the math depends on is read
explicitly, defaults are the ones ``transformers`` applies when a key is absent, and what we do not
implement raises :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from radixflow_jax.models.config import (
    AttentionConfig,
    CheckpointNames,
    ConfigError,
    MambaConfig,
    ModelConfig,
    MoeConfig,
    Multipliers,
    RopeConfig,
)
from radixflow_jax.models.hf_fields import (
    check_act,
    dt_limit,
    eos_ids,
    number,
    numbers,
    positive,
    read_mamba,
    read_rope,
)

# the checkpoint names of the model's fixed attributes (``config.CheckpointNames``)
GRANITE_NAMES = CheckpointNames(layer=(("mlp", "shared_mlp"),))
FALCON_H1_NAMES = CheckpointNames(
    top=(("norm", "final_layernorm"),),
    layer=(("mlp", "feed_forward"), ("post_attention_layernorm", "pre_ff_layernorm")),
)
_MAMBA_KEYS = dict(
    heads="mamba_n_heads", head_dim="mamba_d_head", state="mamba_d_state", groups="mamba_n_groups",
    conv="mamba_d_conv", conv_bias="mamba_conv_bias", proj_bias="mamba_proj_bias", chunk="mamba_chunk_size",
)
_GRANITE_TYPES = {
    "mamba": "mamba",
    "linear_attention": "mamba",
    "attention": "attention",
    "full_attention": "attention",
}


def _mamba_dims(cfg: dict[str, Any], inner: int) -> dict[str, Any]:
    """``cfg`` with ``mamba_d_head='auto'`` resolved as transformers does (``inner // heads``)."""
    if cfg.get("mamba_d_head", "auto") == "auto":
        return {**cfg, "mamba_d_head": inner // positive(cfg, "mamba_n_heads")}
    return cfg


def _checked_mamba(cfg: dict[str, Any], inner: int, inner_field: str, eps: float) -> MambaConfig:
    cfg = _mamba_dims(cfg, inner)
    limit = dt_limit(cfg.get("time_step_limit", [0.0, math.inf]), "time_step_limit")
    mamba = read_mamba(cfg, _MAMBA_KEYS, limit, eps)
    if mamba.inner_dim != inner:
        raise ConfigError(
            f"config.json: mamba_n_heads * mamba_d_head = {mamba.inner_dim} but {inner_field} = {inner}"
        )
    return mamba


def _plain_rope(cfg: dict[str, Any], head_dim: int) -> RopeConfig:
    """RoPE over the whole head: both references ignore ``partial_rotary_factor``, so refuse it."""
    params = cfg.get("rope_parameters") or {}
    factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if factor not in (None, 1, 1.0):
        raise ConfigError(f"config.json: partial_rotary_factor={factor!r} is not supported for {cfg['model_type']}")
    return read_rope({k: v for k, v in cfg.items() if k != "partial_rotary_factor"}, head_dim)


def _attention(cfg: dict[str, Any], kv_default: int | None, *, rope: bool, scale: float | None) -> AttentionConfig:
    heads = positive(cfg, "num_attention_heads")
    head_dim = cfg.get("head_dim") or positive(cfg, "hidden_size") // heads
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0:
        raise ConfigError(f"config.json: field 'head_dim' must be a positive int, got {head_dim!r}")
    kv = cfg.get("num_key_value_heads", kv_default)
    return AttentionConfig(
        num_heads=heads,
        num_kv_heads=positive({"num_key_value_heads": heads if kv is None else kv}, "num_key_value_heads"),
        head_dim=head_dim,
        qk_norm="none",
        output_gate=False,
        bias=bool(cfg.get("attention_bias", False)),
        rope=_plain_rope(cfg, head_dim) if rope else None,
        scale=scale,
    )


def _common(cfg: dict[str, Any], n: int, hidden: int, eps: float) -> dict[str, Any]:
    return dict(
        model_type=cfg["model_type"],
        vocab_size=positive(cfg, "vocab_size"),
        hidden_size=hidden,
        num_layers=n,
        rms_norm_eps=eps,
        norm_style="llama",
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=positive(cfg, "max_position_embeddings", 8192),
        gdn=None,
        eos_token_ids=eos_ids(cfg),
        bos_token_id=cfg.get("bos_token_id"),
    )


def _granite_layers(cfg: dict[str, Any], n: int) -> tuple[str, ...]:
    key = "layer_types" if cfg.get("layer_types") is not None else "layers_block_type"
    types = cfg.get(key)
    if types is None:
        return ("mamba",) * n  # transformers' default: every layer is Mamba2
    if not isinstance(types, list) or len(types) != n:
        raise ConfigError(f"config.json: {key} must list num_hidden_layers={n} entries, got {types!r}")
    for i, t in enumerate(types):
        if t not in _GRANITE_TYPES:
            raise ConfigError(f"config.json: {key}[{i}]={t!r} is not supported (mamba, attention)")
    return tuple(_GRANITE_TYPES[t] for t in types)


def parse_granite(cfg: dict[str, Any]) -> ModelConfig:
    """``granitemoehybrid`` (Granite-4.0-H): Mamba2/attention layers, shared GLU (+ routed experts)."""
    check_act(cfg)
    n = positive(cfg, "num_hidden_layers")
    hidden = positive(cfg, "hidden_size")
    mixers = _granite_layers(cfg, n)
    eps = float(cfg.get("rms_norm_eps", 1e-6))
    position = cfg.get("position_embedding_type")
    if position not in (None, "nope", "rope"):
        raise ConfigError(f"config.json: position_embedding_type={position!r} is not supported (nope, rope)")
    experts = cfg.get("num_local_experts", 8)
    if not isinstance(experts, int) or isinstance(experts, bool) or experts < 0:
        raise ConfigError(f"config.json: field 'num_local_experts' must be an int >= 0, got {experts!r}")
    moe = None
    if experts:
        top_k = positive(cfg, "num_experts_per_tok", 2)
        if top_k > experts:
            raise ConfigError(f"config.json: num_experts_per_tok={top_k} exceeds num_local_experts={experts}")
        moe = MoeConfig(
            num_experts=experts,
            top_k=top_k,
            intermediate_size=positive(cfg, "intermediate_size"),
            norm_topk=True,
            shared_intermediate_size=0,
        )
    attention = None
    if "attention" in mixers:
        scale = number(cfg, "attention_multiplier", nonzero=True)
        attention = _attention(cfg, None, rope=position == "rope", scale=scale)
    mamba = None
    if "mamba" in mixers:
        inner = int(number(cfg, "mamba_expand", 2.0) * hidden)
        mamba = _checked_mamba(cfg, inner, "mamba_expand * hidden_size", eps)
    mult = Multipliers(
        embedding=number(cfg, "embedding_multiplier"),
        residual=number(cfg, "residual_multiplier"),
        logits_scaling=number(cfg, "logits_scaling", nonzero=True),
    )
    return ModelConfig(
        **_common(cfg, n, hidden, eps),
        mixers=mixers,  # type: ignore[arg-type]
        mlps=("glu_moe" if moe else "glu",) * n,  # type: ignore[arg-type]
        intermediate_size=positive(cfg, "shared_intermediate_size", 1024),
        attention=attention,
        moe=moe,
        mamba=mamba,
        checkpoint_names=GRANITE_NAMES,
        multipliers=mult,
    )


def parse_falcon_h1(cfg: dict[str, Any]) -> ModelConfig:
    """``falcon_h1``: attention and Mamba2 in parallel in every layer, muP multipliers."""
    check_act(cfg)
    if cfg.get("mlp_bias"):
        raise ConfigError("config.json: mlp_bias=true is not supported")
    n = positive(cfg, "num_hidden_layers")
    hidden = positive(cfg, "hidden_size")
    eps = float(cfg.get("rms_norm_eps", 1e-5))
    if "mamba_d_ssm" not in cfg:  # transformers' default
        inner, field = 1024, "mamba_d_ssm (default)"
    elif cfg["mamba_d_ssm"] is None:
        inner, field = int(number(cfg, "mamba_expand", 2.0) * hidden), "mamba_expand * hidden_size"
    else:
        inner, field = positive(cfg, "mamba_d_ssm"), "mamba_d_ssm"
    mamba = _checked_mamba(cfg, inner, field, eps)
    if cfg.get("mamba_rms_norm", False):
        norm = "norm_first" if cfg.get("mamba_norm_before_gate", True) else "gate_first"
    else:
        norm = "none"
    mamba = dataclasses.replace(mamba, gated_norm=norm, out_proj_bias=bool(cfg.get("projectors_bias", False)))
    mlp_gate, mlp_down = numbers(cfg, "mlp_multipliers", 2)
    mult = Multipliers(
        embedding=number(cfg, "embedding_multiplier"),
        lm_head=number(cfg, "lm_head_multiplier"),
        attention_in=number(cfg, "attention_in_multiplier"),
        attention_out=number(cfg, "attention_out_multiplier"),
        key=number(cfg, "key_multiplier"),
        ssm_in=number(cfg, "ssm_in_multiplier"),
        ssm_out=number(cfg, "ssm_out_multiplier"),
        ssm=numbers(cfg, "ssm_multipliers", 5),  # type: ignore[arg-type]
        mlp_gate=mlp_gate,
        mlp_down=mlp_down,
    )
    return ModelConfig(
        **_common(cfg, n, hidden, eps),
        mixers=("parallel",) * n,
        mlps=("dense",) * n,
        intermediate_size=positive(cfg, "intermediate_size"),
        attention=_attention(cfg, 8, rope=True, scale=None),
        moe=None,
        mamba=mamba,
        checkpoint_names=FALCON_H1_NAMES,
        multipliers=mult,
    )
