"""Minimal safetensors reading and writing over numpy memory maps (bfloat16 via ml_dtypes).

Reading maps each file once and hands out zero-copy views, so a loader copies every tensor exactly
once (into the target dtype on its way to the device). A directory holds ``model.safetensors`` or a
sharded ``model.safetensors.index.json`` with its shards.

Invariants (model files are untrusted input): a shard named by the index is a relative path inside
the model directory (no absolute path, no ``..`` step); every tensor's ``data_offsets`` lie inside
its file's data section and span exactly ``shape x dtype`` bytes, checked against the file's length
when the directory is opened, so a truncated or missing data section is a ``WeightsError`` naming
the tensor, never zeros or a short read.
"""

from __future__ import annotations

import abc
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
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise WeightsError(f"{path}: corrupt safetensors header ({exc})") from exc
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: corrupt safetensors header (not a JSON object)")
    return header, 8 + size


def _shard_names(directory: str, index: str) -> list[str]:
    """The shard files an index names, each a relative path that stays inside ``directory``."""
    try:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise WeightsError(f"{index}: not a safetensors index ({type(exc).__name__}: {exc})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise WeightsError(f"{index}: weight_map must map tensor names to shard file names")
    names = sorted(set(weight_map.values()))
    for name in names:
        parts = name.replace("\\", "/").split("/")
        if not name or os.path.isabs(name) or ".." in parts or os.path.splitdrive(name)[0]:
            raise WeightsError(f"{index}: shard name {name!r} leaves the model directory {directory}")
    return names


def _check_entry(path: str, key: str, meta: object, data_bytes: int) -> None:
    """A tensor's header entry is well formed and its bytes lie inside the file's data section."""
    ok = isinstance(meta, dict) and isinstance(meta.get("shape"), list) and isinstance(meta.get("data_offsets"), list)
    ok = ok and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in meta["shape"])
    ok = ok and len(meta["data_offsets"]) == 2 and all(isinstance(o, int) for o in meta["data_offsets"])
    if not ok:
        raise WeightsError(f"{path}: tensor '{key}' has a malformed header entry {meta!r}")
    dtype = _DTYPES.get(meta.get("dtype"))
    if dtype is None:
        raise WeightsError(f"{path}: tensor '{key}' has unsupported dtype {meta.get('dtype')}")
    start, end = meta["data_offsets"]
    size = int(np.prod(meta["shape"], dtype=np.int64)) * dtype.itemsize
    if not 0 <= start <= end or end - start != size:
        raise WeightsError(f"{path}: tensor '{key}' spans bytes [{start}, {end}), its shape and dtype need {size}")
    if end > data_bytes:
        raise WeightsError(
            f"{path}: tensor '{key}' needs bytes [{start}, {end}) of the data section, the file holds {data_bytes} "
            "(truncated or incomplete file)"
        )


class TensorMapping(Mapping[str, np.ndarray]):
    """A read-only ``tensor name -> array`` mapping over an index the subclass builds when opened
    (:meth:`_names`). Invariant: iterating, counting and membership read that index only, never a
    tensor's bytes (``Mapping``'s default ``__contains__`` would read the tensor through ``__getitem__``)."""

    @abc.abstractmethod
    def _names(self) -> Mapping[str, object]:
        """The index whose keys are the tensor names."""

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, key: object) -> bool:
        return key in self._names()


class SafetensorsDir(TensorMapping):
    """Read-only mapping ``tensor name -> numpy view`` over every safetensors file of a directory."""

    def __init__(self, directory: str):
        index = os.path.join(directory, INDEX_FILE)
        single = os.path.join(directory, SINGLE_FILE)
        if os.path.exists(index):
            files = _shard_names(directory, index)
        elif os.path.exists(single):
            files = [SINGLE_FILE]
        else:
            raise WeightsError(f"{directory}: no {SINGLE_FILE} or {INDEX_FILE}")
        self._entries: dict[str, tuple[np.memmap | None, dict, str]] = {}
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.isfile(path):
                raise WeightsError(f"{directory}: shard {name} named in {INDEX_FILE} is missing")
            header, offset = _read_header(path)
            data_bytes = max(os.path.getsize(path) - offset, 0)
            data = np.memmap(path, dtype=np.uint8, mode="r", offset=offset) if data_bytes else None
            for key, meta in header.items():
                if key != "__metadata__":
                    _check_entry(path, key, meta, data_bytes)
                    self._entries[key] = (data, meta, path)

    def __getitem__(self, key: str) -> np.ndarray:
        data, meta, _ = self._entries[key]
        dtype = _DTYPES[meta["dtype"]]
        start, end = meta["data_offsets"]
        shape = tuple(meta["shape"])
        if data is None:  # every tensor of the file is empty (checked at open)
            return np.zeros(shape, dtype)
        return data[start:end].view(dtype).reshape(shape)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._entries[key][1]["shape"])

    def _names(self) -> Mapping[str, object]:
        return self._entries


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
