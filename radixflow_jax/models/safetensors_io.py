"""Minimal safetensors reading and writing over numpy memory maps (bfloat16 via ml_dtypes).

Reading maps each file once and hands out zero-copy views, so a loader copies every tensor exactly
once (into the target dtype on its way to the device). A directory holds ``model.safetensors`` or a
sharded ``model.safetensors.index.json`` with its shards.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Iterator, Mapping

import ml_dtypes
import numpy as np

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in _DTYPES.items()}

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class WeightsError(ValueError):
    """A checkpoint is missing, malformed, or does not fit the model; the message names the tensor."""


def _read_header(path: str) -> tuple[dict, int]:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise WeightsError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (size,) = struct.unpack("<Q", raw)
        if size > 100_000_000:
            raise WeightsError(f"{path}: not a safetensors file (header length {size})")
        try:
            header = json.loads(f.read(size))
        except json.JSONDecodeError as exc:
            raise WeightsError(f"{path}: corrupt safetensors header ({exc})") from exc
    return header, 8 + size


class SafetensorsDir(Mapping[str, np.ndarray]):
    """Read-only mapping ``tensor name -> numpy view`` over every safetensors file of a directory."""

    def __init__(self, directory: str):
        index = os.path.join(directory, INDEX_FILE)
        single = os.path.join(directory, SINGLE_FILE)
        if os.path.exists(index):
            with open(index) as f:
                weight_map: dict[str, str] = json.load(f)["weight_map"]
            files = sorted(set(weight_map.values()))
        elif os.path.exists(single):
            files = [SINGLE_FILE]
        else:
            raise WeightsError(f"{directory}: no {SINGLE_FILE} or {INDEX_FILE}")
        self._entries: dict[str, tuple[np.memmap, dict, str]] = {}
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.exists(path):
                raise WeightsError(f"{directory}: shard {name} named in {INDEX_FILE} is missing")
            header, offset = _read_header(path)
            data = np.memmap(path, dtype=np.uint8, mode="r", offset=offset) if os.path.getsize(path) > offset else None
            for key, meta in header.items():
                if key != "__metadata__":
                    self._entries[key] = (data, meta, path)

    def __getitem__(self, key: str) -> np.ndarray:
        data, meta, path = self._entries[key]
        dtype = _DTYPES.get(meta["dtype"])
        if dtype is None:
            raise WeightsError(f"{path}: tensor '{key}' has unsupported dtype {meta['dtype']}")
        start, end = meta["data_offsets"]
        shape = tuple(meta["shape"])
        if data is None:
            return np.zeros(shape, dtype)
        return data[start:end].view(dtype).reshape(shape)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._entries[key][1]["shape"])

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries


def save_file(tensors: Mapping[str, np.ndarray], path: str, metadata: dict[str, str] | None = None) -> None:
    """Writes ``tensors`` as one safetensors file (keys sorted, 8-byte aligned header)."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    arrays = []
    for key in sorted(tensors):
        arr = np.ascontiguousarray(tensors[key])
        name = _NAMES.get(arr.dtype)
        if name is None:
            raise WeightsError(f"cannot write tensor '{key}' of dtype {arr.dtype}")
        header[key] = {"dtype": name, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        arrays.append(arr)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for arr in arrays:
            f.write(arr.tobytes())
