"""The GGUF round trip of a tiny preset: HF dir -> our writer -> our loader -> logits against transformers'.

The HF directory is the preset's (the one ``transformers`` loads); the GGUF file is written by
``radixflow convert SRC OUT.gguf`` (our writer, laid out as llama.cpp's converter lays it out:
``benchmarks/gguf_layout_check.py`` compares the two). Tolerances, relative to the logit scale
(preset heads are scaled up, logits ~20-35) as in ``test_parity.py``:

* f32 (:func:`check_f32`): within 1e-4 of transformers on the HF directory.
* Q8_0 (:func:`check_q8_0`): within 1e-4 of transformers running the *dequantised* Q8_0 weights (the
  loader adds nothing to the quantisation error), and within :data:`Q8_BOUND` of transformers on
  the f32 weights with most greedy choices unchanged. That second bound is Q8_0's own error
  (transformers on the dequantised weights moves as much).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from radixflow_jax import cli
from radixflow_jax.models import api, gguf, presets
from radixflow_jax.models.config import Multipliers
from radixflow_jax.models.safetensors_io import save_file

TEXT = "The student read the passage. Which option is the main idea?"
# preset -> (max |Q8_0 - f32| / logit scale, share of unchanged greedy choices), the measured value
# after each; the random presets amplify small weight changes, the GDN ones most (on tiny-qwen3-next
# Q8_0 of the embedding alone moves the logits by 21 of 34)
Q8_BOUND = {
    "tiny-qwen3.5": (0.35, 0.9),  # 0.26, 0.95
    "tiny-qwen3": (0.05, 1.0),  # 0.017, 1.0
    "tiny-qwen3-next": (0.9, 0.6),  # 0.69, 0.75
    "tiny-granite-4.0-h": (0.03, 0.9),  # 0.0064, 1.0
    "tiny-falcon-h1": (0.03, 0.9),  # 0.008, 1.0
    "tiny-bamba": (0.15, 0.8),  # 0.058, 0.9
    "tiny-nemotron-h": (0.1, 0.8),  # 0.04, 0.9
}


def hf_logits(directory: str, ids: list[int]) -> np.ndarray:
    import torch
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def convert(preset: str, outtype: str, tmp_path) -> str:
    """``radixflow convert PRESET OUT.gguf --outtype OUTTYPE``; returns the file."""
    out = str(tmp_path / f"{preset}-{outtype}.gguf")
    assert cli.main(["convert", preset, out, "--outtype", outtype]) == 0
    return out


def _scale(ref: np.ndarray) -> float:
    return max(1.0, float(np.abs(ref).max()))


def _expected_config(preset: str, got: api.ModelConfig) -> api.ModelConfig:
    """The preset's config as a GGUF file can carry it (no Mamba2 chunk size is stored; a NoPE
    model's context is written as 2**20, as llama.cpp's converter does)."""
    expected = api.read_config(presets.materialize(preset))
    if expected.mamba is not None and got.mamba is not None:
        expected = dataclasses.replace(
            expected, mamba=dataclasses.replace(expected.mamba, chunk_size=got.mamba.chunk_size)
        )
    if preset in ("tiny-granite-4.0-h", "tiny-nemotron-h"):
        expected = dataclasses.replace(expected, max_position_embeddings=2**20)
    if preset == "tiny-falcon-h1":  # the converter folds every muP multiplier into the weights
        assert got.multipliers == Multipliers(), got.multipliers
        expected = dataclasses.replace(expected, multipliers=Multipliers())
    return expected


def check_f32(preset: str, tmp_path) -> float:
    """The f32 round trip; returns max |ours - transformers|."""
    ours = api.load(convert(preset, "f32", tmp_path))
    ids = ours.encode(TEXT)
    ref = hf_logits(presets.materialize(preset), ids)
    got = ours.logits(ids)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= 1e-4 * _scale(ref), np.abs(got - ref).max()
    assert ours.config == _expected_config(preset, ours.config)
    return float(np.abs(got - ref).max())


def check_q8_0(preset: str, tmp_path) -> float:
    """The Q8_0 round trip; returns max |ours - transformers on the f32 weights|."""
    path = convert(preset, "q8_0", tmp_path)
    ours = api.load(path)
    ids = ours.encode(TEXT)
    exact = hf_logits(presets.materialize(preset), ids)
    directory = tmp_path / "dequantised"  # the file's config and its tensors, dequantised
    directory.mkdir()
    f = gguf.GgufFile(path)
    with open(directory / "config.json", "w") as fh:
        json.dump(gguf.hf_config_dict(f), fh)
    tensors = gguf.GgufTensors(f)
    save_file({k: np.ascontiguousarray(tensors[k]) for k in tensors}, str(directory / "model.safetensors"))
    ref = hf_logits(str(directory), ids)
    got = ours.logits(ids)
    assert np.abs(got - ref).max() <= 1e-4 * _scale(ref), np.abs(got - ref).max()
    bound, agree = Q8_BOUND[preset]
    assert np.abs(got - exact).max() <= bound * _scale(exact), np.abs(got - exact).max()
    assert (got.argmax(-1) == exact.argmax(-1)).mean() >= agree
    return float(np.abs(got - exact).max())
