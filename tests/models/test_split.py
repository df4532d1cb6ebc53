"""Split equivalence: a prompt processed as prefix + continuation spans + decode steps gives the
full forward's logits, and the carried recurrent and conv states equal the reference's states."""

from __future__ import annotations

import numpy as np
import pytest

from radixflow_jax.models import api
from tests.models import hf_oracle


@pytest.mark.parametrize("case", ["qwen3_5_text", "qwen3_next_moe", "qwen3_5_text_eqheads"])
def test_spans_and_decode_equal_full_forward(case: str, tmp_path) -> None:
    directory, hf_model = hf_oracle.build(case, str(tmp_path))
    model = api.load(directory)
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, model.config.vocab_size, 150).tolist()
    decode_ids = rng.integers(0, model.config.vocab_size, 16).tolist()
    full_ids = prompt + decode_ids
    full = model.logits(full_ids)

    seq = model.new_sequence(256)
    pieces = []
    for start, end in ((0, 37), (37, 101), (101, 150)):  # split points off the 64-token chunk grid
        pieces.append(model.extend(seq, prompt[start:end]))
        if end == 101:
            want = hf_oracle.hf_states(hf_model, prompt[:end])
            for (conv, ssm), (ref_conv, ref_ssm) in zip(model.recurrent_states(seq), want):
                assert np.abs(conv - ref_conv).max() <= 1e-4
                assert np.abs(ssm - ref_ssm).max() <= 1e-4
    for token in decode_ids:
        pieces.append(model.decode(seq, token)[None, :])
    incremental = np.concatenate(pieces, axis=0)
    assert incremental.shape == full.shape
    assert np.abs(incremental - full).max() <= 1e-4

    ref = hf_oracle.hf_logits(hf_model, full_ids)
    assert np.abs(incremental - ref).max() <= 1e-4
    states = model.recurrent_states(seq)
    assert len(states) == model.config.mixers.count("gdn") >= 2
    for (conv, ssm), (ref_conv, ref_ssm) in zip(states, hf_oracle.hf_states(hf_model, full_ids)):
        assert np.abs(conv - ref_conv).max() <= 1e-4
        assert np.abs(ssm - ref_ssm).max() <= 1e-4


def test_attention_only_control_splits(tmp_path) -> None:
    directory, _ = hf_oracle.build("qwen3", str(tmp_path))
    model = api.load(directory)
    ids = list(range(5, 75))
    full = model.logits(ids)
    seq = model.new_sequence(128)
    got = np.concatenate([model.extend(seq, ids[:33]), model.extend(seq, ids[33:60])] + [
        model.decode(seq, t)[None] for t in ids[60:]
    ])
    assert np.abs(got - full).max() <= 1e-4
