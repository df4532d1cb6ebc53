"""GGUF round trip of the attention and Gated DeltaNet presets (Qwen3.5, Qwen3, Qwen3-Next) in f32
and Q8_0 (``gguf_oracle``), and ``radixflow generate`` on a converted file."""

from __future__ import annotations

import pytest

from radixflow_jax import cli
from tests.models import gguf_oracle

FAMILIES = ["tiny-qwen3.5", "tiny-qwen3", "tiny-qwen3-next"]


@pytest.mark.parametrize("preset", FAMILIES)
def test_f32_round_trip_matches_transformers(preset, tmp_path) -> None:
    gguf_oracle.check_f32(preset, tmp_path)


@pytest.mark.parametrize("preset", FAMILIES)
def test_q8_0_round_trip_within_its_quantisation_error(preset, tmp_path) -> None:
    gguf_oracle.check_q8_0(preset, tmp_path)


def test_generate_runs_on_a_converted_file(tmp_path, capsys) -> None:
    path = gguf_oracle.convert("tiny-qwen3.5", "q8_0", tmp_path)
    assert cli.main(["generate", "--model", path, "--max-tokens", "3"]) == 0
    assert "3 generated" in capsys.readouterr().out
