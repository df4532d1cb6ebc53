"""Parse the Mamba2-hybrid family (Bamba, Nemotron-H) from ``config.json``.

Same rules as :mod:`radixflow_jax.models.hf_config`: every value the math depends on is read
explicitly; what we do not implement raises :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import math
from typing import Any

from radixflow_jax.models.config import AttentionConfig, CheckpointNames, ConfigError, ModelConfig
from radixflow_jax.models.hf_fields import (
    check_act,
    dt_limit,
    eos_ids,
    float_value,
    positive,
    read_attention,
    read_mamba,
    required,
)


def parse_bamba(cfg: dict[str, Any]) -> ModelConfig:
    check_act(cfg)
    n = positive(cfg, "num_hidden_layers")
    hidden = positive(cfg, "hidden_size")
    attn = set(cfg.get("attn_layer_indices") or [])
    if any(not 0 <= i < n for i in attn):
        raise ConfigError(f"config.json: attn_layer_indices {sorted(attn)} out of range for {n} layers")
    if (cfg.get("num_experts") or 1) != 1:
        raise ConfigError("config.json: num_experts != 1 is not supported for bamba")
    eps = float(cfg.get("rms_norm_eps", 1e-5))
    mamba = read_mamba(
        cfg,
        dict(heads="mamba_n_heads", head_dim="mamba_d_head", state="mamba_d_state", groups="mamba_n_groups",
             conv="mamba_d_conv", conv_bias="mamba_conv_bias", proj_bias="mamba_proj_bias", chunk="mamba_chunk_size"),
        dt_limit(cfg.get("time_step_limit", [0.0, math.inf]), "time_step_limit"),
        eps,
    )
    expand = cfg.get("mamba_expand", 2)
    if mamba.inner_dim != int(expand * hidden):
        raise ConfigError(
            f"config.json: mamba_n_heads * mamba_d_head = {mamba.inner_dim} but mamba_expand * hidden_size = "
            f"{int(expand * hidden)}"
        )
    mixers = tuple("attention" if i in attn else "mamba" for i in range(n))
    return ModelConfig(
        model_type="bamba",
        vocab_size=positive(cfg, "vocab_size"),
        hidden_size=hidden,
        num_layers=n,
        mixers=mixers,  # type: ignore[arg-type]
        mlps=("dense",) * n,
        intermediate_size=positive(cfg, "intermediate_size"),
        rms_norm_eps=eps,
        norm_style="llama",
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=positive(cfg, "max_position_embeddings", 8192),
        attention=read_attention(cfg, "none", output_gate=False) if attn else None,
        gdn=None,
        moe=None,
        mamba=mamba if "mamba" in mixers else None,
        checkpoint_names=BAMBA_NAMES,
        eos_token_ids=eos_ids(cfg),
        bos_token_id=cfg.get("bos_token_id"),
    )


# the checkpoint names of the model's fixed attributes (``config.CheckpointNames``)
BAMBA_NAMES = CheckpointNames(
    top=(("norm", "final_layernorm"),),
    layer=(("mlp", "feed_forward"), ("post_attention_layernorm", "pre_ff_layernorm")),
)
NEMOTRON_H_NAMES = CheckpointNames(top=(("embed_tokens", "embeddings"), ("norm", "norm_f")), prefix="backbone.")
_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


def _nemotron_layers(cfg: dict[str, Any]) -> list[str]:
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if types is None:
        pattern = required(cfg, "hybrid_override_pattern", str)
        bad = [c for c in pattern if c not in _PATTERN]
        if bad:
            raise ConfigError(f"config.json: hybrid_override_pattern has unknown symbol {bad[0]!r} (M, *, -, E)")
        types = [_PATTERN[c] for c in pattern]
    for i, t in enumerate(types):
        if t == "moe":
            raise ConfigError(f"config.json: layers_block_type[{i}]='moe': Nemotron-H MoE blocks are not supported yet")
        if t not in ("linear_attention", "full_attention", "mlp"):
            raise ConfigError(f"config.json: layers_block_type[{i}]={t!r} is not supported")
    return list(types)


def parse_nemotron_h(cfg: dict[str, Any]) -> ModelConfig:
    types = _nemotron_layers(cfg)
    n = len(types)
    if cfg.get("mlp_hidden_act", "relu2") != "relu2":
        raise ConfigError(f"config.json: mlp_hidden_act={cfg['mlp_hidden_act']!r} is not supported (only 'relu2')")
    if cfg.get("mlp_bias"):
        raise ConfigError("config.json: mlp_bias=true is not supported")
    if cfg.get("residual_in_fp32"):
        raise ConfigError("config.json: residual_in_fp32=true is not supported")
    eps = float(cfg.get("layer_norm_epsilon", 1e-5))
    # The reference mixer clamps dt below at time_step_min (time_step_limit is not used by it).
    dt_min = float_value(cfg.get("time_step_min", 0.001), "time_step_min")
    mamba = read_mamba(
        cfg,
        dict(heads="mamba_num_heads", head_dim="mamba_head_dim", state="ssm_state_size", groups="n_groups",
             conv="conv_kernel", conv_bias="use_conv_bias", proj_bias="use_bias", chunk="chunk_size",
             act="mamba_hidden_act"),
        (dt_min, math.inf),
        eps,
    )
    mixers = tuple({"linear_attention": "mamba", "full_attention": "attention", "mlp": "none"}[t] for t in types)
    has_attn = "attention" in mixers
    attention: AttentionConfig | None = None
    if has_attn:
        attention = AttentionConfig(
            num_heads=positive(cfg, "num_attention_heads"),
            num_kv_heads=positive(cfg, "num_key_value_heads", cfg.get("num_attention_heads")),
            head_dim=positive(cfg, "head_dim", positive(cfg, "hidden_size") // positive(cfg, "num_attention_heads")),
            qk_norm="none",
            output_gate=False,
            bias=bool(cfg.get("attention_bias", False)),
            rope=None,
        )
    return ModelConfig(
        model_type="nemotron_h",
        vocab_size=positive(cfg, "vocab_size"),
        hidden_size=positive(cfg, "hidden_size"),
        num_layers=n,
        mixers=mixers,  # type: ignore[arg-type]
        mlps=tuple("relu2" if t == "mlp" else "none" for t in types),  # type: ignore[arg-type]
        intermediate_size=positive(cfg, "intermediate_size"),
        rms_norm_eps=eps,
        norm_style="float32_weight",
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=positive(cfg, "max_position_embeddings", 8192),
        attention=attention,
        gdn=None,
        moe=None,
        mamba=mamba if "mamba" in mixers else None,
        checkpoint_names=NEMOTRON_H_NAMES,
        block_layout=True,
        eos_token_ids=eos_ids(cfg),
        bos_token_id=cfg.get("bos_token_id"),
    )
