"""GGUF round trip of the Mamba2 hybrid presets (Granite-4.0-H, Falcon-H1, Bamba, Nemotron-H) in f32 and Q8_0
(``gguf_oracle``): the Mamba2 stored forms, stacked experts, folded muP multipliers."""

from __future__ import annotations

import pytest

from tests.models import gguf_oracle

FAMILIES = ["tiny-granite-4.0-h", "tiny-falcon-h1", "tiny-bamba", "tiny-nemotron-h"]


@pytest.mark.parametrize("preset", FAMILIES)
def test_f32_round_trip_matches_transformers(preset, tmp_path) -> None:
    gguf_oracle.check_f32(preset, tmp_path)


@pytest.mark.parametrize("preset", FAMILIES)
def test_q8_0_round_trip_within_its_quantisation_error(preset, tmp_path) -> None:
    gguf_oracle.check_q8_0(preset, tmp_path)
