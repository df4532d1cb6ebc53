"""Mamba2 hybrids (Bamba, Nemotron-H, Granite-4.0-H, Falcon-H1): logits equal transformers, and
prefix + continuation spans + decode steps equal the full forward with SSD and conv states equal to
the reference's. Granite/Falcon cases set every multiplier away from 1.0 (``hf_oracle``)."""

from __future__ import annotations

import numpy as np
import pytest

from radixflow_jax.models import api
from radixflow_jax.models.config import ConfigError
from tests.models import hf_oracle


@pytest.mark.parametrize(
    "case",
    ["bamba", "bamba_g1", "nemotron_h", "nemotron_h_g1", "granite_moe", "granite_dense_g1", "falcon_h1",
     "falcon_h1_g1", "falcon_h1_gate_first"],
)
def test_full_forward_matches_transformers(case: str, tmp_path) -> None:
    directory, hf_model = hf_oracle.build(case, str(tmp_path))
    ours = api.load(directory)
    rng = np.random.default_rng(3)
    for length in (1, 70):  # one token; several chunks and a partial one (each length is a compile)
        ids = rng.integers(0, ours.config.vocab_size, length).tolist()
        assert np.abs(ours.logits(ids) - hf_oracle.hf_logits(hf_model, ids)).max() <= 1e-4


@pytest.mark.parametrize("case", ["bamba", "nemotron_h", "granite_moe", "falcon_h1"])
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
    assert len(states) == len(model.config.recurrent_layers) >= 2
    for (conv, ssm), (ref_conv, ref_ssm) in zip(states, hf_oracle.hf_states(hf_model, prompt + decode_ids)):
        assert np.abs(conv - ref_conv).max() <= 1e-4
        assert np.abs(ssm - ref_ssm).max() <= 1e-4


def test_nemotron_moe_blocks_are_refused() -> None:
    from radixflow_jax.models.hf_config import parse_hf_config

    with pytest.raises(ConfigError, match="MoE blocks are not supported"):
        parse_hf_config({"model_type": "nemotron_h", "hybrid_override_pattern": "M*E", "vocab_size": 8})
    with pytest.raises(ConfigError, match="unknown symbol 'X'"):
        parse_hf_config({"model_type": "nemotron_h", "hybrid_override_pattern": "MX", "vocab_size": 8})


def _preset_config(name: str, drop: tuple[str, ...] = (), **changes) -> dict:
    from radixflow_jax.models import presets

    cfg = {**presets.PRESETS[name], **changes}
    return {k: v for k, v in cfg.items() if k not in drop}


@pytest.mark.parametrize(
    "preset, changes, message",
    [
        ("tiny-granite-4.0-h", {"layer_types": ["mamba", "conv"] + ["mamba"] * 6}, r"layer_types\[1\]='conv'"),
        ("tiny-granite-4.0-h", {"layer_types": ["mamba"] * 3}, "layer_types must list num_hidden_layers=8"),
        ("tiny-granite-4.0-h", {"position_embedding_type": "alibi"}, "position_embedding_type='alibi'"),
        ("tiny-granite-4.0-h", {"num_experts_per_tok": 5}, "num_experts_per_tok=5 exceeds num_local_experts=4"),
        ("tiny-granite-4.0-h", {"num_local_experts": -1}, "'num_local_experts' must be an int >= 0"),
        ("tiny-granite-4.0-h", {"mamba_d_head": 16}, r"mamba_n_heads \* mamba_d_head = 128 but mamba_expand"),
        ("tiny-granite-4.0-h", {"logits_scaling": 0}, "'logits_scaling' must be a finite non-zero number"),
        ("tiny-granite-4.0-h", {"residual_multiplier": "x"}, "residual_multiplier has a non-numeric entry"),
        ("tiny-granite-4.0-h", {"position_embedding_type": "rope", "partial_rotary_factor": 0.5},
         "partial_rotary_factor=0.5 is not supported"),
        ("tiny-granite-4.0-h", {"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        ("tiny-falcon-h1", {"ssm_multipliers": [1.0, 1.0]}, "'ssm_multipliers' must be a list of 5 numbers"),
        ("tiny-falcon-h1", {"mlp_multipliers": [1.0, "a"]}, "mlp_multipliers has a non-numeric entry"),
        ("tiny-falcon-h1", {"mlp_bias": True}, "mlp_bias=true is not supported"),
        ("tiny-falcon-h1", {"mamba_d_ssm": 200}, r"mamba_n_heads \* mamba_d_head = 256 but mamba_d_ssm = 200"),
        ("tiny-falcon-h1", {"key_multiplier": None}, "'key_multiplier' must be a number"),
        ("tiny-falcon-h1", {"time_step_limit": [1.0, 0.5]}, "time_step_limit"),
        ("tiny-falcon-h1", {"mamba_n_heads": 0}, "'mamba_n_heads' must be positive"),
    ],
)
def test_granite_falcon_bad_config_values(preset: str, changes: dict, message: str) -> None:
    from radixflow_jax.models.hf_config import parse_hf_config

    with pytest.raises(ConfigError, match=message):
        parse_hf_config(_preset_config(preset, **changes))


def test_granite_falcon_config_variants() -> None:
    from radixflow_jax.models.batch import init_cache
    from radixflow_jax.models.hf_config import parse_hf_config

    granite = parse_hf_config(_preset_config("tiny-granite-4.0-h"))
    assert granite.multipliers.logits_scaling == 2.0 and granite.attention.scale == 0.03125
    assert granite.attention.rope is None and granite.mlps == ("glu_moe",) * 8
    new_names = ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"]
    legacy = {**_preset_config("tiny-granite-4.0-h", drop=("layer_types",)), "layers_block_type": new_names}
    assert parse_hf_config(legacy).mixers == granite.mixers
    dense = parse_hf_config(_preset_config("tiny-granite-4.0-h", num_local_experts=0))
    assert dense.moe is None and dense.mlps == ("glu",) * 8

    falcon = parse_hf_config(_preset_config("tiny-falcon-h1"))
    assert falcon.mixers == ("parallel",) * 6 and falcon.mamba.gated_norm == "none"
    assert falcon.attention_layers == falcon.recurrent_layers == tuple(range(6))
    cache = init_cache(falcon, num_pages=2, page_size=16, num_slots=2, dtype=np.float32)
    assert len(cache.kv) == len(cache.conv) == len(cache.ssm) == 6
    norms = {
        (True, True): "norm_first",
        (True, False): "gate_first",
        (False, True): "none",
    }
    for (rms, before), want in norms.items():
        cfg = parse_hf_config(_preset_config("tiny-falcon-h1", mamba_rms_norm=rms, mamba_norm_before_gate=before))
        assert cfg.mamba.gated_norm == want


def test_falcon_convert_round_trip(tmp_path) -> None:
    from radixflow_jax import cli

    out = str(tmp_path / "converted")
    assert cli.main(["convert", "tiny-falcon-h1", out]) == 0
    ids = list(range(2, 70))
    assert np.array_equal(api.load(out).logits(ids), api.load("tiny-falcon-h1").logits(ids))
