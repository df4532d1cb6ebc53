"""The config parsers share their field readers through ``hf_fields`` and import each other in one
direction only: ``hf_config`` -> families -> ``hf_fields`` (no cycle, any import order works)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

import radixflow_jax.models as models_pkg
from radixflow_jax.models import hf_fields
from radixflow_jax.models.config import ConfigError

_DIR = os.path.dirname(models_pkg.__file__)


def _imports(module: str) -> set[str]:
    with open(os.path.join(_DIR, f"{module}.py")) as f:
        tree = ast.parse(f.read())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("radixflow_jax.models"):
            out.add(node.module.rsplit(".", 1)[-1])
            out.update(a.name for a in node.names if node.module == "radixflow_jax.models")
    return out


def test_parsers_import_in_one_direction() -> None:
    assert _imports("hf_fields") <= {"config"}
    for family in ("hf_config_ssm", "hf_config_mup"):
        assert "hf_config" not in _imports(family) and _imports(family) & {"hf_config_ssm", "hf_config_mup"} == set()
        assert "hf_fields" in _imports(family)
    assert {"hf_config_ssm", "hf_config_mup", "hf_fields"} <= _imports("hf_config")


def test_a_family_module_imports_first() -> None:
    code = "import radixflow_jax.models.hf_config_mup; from radixflow_jax.models.hf_config import parse_hf_config"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})


def test_shared_readers_name_the_field() -> None:
    with pytest.raises(ConfigError, match="'hidden_size' is missing"):
        hf_fields.positive({}, "hidden_size")
    with pytest.raises(ConfigError, match="'hidden_size' must be positive"):
        hf_fields.positive({"hidden_size": 0}, "hidden_size")
    with pytest.raises(ConfigError, match="hidden_act='gelu' is not supported"):
        hf_fields.check_act({"hidden_act": "gelu"})
    with pytest.raises(ConfigError, match="rope_type='yarn' is not supported"):
        hf_fields.read_rope({"rope_parameters": {"rope_type": "yarn"}}, 64)
    assert hf_fields.eos_ids({"eos_token_id": [1, 2]}) == (1, 2)
    assert hf_fields.dt_limit([0.0, {"__float__": "Infinity"}], "time_step_limit") == (0.0, float("inf"))
