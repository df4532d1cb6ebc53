"""Reading a GGUF file: its metadata as plain Python values and its tensors dequantised to float32.

Invariants: nothing here knows a model family; a tensor comes back in the HF ``[out, in]`` order
(ggml lists dimensions innermost first, so the stored shape is reversed); every quantisation type
the ``gguf`` package can dequantise is read through ``gguf.quants`` (F32, F16, BF16, Q8_0, Q4_0,
Q4_1, Q4_K, Q5_K, Q6_K, ...), never by code of our own. A file is untrusted input: one whose
tensor data ends past the file's length (truncated, or a missing data section) is refused when it
is opened, with a ``WeightsError`` naming the file (and the tensor where the reader got that far),
never read as zeros.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.safetensors_io import WeightsError

GGUF_SUFFIX = ".gguf"


def is_gguf(path: str) -> bool:
    return os.path.isfile(path) and path.endswith(GGUF_SUFFIX)


class GgufFile:
    """An opened GGUF file: its metadata (plain Python values) and its tensors (not yet read)."""

    def __init__(self, path: str):
        import gguf

        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such GGUF file")
        size = os.path.getsize(path)
        try:
            reader = gguf.GGUFReader(path, "r")
        except (ValueError, OSError, IndexError, KeyError) as exc:  # a truncated file fails in numpy views
            raise WeightsError(
                f"{path}: not a readable GGUF file, truncated or malformed ({size} bytes; {type(exc).__name__}: {exc})"
            ) from exc
        self.path = path
        self.metadata: dict[str, Any] = {name: field.contents() for name, field in reader.fields.items()}
        self.tensors = {t.name: t for t in reader.tensors}
        for t in reader.tensors:
            if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
                raise WeightsError(
                    f"{path}: GGUF tensor '{t.name}' needs bytes [{t.data_offset}, {t.data_offset + t.n_bytes}), "
                    f"the file holds {size} (truncated file)"
                )

    @property
    def arch(self) -> str:
        return self.require("general.architecture", str)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str, kind: type | tuple[type, ...] = int) -> Any:
        """The value of ``key``; a missing key or one of another type raises ``ConfigError`` naming it."""
        value = self.metadata.get(key)
        if value is None:
            raise ConfigError(f"{self.path}: GGUF metadata key '{key}' is missing")
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            raise ConfigError(f"{self.path}: GGUF metadata key '{key}' must be {kind}, got {value!r}")
        return value

    def arch_int(self, name: str, default: int | None = None) -> int:
        """``{arch}.{name}`` as an int (required unless ``default`` is given)."""
        key = f"{self.arch}.{name}"
        return default if default is not None and key not in self.metadata else self.require(key, int)

    def arch_float(self, name: str, default: float | None = None) -> float:
        """``{arch}.{name}`` as a float. GGUF stores float32, so the value comes back as the shortest
        decimal that rounds to the stored float32 (``1e-06``, not ``9.99999997e-07``): the HF value
        written, whenever that value had a short decimal form."""
        key = f"{self.arch}.{name}"
        if default is not None and key not in self.metadata:
            return default
        return float(str(np.float32(self.require(key, (int, float)))))

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` dequantised to float32 in HF dimension order; a missing tensor or one
        whose data does not fill its shape raises ``WeightsError`` naming it."""
        import gguf

        tensor = self.tensors.get(name)
        if tensor is None:
            raise WeightsError(f"{self.path}: GGUF tensor '{name}' is missing")
        shape = tuple(int(d) for d in reversed(tensor.shape))
        try:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except (NotImplementedError, ValueError) as exc:
            raise WeightsError(f"{self.path}: GGUF tensor '{name}' ({tensor.tensor_type.name}) cannot be read ({exc})") from exc
        values = np.asarray(values, dtype=np.float32)
        if values.size != int(np.prod(shape)):
            raise WeightsError(f"{self.path}: GGUF tensor '{name}' has {values.size} values for {shape}")
        return values.reshape(shape)
