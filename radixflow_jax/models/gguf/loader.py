"""GGUF file -> HF config dict and HF-named float32 tensors, through the family of its architecture.

Invariants: the config dict names only HF fields (nothing GGUF-specific reaches ``ModelConfig``) and
goes through ``parse_hf_config`` like any directory's; a GGUF field we cannot map raises
``ConfigError`` naming the GGUF key; a tensor we cannot map, a missing one or one of the wrong shape
raises ``WeightsError`` naming the GGUF tensor.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.gguf.bamba import BAMBA
from radixflow_jax.models.gguf.dense import LLAMA, QWEN3
from radixflow_jax.models.gguf.falcon_h1 import FALCON_H1
from radixflow_jax.models.gguf.family import Family
from radixflow_jax.models.gguf.granite import GRANITE_HYBRID
from radixflow_jax.models.gguf.nemotron_h import NEMOTRON_H
from radixflow_jax.models.gguf.nextn import MtpNames, nextn_layers
from radixflow_jax.models.gguf.qwen35 import QWEN35
from radixflow_jax.models.gguf.qwen3next import QWEN3NEXT
from radixflow_jax.models.gguf.reader import GgufFile
from radixflow_jax.models.safetensors_io import TensorMapping, WeightsError

FAMILIES: tuple[Family, ...] = (LLAMA, QWEN3, QWEN35, QWEN3NEXT, BAMBA, GRANITE_HYBRID, FALCON_H1, NEMOTRON_H)
_QUOTED = re.compile(r"tensor '([^']+)'")


def family_of(f: GgufFile) -> Family:
    arch = f.arch
    for fam in FAMILIES:
        if fam.arch == arch and fam.accepts(f):
            return fam
    supported = ", ".join(dict.fromkeys(fam.arch for fam in FAMILIES))
    raise ConfigError(f"{f.path}: GGUF general.architecture={arch!r} is not supported; supported: {supported}")


def hf_config_dict(f: GgufFile) -> dict[str, Any]:
    """The ``config.json`` dict of the model in ``f`` (HF field names; parsed by ``parse_hf_config``)."""
    return family_of(f).hf_config(f)


class GgufTensors(TensorMapping):
    """The file's tensors under their HF names, each rebuilt from its GGUF tensor(s) on access."""

    def __init__(self, f: GgufFile, cfg: dict[str, Any] | None = None):
        self._file = f
        self._family = family_of(f)
        self._cfg = cfg if cfg is not None else self._family.hf_config(f)
        self._parts: dict[str, list[str]] = {}
        # MTP blocks after the trunk (models/gguf/nextn.py): read as HF ``mtp.*``
        self._mtp = MtpNames(int(self._cfg["num_hidden_layers"]), self._family) if nextn_layers(f) else None
        for name in f.tensors:
            try:
                key = (self._mtp.hf_key(name) if self._mtp else None) or self._family.hf_key(name)
            except WeightsError as exc:
                raise WeightsError(f"{f.path}: {exc} ({f.arch})") from None
            self._parts.setdefault(key, []).append(name)

    def gguf_names(self, key: str) -> tuple[str, ...]:
        """The GGUF tensors HF tensor ``key`` is (or would be) made of."""
        if key in self._parts:
            return tuple(self._parts[key])
        try:
            if self._mtp is not None and key.startswith("mtp."):
                return self._mtp.gguf_names(key, self._cfg)
            return self._family.gguf_names(key, self._cfg)
        except WeightsError:
            return ()

    def __getitem__(self, key: str) -> np.ndarray:
        parts = {name: self._file.read(name) for name in self._parts[key]}
        try:
            if self._mtp is not None and key.startswith("mtp."):
                return self._mtp.from_gguf(key, parts, self._cfg)
            return self._family.from_gguf(key, parts, self._cfg)
        except (ValueError, IndexError) as exc:
            raise WeightsError(
                f"{self._file.path}: GGUF tensor(s) {', '.join(parts)} cannot form '{key}' ({exc})"
            ) from exc

    def _names(self) -> Mapping[str, object]:
        return self._parts


def load_state(f: GgufFile, cfg: Any, dtype: Any) -> tuple[Any, Any]:
    """``load_tensors_state`` over the file's tensors; its errors name the GGUF tensor, not only the HF key."""
    from radixflow_jax.models.weights import load_tensors_state

    tensors = GgufTensors(f)
    try:
        return load_tensors_state(tensors, cfg, dtype)
    except WeightsError as exc:
        msg = str(exc)
        m = _QUOTED.search(msg)
        names = tensors.gguf_names(m[1]) if m else ()
        if names and f.path not in msg:
            raise WeightsError(f"{f.path}: GGUF tensor '{', '.join(names)}': {msg}") from exc
        raise
