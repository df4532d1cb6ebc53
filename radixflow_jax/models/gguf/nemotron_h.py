"""``nemotron_h``: Nemotron-H (Mamba2, attention and relu^2 MLP blocks, one mixer per block), HF
``nemotron_h`` (``backbone.*`` keys).

llama.cpp's converter handles it with its Granite-4.0-H class, so the stored forms are ``granite``'s:
the Mamba2 tensors (``granite.mamba_layout``), ``attn_q``/``attn_k`` rows permuted per head,
per-layer ``attention.head_count_kv`` and ``feed_forward_length`` arrays (the block pattern is read
from them: kv heads -> ``*``, a feed-forward width -> ``-``, neither -> ``M``), ``context_length =
2**20`` (no RoPE), the norm epsilon as ``attention.layer_norm_epsilon``. A block's one norm is
``attn_norm``; MLP blocks hold ``ffn_up``/``ffn_down``.

Not stored, so not read back: the Mamba2 chunk size and ``time_step_min`` (our defaults), the MLP
activation (relu^2, the only one llama.cpp's ``nemotron_h`` runs). MoE blocks (``nemotron_h_moe``)
are not mapped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from radixflow_jax.models.config import ConfigError, ModelConfig
from radixflow_jax.models.gguf.family import (
    MAMBA2,
    PLAIN_ATTENTION,
    U32,
    Meta,
    NameTable,
    common_metadata,
    layer_array,
    raise_config,
    ssm_metadata,
    table_family,
    written_head_dim,
)
from radixflow_jax.models.gguf.granite import NO_ROPE_CONTEXT, qk_mamba_layout

ARCH = "nemotron_h"
_LAYER = {
    "norm.weight": "attn_norm.weight",
    # a block's one mixer: the Mamba2 and attention names under ``mixer.``
    **{"mixer." + k.split(".", 1)[1]: v for k, v in {**MAMBA2, **PLAIN_ATTENTION}.items() if "_layernorm" not in k},
    "mixer.up_proj.weight": "ffn_up.weight",
    "mixer.down_proj.weight": "ffn_down.weight",
}
TABLE = NameTable(
    _LAYER,
    top={
        "backbone.embeddings.weight": "token_embd.weight",
        "lm_head.weight": "output.weight",
        "backbone.norm_f.weight": "output_norm.weight",
    },
    layers="backbone.layers",
)


def _layout(key: str, t: np.ndarray, cfg: dict[str, Any], to_gguf: bool) -> np.ndarray:
    """``granite.qk_mamba_layout`` under this family's one ``mixer.*`` name per block."""
    suffix = key.split(".", 3)[-1] if key.startswith("backbone.layers.") else key
    if suffix.startswith("mixer."):
        mixer = "self_attn." if suffix in ("mixer.q_proj.weight", "mixer.k_proj.weight") else "mamba."
        suffix = suffix.replace("mixer.", mixer, 1)
    return qk_mamba_layout(suffix, t, cfg, int(cfg.get("n_groups", 1)), to_gguf=to_gguf)


def _pattern(model: ModelConfig) -> str:
    """The block pattern (``M`` Mamba2, ``*`` attention, ``-`` MLP) of the parsed config."""
    symbols = {("mamba", "none"): "M", ("attention", "none"): "*", ("none", "relu2"): "-"}
    pattern = "".join(symbols.get(kinds, "?") for kinds in zip(model.mixers, model.mlps))
    if "?" in pattern:
        raise ConfigError(f"config.json: Nemotron-H blocks {pattern!r}: only M, * and - blocks are written")
    return pattern


def _hf_config(f: Any) -> dict[str, Any]:
    n = f.arch_int("block_count")
    kv, ff = f.get(f"{ARCH}.attention.head_count_kv"), f.get(f"{ARCH}.feed_forward_length")
    for key, value in ((f"{ARCH}.attention.head_count_kv", kv), (f"{ARCH}.feed_forward_length", ff)):
        if not isinstance(value, list) or len(value) != n:
            raise_config(f, key, f"must be a per-layer array of {n}")
    cfg = _common(f, kv, ff)
    heads, inner = f.arch_int("ssm.time_step_rank"), f.arch_int("ssm.inner_size")
    if inner % heads:
        raise_config(f, f"{ARCH}.ssm.inner_size", "is not a multiple of ssm.time_step_rank")
    cfg.update(
        hybrid_override_pattern="".join("*" if k else "-" if w else "M" for k, w in zip(kv, ff)),
        mamba_num_heads=heads,
        mamba_head_dim=inner // heads,
        n_groups=f.arch_int("ssm.group_count"),
        ssm_state_size=f.arch_int("ssm.state_size"),
        conv_kernel=f.arch_int("ssm.conv_kernel"),
        use_conv_bias=any(name.endswith(".ssm_conv1d.bias") for name in f.tensors),
        use_bias=False,
        mlp_hidden_act="relu2",
        layer_norm_epsilon=f.arch_float("attention.layer_norm_epsilon"),
    )
    return cfg


def _common(f: Any, kv: list[int], ff: list[int]) -> dict[str, Any]:
    """The fields ``common_config`` reads, from this architecture's per-layer arrays and keys."""
    heads = f.arch_int("attention.head_count")
    hidden = f.arch_int("embedding_length")
    tokens = f.get("tokenizer.ggml.tokens")
    return {
        "model_type": "nemotron_h",
        "architectures": ["NemotronHForCausalLM"],
        "vocab_size": f.get(f"{ARCH}.vocab_size", len(tokens) if tokens else None),
        "hidden_size": hidden,
        "intermediate_size": max(ff),
        "num_attention_heads": heads,
        "num_key_value_heads": max(kv) or heads,
        "head_dim": f.arch_int("attention.key_length", hidden // heads),
        "max_position_embeddings": f.arch_int("context_length", 8192),
        "tie_word_embeddings": "output.weight" not in f.tensors,
        "bos_token_id": f.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": f.get("tokenizer.ggml.eos_token_id"),
    }


def _gguf_metadata(model: ModelConfig, cfg: dict[str, Any]) -> Meta:
    if cfg.get("use_bias") or cfg.get("mlp_bias") or cfg.get("attention_bias"):
        raise ConfigError("config.json: use_bias/mlp_bias/attention_bias=true has no nemotron_h GGUF tensor")
    pattern = _pattern(model)
    att, mamba = model.attention, model.mamba
    assert att is not None and mamba is not None
    meta = common_metadata(
        ARCH,
        model,
        rope_theta=None,
        key_length=written_head_dim(model, cfg),
        head_count_kv=layer_array(model, att.num_kv_heads),
        feed_forward_length=[model.intermediate_size if c == "-" else 0 for c in pattern],
        context_length=NO_ROPE_CONTEXT,
        eps_key="layer_norm_epsilon",
    )
    meta += [
        (f"{ARCH}.vocab_size", model.vocab_size, U32),
        (f"{ARCH}.rope.dimension_count", model.hidden_size // att.num_heads, U32),
    ]
    return meta + ssm_metadata(ARCH, mamba) + [(f"{ARCH}.rope.scaling.finetuned", False, "bool")]


NEMOTRON_H = table_family(ARCH, ("NemotronHForCausalLM",), _hf_config, _gguf_metadata, table=TABLE, layout=_layout)
