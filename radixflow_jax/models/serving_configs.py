"""HF ``config.json`` dicts of serving-size hybrids, for work that needs a model's shapes but not its
weights: the abstract export of the step (``runner/export.py``) and memory plans
(``sim/memory_plan.py``). They go through the one parser (``parse_hf_config``) like a real
checkpoint's config.

The dimensions are the ones ``sim/specs.py`` costs (hidden size, layers, heads, MLP width,
vocabulary: the published Qwen3.5 and Nemotron-H configurations). Two simplifications, stated so a
figure built on them is not read as more exact than it is: every model here keeps a separate output
head (``tie_word_embeddings`` false), and ``nemotron-h-8b``'s layer pattern has the 8B's counts
(24 Mamba2, 4 attention and 24 MLP layers) in a regular order, not the checkpoint's exact order.
Neither changes a step's kernels or a pool's size; the first adds one embedding matrix of weights.
"""

from __future__ import annotations

from typing import Any

from radixflow_jax.models.config import ConfigError, ModelConfig
from radixflow_jax.models.hf_config import parse_hf_config


def _qwen35(hidden: int, layers: int, heads: int, kv_heads: int, value_heads: int, mlp: int) -> dict[str, Any]:
    return {
        "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"], "vocab_size": 248320,
        "hidden_size": hidden, "intermediate_size": mlp, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": 256,
        "linear_num_key_heads": 16, "linear_num_value_heads": value_heads, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
    }  # fmt: skip


SERVING_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3.5-4b": _qwen35(2560, 32, 16, 4, 32, 9216),
    "qwen3.5-9b": _qwen35(4096, 32, 16, 4, 32, 12288),
    "qwen3.5-27b": _qwen35(5120, 64, 24, 4, 48, 17408),
    "nemotron-h-8b": {
        "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "vocab_size": 131072,
        "hidden_size": 4096, "intermediate_size": 21504, "hybrid_override_pattern": ("M-" * 6 + "*") * 4,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "mamba_num_heads": 128,
        "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4, "chunk_size": 128,
        "use_conv_bias": True, "mlp_hidden_act": "relu2", "layer_norm_epsilon": 1e-5,
        "max_position_embeddings": 8192, "tie_word_embeddings": False,
    },  # fmt: skip
}


def serving_config(name: str) -> ModelConfig:
    """The parsed config of serving shape ``name``; an unknown name raises ``ConfigError`` listing them."""
    if name not in SERVING_CONFIGS:
        raise ConfigError(f"no serving shape {name!r}; known: {', '.join(SERVING_CONFIGS)}")
    return parse_hf_config(SERVING_CONFIGS[name])
