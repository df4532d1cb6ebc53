"""Tiny random HF models saved with ``save_pretrained``: the oracle for model-math tests."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import torch
import transformers as tf

GDN_COMMON: dict[str, Any] = dict(
    vocab_size=160,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    intermediate_size=96,
    max_position_embeddings=4096,
)
MOE: dict[str, Any] = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
PATTERN = ["linear_attention", "linear_attention", "full_attention", "linear_attention", "full_attention"]


def _moe_text():
    from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    return Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM


def make_case(name: str) -> tuple[Any, Any]:
    """``(config, model class)`` of one named tiny configuration."""
    layers4 = dict(num_hidden_layers=4)
    pattern = dict(num_hidden_layers=5, layer_types=PATTERN)
    cases: dict[str, Any] = {
        "qwen3_5_text": lambda: (tf.Qwen3_5TextConfig(**GDN_COMMON, **layers4), tf.Qwen3_5ForCausalLM),
        "qwen3_5_text_eqheads": lambda: (
            tf.Qwen3_5TextConfig(
                **{**GDN_COMMON, "linear_num_key_heads": 4, "linear_key_head_dim": 20, "linear_value_head_dim": 20,
                   "head_dim": 24, "num_key_value_heads": 1},
                **pattern,
            ),
            tf.Qwen3_5ForCausalLM,
        ),
        "qwen3_next_moe": lambda: (tf.Qwen3NextConfig(**GDN_COMMON, **MOE, **layers4), tf.Qwen3NextForCausalLM),
        "qwen3_next_dense": lambda: (
            tf.Qwen3NextConfig(**GDN_COMMON, **{**MOE, "num_experts": 4}, decoder_sparse_step=2, mlp_only_layers=[3],
                               **pattern),
            tf.Qwen3NextForCausalLM,
        ),
        "qwen3_5_moe_text": lambda: (_moe_text()[0](**GDN_COMMON, **MOE, **layers4), _moe_text()[1]),
        "qwen3_5_vl": lambda: (
            tf.Qwen3_5Config(
                text_config=dict(**GDN_COMMON, **layers4),
                vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                                   patch_size=4, temporal_patch_size=1, spatial_merge_size=1),
            ),
            tf.Qwen3_5ForConditionalGeneration,
        ),
        "qwen3": lambda: (
            tf.Qwen3Config(vocab_size=160, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=24, intermediate_size=96),
            tf.Qwen3ForCausalLM,
        ),
        "llama": lambda: (
            tf.LlamaConfig(vocab_size=160, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=96,
                           rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                             high_freq_factor=4.0, original_max_position_embeddings=64)),
            tf.LlamaForCausalLM,
        ),
    }
    return cases[name]()


def build(name: str, directory: str | None = None, seed: int = 0) -> tuple[str, torch.nn.Module]:
    """Builds the random HF model, perturbs its norm weights (so zero-centred norms are not trivial),
    saves it with ``save_pretrained`` and returns ``(directory, model)``.

    For Granite-4.0-H and Falcon-H1 the Mamba2 and attention parameters are also spread out
    (``in_proj``, ``out_proj``, ``q_proj``, ``k_proj`` scaled up; random ``conv1d``, ``dt_bias``,
    ``A_log``; small ``D``): with the default init the SSM branch is nearly ``D * x`` and attention
    nearly uniform, so the B, C, dt multipliers and the attention scale would hardly change the logits."""
    ssm = name.startswith(("bamba", "nemotron", "granite", "falcon"))
    config, cls = make_ssm_case(name) if ssm else make_case(name)
    torch.manual_seed(seed)
    model = cls(config).eval()
    spread = name.startswith(("granite", "falcon"))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.add_(0.1 * torch.randn_like(p))
            if spread:
                _spread(pname, p)
    directory = directory or tempfile.mkdtemp(prefix=f"hf-{name}-")
    model.save_pretrained(directory)
    assert os.path.exists(os.path.join(directory, "model.safetensors"))
    return directory, model


def _spread(pname: str, p: torch.Tensor) -> None:
    if pname.endswith(("mamba.in_proj.weight", "mamba.out_proj.weight", "q_proj.weight", "k_proj.weight")):
        p.mul_(6.0)
    elif pname.endswith("mamba.conv1d.weight"):
        p.copy_(0.3 * torch.randn_like(p))
    elif pname.endswith("dt_bias"):
        p.copy_(torch.empty_like(p).uniform_(-2.0, 1.0))
    elif pname.endswith("A_log"):
        p.copy_(torch.log(torch.empty_like(p).uniform_(0.2, 2.0)))
    elif pname.endswith("mamba.D"):
        p.copy_(0.2 * torch.randn_like(p))


def hf_logits(model: torch.nn.Module, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_states(model: torch.nn.Module, ids: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(conv_state [K-1, C], recurrent_state)`` per layer with a recurrent state after ``ids``
    (linear-attention / Mamba2 layers, and Falcon-H1's ``hybrid`` attention + Mamba2 layers)."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
    cache = out["cache"]
    states = []
    kinds = getattr(model.config, "layers_block_type", None) or model.config.layer_types
    for i, kind in enumerate(kinds):
        if kind in ("linear_attention", "mamba", "hybrid"):
            conv = cache.get_conv_state(i, state_idx=0)[0].float().numpy()  # [C, K]: the last K inputs
            ssm = cache.get_recurrent_state(i, state_idx=0)[0].float().numpy()
            states.append((conv[:, 1:].T, ssm))
    return states


def make_ssm_case(name: str) -> tuple[Any, Any]:
    """Mamba2-hybrid tiny configurations (chunk 16 so prompts cross several chunks)."""
    mamba = dict(vocab_size=160, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)
    cases: dict[str, Any] = {
        "bamba": lambda: (
            tf.BambaConfig(**mamba, num_hidden_layers=4, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16,
                           mamba_n_groups=2, mamba_d_state=8, mamba_chunk_size=16),
            tf.BambaForCausalLM,
        ),
        "bamba_g1": lambda: (
            tf.BambaConfig(**mamba, num_hidden_layers=3, attn_layer_indices=[2], mamba_n_heads=4, mamba_d_head=32,
                           mamba_n_groups=1, mamba_d_state=12, mamba_chunk_size=16),
            tf.BambaForCausalLM,
        ),
        "nemotron_h": lambda: (
            tf.NemotronHConfig(**mamba, hybrid_override_pattern="M*-M-", head_dim=16, mamba_num_heads=8,
                               mamba_head_dim=16, n_groups=2, ssm_state_size=8, chunk_size=16),
            tf.NemotronHForCausalLM,
        ),
        "nemotron_h_g1": lambda: (
            tf.NemotronHConfig(**mamba, hybrid_override_pattern="MM-*M", head_dim=24, mamba_num_heads=4,
                               mamba_head_dim=16, n_groups=1, ssm_state_size=16, chunk_size=16),
            tf.NemotronHForCausalLM,
        ),
        "granite_moe": lambda: (
            tf.GraniteMoeHybridConfig(**{**mamba, "intermediate_size": 32}, num_hidden_layers=4,
                                      layer_types=["mamba", "attention", "mamba", "mamba"], shared_intermediate_size=48,
                                      num_local_experts=4, num_experts_per_tok=2, position_embedding_type="rope",
                                      mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=8,
                                      mamba_chunk_size=16, **GRANITE_MULT),
            tf.GraniteMoeHybridForCausalLM,
        ),
        "granite_dense_g1": lambda: (
            tf.GraniteMoeHybridConfig(**mamba, num_hidden_layers=3, layer_types=["attention", "mamba", "mamba"],
                                      shared_intermediate_size=80, num_local_experts=0, position_embedding_type="nope",
                                      mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=12,
                                      mamba_chunk_size=16, embedding_multiplier=0.6, residual_multiplier=1.6,
                                      attention_multiplier=0.09, logits_scaling=0.55),
            tf.GraniteMoeHybridForCausalLM,
        ),
        # norm variants: none (mamba_rms_norm=False), norm before gate, gate before norm
        "falcon_h1": lambda: (
            tf.FalconH1Config(**mamba, num_hidden_layers=3, head_dim=24, mamba_d_ssm=96, mamba_n_heads=6,
                              mamba_d_head=16, mamba_n_groups=2, mamba_d_state=8, mamba_chunk_size=16,
                              mamba_rms_norm=False, projectors_bias=True, attention_bias=True, **FALCON_MULT),
            tf.FalconH1ForCausalLM,
        ),
        "falcon_h1_g1": lambda: (
            tf.FalconH1Config(**mamba, num_hidden_layers=2, mamba_d_ssm=None, mamba_n_heads=8, mamba_d_head=16,
                              mamba_n_groups=1, mamba_d_state=12, mamba_chunk_size=16, mamba_rms_norm=True,
                              mamba_norm_before_gate=True, mamba_proj_bias=True, **FALCON_MULT),
            tf.FalconH1ForCausalLM,
        ),
        "falcon_h1_gate_first": lambda: (
            tf.FalconH1Config(**mamba, num_hidden_layers=2, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16,
                              mamba_n_groups=2, mamba_d_state=8, mamba_chunk_size=16, mamba_rms_norm=True,
                              mamba_norm_before_gate=False, **FALCON_MULT),
            tf.FalconH1ForCausalLM,
        ),
    }
    return cases[name]()


# Multipliers away from 1.0 so that a missing or misplaced one fails the parity tests.
GRANITE_MULT: dict[str, Any] = dict(embedding_multiplier=2.5, residual_multiplier=0.6, attention_multiplier=0.3,
                                    logits_scaling=1.7)
FALCON_MULT: dict[str, Any] = dict(
    embedding_multiplier=1.8, lm_head_multiplier=0.6, attention_in_multiplier=1.3, attention_out_multiplier=0.8,
    key_multiplier=0.7, ssm_in_multiplier=1.2, ssm_out_multiplier=0.9, ssm_multipliers=[0.5, 1.5, 0.8, 1.25, 0.7],
    mlp_multipliers=[1.4, 0.6],
)
