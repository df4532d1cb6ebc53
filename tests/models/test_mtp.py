"""MTP layers (``models/mtp.py``): teacher-forced guesses against transformers' own modules, the
GGUF nextn blocks (written as llama.cpp's converter writes them, read back), and loading errors.

transformers skips ``mtp.*`` on load, so the oracle assembles the head from its parts: the trunk's
final hidden states (``model.model``), the family's own RMSNorm class for the two input norms, the
``fc`` projection of their concatenation (a matmul, by hand), a one-layer text model of the same
family built from the MTP layer's weights (its final norm is ``mtp.norm``) and the trunk's head.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from radixflow_jax.models import api
from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.gguf import GgufFile
from radixflow_jax.models.safetensors_io import SafetensorsDir, WeightsError
from tests.models import gguf_oracle

PRESETS = ["tiny-qwen3.5", "tiny-qwen3-next"]
TEXT = "The student read the passage twice. Which option is the main idea of the passage?"


def _hf_mtp_logits(directory: str, ids: list[int]) -> np.ndarray:
    import torch
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    tensors = SafetensorsDir(directory)

    def weight(key: str) -> torch.Tensor:
        return torch.tensor(np.asarray(tensors[key]))

    layer_cfg = copy.deepcopy(model.config)
    layer_cfg.num_hidden_layers = 1
    layer_cfg.layer_types = ["full_attention"]
    one = type(model.model)(layer_cfg).eval()
    state = {k[len("mtp.") :]: weight(k) for k in tensors if k.startswith("mtp.layers.") or k == "mtp.norm.weight"}
    _fuse_experts(state)
    missing, unexpected = one.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) == {"embed_tokens.weight"}, (missing, unexpected)
    norm_cls, hidden, eps = type(model.model.norm), model.config.hidden_size, model.config.rms_norm_eps
    enorm, hnorm = norm_cls(hidden, eps=eps), norm_cls(hidden, eps=eps)
    enorm.weight.data = weight("mtp.pre_fc_norm_embedding.weight")
    hnorm.weight.data = weight("mtp.pre_fc_norm_hidden.weight")
    with torch.no_grad():
        tokens = torch.tensor([ids])
        trunk = model.model(tokens).last_hidden_state[0]  # after the final norm
        x = torch.cat([enorm(model.model.embed_tokens(tokens[0, 1:])), hnorm(trunk[:-1])], dim=-1)
        x = x @ weight("mtp.fc.weight").T
        out = one(inputs_embeds=x[None]).last_hidden_state[0]
        return model.lm_head(out).float().numpy()


def _fuse_experts(state: dict) -> None:
    """Per-expert ``mlp.experts.{e}.*_proj.weight`` -> transformers' fused ``gate_up_proj``
    ``[E, 2I, H]`` and ``down_proj`` ``[E, H, I]`` (Qwen3-Next's MoE MTP layer)."""
    import torch

    base = "layers.0.mlp.experts"
    count = sum(1 for k in state if k.startswith(base) and k.endswith(".gate_proj.weight"))
    if count == 0:
        return
    parts = {w: [state.pop(f"{base}.{e}.{w}.weight") for e in range(count)] for w in ("gate_proj", "up_proj", "down_proj")}
    state[f"{base}.gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u in zip(parts["gate_proj"], parts["up_proj"])])
    state[f"{base}.down_proj"] = torch.stack(parts["down_proj"])


@pytest.mark.parametrize("preset", PRESETS)
def test_mtp_guesses_match_transformers_modules(preset: str, tiny_model) -> None:
    model = api.load(preset, mtp=True)
    ids = model.encode(TEXT)
    ours = model.mtp_logits(ids)
    ref = _hf_mtp_logits(model.model_dir, ids)
    assert ours.shape == ref.shape == (len(ids) - 1, model.config.vocab_size)
    scale = max(1.0, float(np.abs(ref).max()))
    assert float(np.abs(ours - ref).max()) / scale < 1e-4
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
    # the trunk is the same with or without the head
    np.testing.assert_array_equal(model.logits(ids), tiny_model(preset).logits(ids))


@pytest.mark.parametrize("preset", PRESETS)
def test_gguf_nextn_blocks_round_trip(preset: str, tmp_path) -> None:
    path = gguf_oracle.convert(preset, "f32", tmp_path)
    f = GgufFile(path)
    arch = f.arch
    assert f.get(f"{arch}.nextn_predict_layers") == 1
    assert f.get(f"{arch}.block_count") == 9  # 8 trunk blocks, then the MTP block
    assert "blk.8.nextn.eh_proj.weight" in f.tensors and "blk.8.attn_norm.weight" in f.tensors
    trunk_only = api.load(path)
    assert trunk_only.config.num_layers == 8 and trunk_only.config.mtp_layers == 0
    with_head = api.load(path, mtp=True)
    source = api.load(preset, mtp=True)
    ids = source.encode(TEXT)
    got, want = with_head.mtp_logits(ids), source.mtp_logits(ids)  # stored norms w + 1: float32 rounding
    assert float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max())) < 1e-4


def test_loading_mtp_where_there_is_none_is_refused() -> None:
    with pytest.raises(WeightsError, match="no MTP layers"):
        api.load("tiny-bamba", mtp=True)
    with pytest.raises(WeightsError, match="no MTP layers"):
        api.load("tiny-qwen3", mtp=True)
    plain = api.load("tiny-qwen3.5")
    assert plain.config.mtp_layers == 0 and plain.module.mtp is None
    with pytest.raises(ValueError, match="without MTP layers"):
        plain.mtp_logits([1, 2, 3])


def test_a_family_without_mtp_layers_is_named() -> None:
    import dataclasses

    from radixflow_jax.models.mtp import mtp_layer_config

    cfg = api.load("tiny-bamba").config
    with pytest.raises(ConfigError, match="bamba"):
        mtp_layer_config(dataclasses.replace(cfg, mtp_layers=1))
