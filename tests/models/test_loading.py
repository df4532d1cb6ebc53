"""Loader error cases (each message names the field or tensor) and the orbax conversion round trip."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from radixflow_jax import cli
from radixflow_jax.models import api
from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.safetensors_io import SafetensorsDir, WeightsError, save_file
from tests.models import hf_oracle


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> str:
    directory, _ = hf_oracle.build("qwen3_5_text", str(tmp_path_factory.mktemp("hf")))
    return directory


def _copy(src: str, dst: str) -> str:
    shutil.copytree(src, dst)
    return dst


def _edit_config(directory: str, **changes) -> None:
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    with open(path, "w") as f:
        json.dump(cfg, f)


def _edit_tensors(directory: str, drop: str | None = None, add: str | None = None, reshape: str | None = None) -> None:
    path = os.path.join(directory, "model.safetensors")
    tensors = {k: np.array(v) for k, v in SafetensorsDir(directory).items()}
    if drop:
        del tensors[drop]
    if add:
        tensors[add] = np.ones((3,), np.float32)
    if reshape:
        tensors[reshape] = tensors[reshape][:-1]
    os.remove(path)
    save_file(tensors, path)


def test_missing_directory_and_config(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="neither a directory nor a preset"):
        api.load(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        api.load(str(tmp_path))


def test_missing_weights_file(hf_dir, tmp_path) -> None:
    d = _copy(hf_dir, str(tmp_path / "m"))
    os.remove(os.path.join(d, "model.safetensors"))
    with pytest.raises(WeightsError, match="no model.safetensors"):
        api.load(d)


def test_unsupported_model_type(hf_dir, tmp_path) -> None:
    d = _copy(hf_dir, str(tmp_path / "m"))
    _edit_config(d, model_type="gpt2")
    with pytest.raises(ConfigError, match="model_type='gpt2' is not supported"):
        api.load(d)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"linear_num_key_heads": None}, "'linear_num_key_heads' is missing"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        ({"linear_num_value_heads": 3}, "linear_num_value_heads=3 is not a multiple"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_type='yarn' is not supported"),
        ({"layer_types": ["linear_attention"] * 4}, "no full_attention layer"),
        ({"layer_types": ["sliding_attention"] * 4}, r"layer_types\[0\]='sliding_attention'"),
        ({"hidden_size": -4}, "'hidden_size' must be positive"),
    ],
)
def test_bad_config_values(hf_dir, tmp_path, changes, message) -> None:
    d = _copy(hf_dir, str(tmp_path / "m"))
    _edit_config(d, **changes)
    with pytest.raises(ConfigError, match=message):
        api.load(d)


def test_missing_extra_and_misshapen_tensors(hf_dir, tmp_path) -> None:
    key = "model.layers.0.linear_attn.in_proj_z.weight"
    d = _copy(hf_dir, str(tmp_path / "missing"))
    _edit_tensors(d, drop=key)
    with pytest.raises(WeightsError, match=f"missing tensor '{key}'"):
        api.load(d)
    d = _copy(hf_dir, str(tmp_path / "extra"))
    _edit_tensors(d, add="model.layers.0.surprise.weight")
    with pytest.raises(WeightsError, match="unexpected tensor 'model.layers.0.surprise.weight'"):
        api.load(d)
    d = _copy(hf_dir, str(tmp_path / "shape"))
    _edit_tensors(d, reshape=key)
    with pytest.raises(WeightsError, match=f"tensor '{key}' has shape \\(47, 64\\), the config implies \\(48, 64\\)"):
        api.load(d)


def test_corrupt_safetensors(hf_dir, tmp_path) -> None:
    d = _copy(hf_dir, str(tmp_path / "m"))
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(b"\xff" * 64)
    with pytest.raises(WeightsError, match="not a safetensors file"):
        api.load(d)


def test_sharded_checkpoint_loads(hf_dir, tmp_path) -> None:
    d = str(tmp_path / "sharded")
    os.makedirs(d)
    shutil.copy(os.path.join(hf_dir, "config.json"), d)
    tensors = {k: np.array(v) for k, v in SafetensorsDir(hf_dir).items()}
    keys = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    weight_map = {}
    for name, part in halves.items():
        save_file({k: tensors[k] for k in part}, os.path.join(d, name))
        weight_map.update({k: name for k in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    ids = list(range(1, 40))
    assert np.array_equal(api.load(d).logits(ids), api.load(hf_dir).logits(ids))


def test_no_tokenizer_accepts_ids_only(hf_dir) -> None:
    model = api.load(hf_dir)
    assert model.tokenizer is None
    with pytest.raises(ValueError, match="no tokenizer.json: pass token ids"):
        model.encode("hello")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.logits([1, 2, 10_000])


@pytest.mark.parametrize("source", ["hf", "tiny-qwen3-next"])
def test_convert_round_trip(hf_dir, tmp_path, source) -> None:
    src = hf_dir if source == "hf" else source
    out = str(tmp_path / "converted")
    assert cli.main(["convert", src, out]) == 0
    assert os.path.isdir(os.path.join(out, "orbax"))
    ids = list(range(2, 70))
    assert np.array_equal(api.load(out).logits(ids), api.load(src).logits(ids))


def test_cli_generate_and_errors(capsys) -> None:
    assert cli.main(["generate", "--model", "tiny-qwen3", "--token-ids", "5,6,7", "--max-tokens", "3"]) == 0
    assert "3 generated" in capsys.readouterr().out
    assert cli.main(["generate", "--model", "no-such-model", "--prompt", "x"]) == 2
    assert "neither a directory nor a preset" in capsys.readouterr().err
    assert cli.main(["generate", "--token-ids", "1,x"]) == 2
    assert "comma-separated integers" in capsys.readouterr().err
