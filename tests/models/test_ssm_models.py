"""Mamba2 hybrids (Bamba, Nemotron-H): logits equal transformers, and prefix + continuation spans +
decode steps equal the full forward with SSD and conv states equal to the reference's."""

from __future__ import annotations

import numpy as np
import pytest

from radixflow_jax.models import api
from radixflow_jax.models.config import ConfigError
from tests.models import hf_oracle


@pytest.mark.parametrize("case", ["bamba", "bamba_g1", "nemotron_h", "nemotron_h_g1"])
def test_full_forward_matches_transformers(case: str, tmp_path) -> None:
    directory, hf_model = hf_oracle.build(case, str(tmp_path))
    ours = api.load(directory)
    rng = np.random.default_rng(3)
    for length in (1, 37, 70):
        ids = rng.integers(0, ours.config.vocab_size, length).tolist()
        assert np.abs(ours.logits(ids) - hf_oracle.hf_logits(hf_model, ids)).max() <= 1e-4


@pytest.mark.parametrize("case", ["bamba", "nemotron_h"])
def test_spans_and_decode_equal_full_forward(case: str, tmp_path) -> None:
    directory, hf_model = hf_oracle.build(case, str(tmp_path))
    model = api.load(directory)
    rng = np.random.default_rng(11)
    prompt = rng.integers(0, model.config.vocab_size, 60).tolist()
    decode_ids = rng.integers(0, model.config.vocab_size, 16).tolist()
    full = model.logits(prompt + decode_ids)
    seq = model.new_sequence(128)
    pieces = [model.extend(seq, prompt[:13]), model.extend(seq, prompt[13:41])]  # off the 16-token chunk grid
    for (conv, ssm), (ref_conv, ref_ssm) in zip(model.recurrent_states(seq), hf_oracle.hf_states(hf_model, prompt[:41])):
        assert np.abs(conv - ref_conv).max() <= 1e-4
        assert np.abs(ssm - ref_ssm).max() <= 1e-4
    pieces.append(model.extend(seq, prompt[41:]))
    pieces += [model.decode(seq, t)[None] for t in decode_ids]
    assert np.abs(np.concatenate(pieces) - full).max() <= 1e-4
    states = model.recurrent_states(seq)
    assert len(states) == model.config.mixers.count("mamba") >= 2
    for (conv, ssm), (ref_conv, ref_ssm) in zip(states, hf_oracle.hf_states(hf_model, prompt + decode_ids)):
        assert np.abs(conv - ref_conv).max() <= 1e-4
        assert np.abs(ssm - ref_ssm).max() <= 1e-4


def test_nemotron_moe_blocks_are_refused() -> None:
    from radixflow_jax.models.hf_config import parse_hf_config

    with pytest.raises(ConfigError, match="MoE blocks are not supported"):
        parse_hf_config({"model_type": "nemotron_h", "hybrid_override_pattern": "M*E", "vocab_size": 8})
    with pytest.raises(ConfigError, match="unknown symbol 'X'"):
        parse_hf_config({"model_type": "nemotron_h", "hybrid_override_pattern": "MX", "vocab_size": 8})
