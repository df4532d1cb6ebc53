"""GGUF round trip of the Mamba2 hybrid presets (Granite-4.0-H, Falcon-H1, Bamba, Nemotron-H) in f32 and Q8_0
(``gguf_oracle``): the Mamba2 stored forms, stacked experts, folded muP multipliers."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from radixflow_jax import cli
from radixflow_jax.models import api, gguf, presets
from tests.models import gguf_oracle

FAMILIES = ["tiny-granite-4.0-h", "tiny-falcon-h1", "tiny-bamba", "tiny-nemotron-h"]


@pytest.mark.parametrize("preset", FAMILIES)
def test_f32_round_trip_matches_transformers(preset, tmp_path) -> None:
    gguf_oracle.check_f32(preset, tmp_path)


@pytest.mark.parametrize("preset", FAMILIES)
def test_q8_0_round_trip_within_its_quantisation_error(preset, tmp_path) -> None:
    gguf_oracle.check_q8_0(preset, tmp_path)


def test_nemotron_h_saved_with_layers_block_type_converts(tmp_path) -> None:
    """transformers 5.x saves a Nemotron-H directory's block pattern as ``layers_block_type`` (no
    ``hybrid_override_pattern``): the writer reads the parsed config, so what loads also converts,
    and the file holds the same model."""
    src = tmp_path / "nemotron"
    shutil.copytree(presets.materialize("tiny-nemotron-h"), src)
    cfg = json.loads((src / "config.json").read_text())
    pattern = cfg.pop("hybrid_override_pattern")
    cfg["layers_block_type"] = [{"M": "linear_attention", "*": "full_attention", "-": "mlp"}[c] for c in pattern]
    (src / "config.json").write_text(json.dumps(cfg))
    out = str(tmp_path / "nemotron.gguf")
    assert cli.main(["convert", str(src), out]) == 0
    assert gguf.hf_config_dict(gguf.GgufFile(out))["hybrid_override_pattern"] == pattern
    ids = list(range(3, 40))
    ref = api.load(str(src)).logits(ids)
    np.testing.assert_allclose(api.load(out).logits(ids), ref, atol=1e-4 * max(1.0, float(np.abs(ref).max())), rtol=0)
