"""One dispatch point for every hot op: models call ``ops.NAME``, never a kernel module directly.

The backend is chosen per call site at trace time: ``RADIXFLOW_KERNELS=reference|pallas`` (or
:func:`use_backend` from an engine option) forces one; the default picks Pallas where a kernel
exists for the current platform and the pure-jnp reference otherwise. A forced backend that cannot
serve an op raises :class:`KernelUnavailableError`; nothing falls back silently.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Any, Callable, Iterator

from radixflow_jax.kernels import attention as _attention
from radixflow_jax.kernels import conv as _conv
from radixflow_jax.kernels import gated_delta as _gated_delta

BACKENDS = ("auto", "reference", "pallas")

_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar("radixflow_kernels", default=None)


class KernelUnavailableError(RuntimeError):
    """The requested kernel backend has no implementation of an op on this platform."""


def selected_backend() -> str:
    """The backend in force: :func:`use_backend` wins over ``RADIXFLOW_KERNELS``; default ``auto``."""
    name = _forced.get() or os.environ.get("RADIXFLOW_KERNELS", "auto")
    if name not in BACKENDS:
        raise ValueError(f"RADIXFLOW_KERNELS={name!r}: expected one of {', '.join(BACKENDS)}")
    return name


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Forces a backend for calls traced inside the block."""
    if name not in BACKENDS:
        raise ValueError(f"kernel backend {name!r}: expected one of {', '.join(BACKENDS)}")
    token = _forced.set(name)
    try:
        yield
    finally:
        _forced.reset(token)


_REFERENCE: dict[str, Callable[..., Any]] = {
    "gated_delta_chunked": _gated_delta.gated_delta_chunked,
    "gated_delta_decode": _gated_delta.gated_delta_decode,
    "causal_conv1d": _conv.causal_conv1d,
    "causal_conv1d_update": _conv.causal_conv1d_update,
    "conv_states_at": _conv.conv_states_at,
    "paged_attention": _attention.paged_attention,
    "write_kv": _attention.write_kv,
}


def _pallas_impl(op: str) -> Callable[..., Any] | None:
    """The Pallas implementation of ``op`` for this platform, or None (none registered yet)."""
    return None


def resolve(op: str) -> Callable[..., Any]:
    """The implementation of ``op`` under the selected backend."""
    backend = selected_backend()
    if backend == "reference":
        return _REFERENCE[op]
    impl = _pallas_impl(op)
    if impl is not None:
        return impl
    if backend == "pallas":
        raise KernelUnavailableError(f"RADIXFLOW_KERNELS=pallas but no Pallas kernel for '{op}' on this platform")
    return _REFERENCE[op]


def gated_delta_chunked(*args: Any, **kwargs: Any) -> Any:
    return resolve("gated_delta_chunked")(*args, **kwargs)


def gated_delta_decode(*args: Any, **kwargs: Any) -> Any:
    return resolve("gated_delta_decode")(*args, **kwargs)


def causal_conv1d(*args: Any, **kwargs: Any) -> Any:
    return resolve("causal_conv1d")(*args, **kwargs)


def causal_conv1d_update(*args: Any, **kwargs: Any) -> Any:
    return resolve("causal_conv1d_update")(*args, **kwargs)


def conv_states_at(*args: Any, **kwargs: Any) -> Any:
    return resolve("conv_states_at")(*args, **kwargs)


def paged_attention(*args: Any, **kwargs: Any) -> Any:
    return resolve("paged_attention")(*args, **kwargs)


def write_kv(*args: Any, **kwargs: Any) -> Any:
    return resolve("write_kv")(*args, **kwargs)
