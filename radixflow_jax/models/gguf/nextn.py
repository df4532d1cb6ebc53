"""MTP layers in GGUF files (``qwen35``, ``qwen3next``): llama.cpp's "nextn" blocks.

llama.cpp's converter (``_QwenMtpMixin``) writes a checkpoint's ``mtp_layers`` MTP layers as extra
blocks after the ``n`` trunk blocks and counts them in ``block_count``:

* ``{arch}.nextn_predict_layers`` = the number of MTP blocks; ``attention.recurrent_layers`` gains
  one ``false`` per MTP block;
* ``mtp.layers.{j}.<suffix>`` -> block ``n + j``, named and laid out as a trunk layer's ``<suffix>``
  (so the family's own table and layout changes apply: norms stored as ``w + 1``, ...);
* ``mtp.fc`` -> ``blk.{n}.nextn.eh_proj``, ``mtp.pre_fc_norm_embedding`` -> ``nextn.enorm``,
  ``mtp.pre_fc_norm_hidden`` -> ``nextn.hnorm``, ``mtp.norm`` -> ``nextn.shared_head_norm`` (the
  three norms stored as ``w + 1`` like every other zero-centred norm).

:class:`MtpNames` maps between the two for one file (it needs ``n``); nothing here reads a file.
Invariant: a trunk tensor maps exactly as without MTP blocks.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

import numpy as np

from radixflow_jax.models.gguf.family import U32, Family, Meta, TensorPairs, only
from radixflow_jax.models.safetensors_io import WeightsError

# HF ``mtp.<name>`` -> GGUF ``blk.{n}.nextn.<name>``
NEXTN = {
    "fc.weight": "eh_proj.weight",
    "pre_fc_norm_embedding.weight": "enorm.weight",
    "pre_fc_norm_hidden.weight": "hnorm.weight",
    "norm.weight": "shared_head_norm.weight",
}
_NORMS = ("enorm.weight", "hnorm.weight", "shared_head_norm.weight")
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
_MTP_LAYER = re.compile(r"^mtp\.layers\.(\d+)\.(.+)$")
_TRUNK_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def nextn_layers(f: Any) -> int:
    """``{arch}.nextn_predict_layers`` of a file (0 when absent)."""
    return int(f.get(f"{f.arch}.nextn_predict_layers") or 0)


@dataclasses.dataclass(frozen=True)
class MtpNames:
    """The MTP tensors of a file whose trunk has ``trunk`` layers, through ``family``."""

    trunk: int
    family: Family

    def hf_key(self, name: str) -> str | None:
        """The HF key of GGUF tensor ``name`` if it belongs to an MTP block, else None."""
        m = _BLOCK.match(name)
        if m is None or int(m[1]) < self.trunk:
            return None
        j = int(m[1]) - self.trunk
        if m[2].startswith("nextn."):
            inverse = {v: k for k, v in NEXTN.items()}
            suffix = m[2][len("nextn.") :]
            if j != 0 or suffix not in inverse:
                known = ", ".join(f"nextn.{v}" for v in NEXTN.values())
                raise WeightsError(f"GGUF tensor '{name}' is not supported (the first MTP block's {known} are)")
            return f"mtp.{inverse[suffix]}"
        key = self.family.hf_key(f"blk.{m[1]}.{m[2]}")
        t = _TRUNK_LAYER.match(key)
        if t is None:
            raise WeightsError(f"GGUF tensor '{name}' is not a layer tensor")
        return f"mtp.layers.{j}.{t[2]}"

    def _trunk_form(self, key: str) -> str:
        m = _MTP_LAYER.match(key)
        assert m is not None
        return f"model.layers.{self.trunk + int(m[1])}.{m[2]}"

    def from_gguf(self, key: str, parts: Mapping[str, np.ndarray], cfg: dict[str, Any]) -> np.ndarray:
        """HF tensor ``key`` (``mtp.*``) from its GGUF arrays."""
        if _MTP_LAYER.match(key):
            return self.family.from_gguf(self._trunk_form(key), parts, cfg)
        t = only(parts).astype(np.float32, copy=False)
        return t - np.float32(1.0) if NEXTN[key[len("mtp.") :]] in _NORMS else t

    def to_gguf(self, key: str, array: np.ndarray, cfg: dict[str, Any]) -> TensorPairs:
        """HF tensor ``key`` (``mtp.*``) -> its GGUF tensors, as the converter writes them."""
        if _MTP_LAYER.match(key):
            return self.family.to_gguf(self._trunk_form(key), array, cfg)
        name = NEXTN.get(key[len("mtp.") :])
        if name is None:
            raise WeightsError(f"HF tensor '{key}' has no GGUF name")
        t = array.astype(np.float32, copy=False)
        return [(f"blk.{self.trunk}.nextn.{name}", t + np.float32(1.0) if name in _NORMS else t)]

    def gguf_names(self, key: str, cfg: dict[str, Any]) -> tuple[str, ...]:
        if _MTP_LAYER.match(key):
            return self.family.gguf_names(self._trunk_form(key), cfg)
        return (f"blk.{self.trunk}.nextn.{NEXTN.get(key[len('mtp.') :], key)}",)


def with_nextn(meta: Meta, arch: str, layers: int) -> Meta:
    """The trunk's metadata for a file that also holds ``layers`` MTP blocks: ``block_count`` and
    ``attention.recurrent_layers`` extended, ``nextn_predict_layers`` added (the converter's keys)."""
    if layers == 0:
        return meta
    out: Meta = []
    for key, value, kind in meta:
        if key == f"{arch}.block_count":
            value = int(value) + layers
        elif key == f"{arch}.attention.recurrent_layers":
            value = [*value, *([False] * layers)]
        out.append((key, value, kind))
    return [*out, (f"{arch}.nextn_predict_layers", layers, U32)]
