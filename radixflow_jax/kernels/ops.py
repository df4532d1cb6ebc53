"""One dispatch point for every hot op: models call ``ops.NAME``, never a kernel module directly.

The backend is chosen per call site at trace time: ``RADIXFLOW_KERNELS=reference|xla|pallas`` (or
:func:`use_backend` from an engine option) forces one; the default (``auto``) picks Pallas where a
kernel exists for the current platform, else the faster XLA formulation (``kernels/fast.py``, each
tested against its reference) where one exists, else the pure-jnp reference. ``reference`` runs the
oracles only. A forced backend that cannot serve an op raises :class:`KernelUnavailableError`;
nothing falls back silently. On the CPU, ``auto`` also runs the native C++ kernels of
``kernels/native`` where one serves a call (the Gated DeltaNet and SSD scans, the Gated DeltaNet
decode window update, paged attention; ``RADIXFLOW_NATIVE``; a failed build
warns once).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp

from radixflow_jax.kernels import attention as _attention
from radixflow_jax.kernels import conv as _conv
from radixflow_jax.kernels import fast as _fast
from radixflow_jax.kernels import gated_delta as _gated_delta
from radixflow_jax.kernels import native as _native
from radixflow_jax.kernels import ssd as _ssd
from radixflow_jax.kernels.pallas import common as _pallas_common
from radixflow_jax.kernels.pallas import gated_delta as _pallas_gated_delta
from radixflow_jax.kernels.pallas import paged_attention as _pallas_attention
from radixflow_jax.kernels.pallas import ssd as _pallas_ssd

BACKENDS = ("auto", "reference", "xla", "pallas")

_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar("radixflow_kernels", default=None)
# (mesh, axis) while tracing a tensor-parallel step: Pallas kernels then run per shard (shard_map)
_shards: contextvars.ContextVar[tuple[Any, str] | None] = contextvars.ContextVar("radixflow_shards", default=None)
# the platform a program is traced for when it is not this host's (jax.export for cuda / tpu)
_target: contextvars.ContextVar[str | None] = contextvars.ContextVar("radixflow_target_platform", default=None)
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


class KernelUnavailableError(RuntimeError):
    """The requested kernel backend has no implementation of an op on this platform."""


def selected_backend() -> str:
    """The backend in force: :func:`use_backend` wins over ``RADIXFLOW_KERNELS``; default ``auto``."""
    name = _forced.get() or os.environ.get("RADIXFLOW_KERNELS", "auto")
    if name not in BACKENDS:
        raise ValueError(f"RADIXFLOW_KERNELS={name!r}: expected one of {', '.join(BACKENDS)}")
    return name


@contextlib.contextmanager
def _setting(var: contextvars.ContextVar[Any], value: Any) -> Iterator[None]:
    """``var`` set to ``value`` inside the block."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def use_backend(name: str) -> contextlib.AbstractContextManager[None]:
    """Forces a backend for calls traced inside the block."""
    if name not in BACKENDS:
        raise ValueError(f"kernel backend {name!r}: expected one of {', '.join(BACKENDS)}")
    return _setting(_forced, name)


def platform() -> str:
    """The platform ops pick kernels for: the one :func:`target_platform` names while tracing a
    program for another platform, else this host's ``jax.default_backend()``."""
    return _target.get() or jax.default_backend()


def target_platform(name: str) -> contextlib.AbstractContextManager[None]:
    """Ops traced inside the block pick the kernels of platform ``name`` (``cuda``, ``rocm``,
    ``tpu`` or ``cpu``), not this host's: what ``jax.export`` for another platform needs (a CPU host
    exporting the step for a GPU selects the Triton variants and no native CPU kernel). The
    exported program runs only on ``name``; nothing traced here may be executed on this host."""
    if name not in PLATFORMS:
        raise ValueError(f"target platform {name!r}: expected one of {', '.join(PLATFORMS)}")
    return _setting(_target, name)


def per_shard(mesh: Any, axis: str) -> contextlib.AbstractContextManager[None]:
    """Pallas kernels traced inside the block run per shard of ``mesh``'s ``axis`` inside
    ``jax.shard_map`` (the partitioner cannot split a ``pallas_call``): every head-indexed operand is
    split on its head axis, everything else replicated. The caller guarantees the heads are laid out
    so a rank's contiguous heads are self-contained: query heads with their KV heads (KV heads
    divide the axis), value heads with their key heads, SSD heads with their groups (groups divide
    the axis); ``models/sharding.py`` does."""
    return _setting(_shards, (mesh, axis))


def _head_specs(op: str, axis: str) -> tuple[tuple[Any, ...], Any]:
    """``(in_specs, out_specs)`` of the Pallas ops' positional arguments and results."""
    from jax.sharding import PartitionSpec as P

    tokens_heads, tokens_heads_dim = P(None, axis), P(None, axis, None)
    states = P(None, axis, None, None)
    if op == "gated_delta_chunked":  # q, k, v, g, beta, cu_seqlens, initial_state
        ins = (tokens_heads_dim,) * 3 + (tokens_heads,) * 2 + (P(), states)
        return ins, (tokens_heads_dim, states, states)
    if op == "ssd_chunked":  # x, dt, A, B, C, cu_seqlens, initial_state
        ins = (tokens_heads_dim, tokens_heads, P(axis), tokens_heads_dim, tokens_heads_dim, P(), states)
        return ins, (tokens_heads_dim, states, states)
    if op == "paged_attention":  # q, k_pages, v_pages, page_table, cu_seqlens, kv_lens
        pages = P(None, None, axis, None)
        return (tokens_heads_dim, pages, pages, P(), P(), P()), tokens_heads_dim
    raise KeyError(op)


def _sharded(op: str, impl: Callable[..., Any]) -> Callable[..., Any]:
    shards = _shards.get()
    if shards is None or shards[0].shape[shards[1]] == 1:
        return impl
    mesh, axis = shards
    in_specs, out_specs = _head_specs(op, axis)

    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) != len(in_specs):
            raise TypeError(f"{op} per shard takes its {len(in_specs)} array arguments positionally")
        pair_chunk = kwargs.pop("pair_chunk", None)  # per row, replicated: an operand, not a closure
        if pair_chunk is None:
            body = functools.partial(impl, **kwargs)
            return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(*args)

        def paired(*operands: Any) -> Any:
            return impl(*operands[:-1], pair_chunk=operands[-1], **kwargs)

        from jax.sharding import PartitionSpec

        specs = (*in_specs, PartitionSpec())
        return jax.shard_map(paired, mesh=mesh, in_specs=specs, out_specs=out_specs, check_vma=False)(*args, pair_chunk)

    return call


_REFERENCE: dict[str, Callable[..., Any]] = {
    "gated_delta_chunked": _gated_delta.gated_delta_chunked,
    "gated_delta_decode": _gated_delta.gated_delta_decode,
    "ssd_chunked": _ssd.ssd_chunked,
    "ssd_decode": _ssd.ssd_decode,
    "causal_conv1d": _conv.causal_conv1d,
    "causal_conv1d_update": _conv.causal_conv1d_update,
    "conv_states_at": _conv.conv_states_at,
    "paged_attention": _attention.paged_attention,
    "write_kv": _attention.write_kv,
}


_FAST: dict[str, Callable[..., Any]] = {
    "gated_delta_chunked": _fast.gated_delta_chunked,
    "gated_delta_decode": _fast.gated_delta_decode,
    "paged_attention": _fast.paged_attention,
}


def _pallas_impl(op: str) -> Callable[..., Any] | None:
    """The Pallas implementation of ``op`` for this platform, or None.

    Kernels: ``gated_delta_chunked``, ``ssd_chunked`` and ``paged_attention``
    (:mod:`radixflow_jax.kernels.pallas`). The variant follows :func:`platform`: ``tpu``
    -> Mosaic variant, ``gpu``/``cuda``/``rocm`` -> Triton variant; on ``cpu`` only when
    ``RADIXFLOW_PALLAS_INTERPRET=1`` (the TPU-structured variant in interpret mode, for tests),
    else None, so a forced ``pallas`` backend raises :class:`KernelUnavailableError`.

    The decode updates (``gated_delta_decode``, ``ssd_decode``), the convolutions
    (``causal_conv1d``, ``causal_conv1d_update``, ``conv_states_at``) and ``write_kv`` have no
    Pallas entry: each is one memory-bound pass (read the state / window once, write it once) with
    no reduction or reuse for a kernel to tile, which XLA fuses on TPU/GPU; ``write_kv`` is an
    in-place scatter into donated pools. On the CPU, where XLA did not fuse the decode update
    into one pass (docs/perf-log.md, "Native CPU kernels"), the Gated DeltaNet update of a
    decode-only call runs the native kernel instead (:func:`gated_delta_decode_window`).
    """
    kernels: dict[str, Callable[..., Any]] = {
        "gated_delta_chunked": _pallas_gated_delta.gated_delta_chunked,
        "ssd_chunked": _pallas_ssd.ssd_chunked,
        "paged_attention": _pallas_attention.paged_attention,
    }
    kernel = kernels.get(op)
    if kernel is None:
        return None
    target = platform()
    variant = _pallas_common.platform_backend(target)
    if variant is not None:
        return functools.partial(kernel, backend=variant)
    if target == "cpu" and pallas_interpret():
        return functools.partial(kernel, backend="tpu", interpret=True)
    return None


def pallas_interpret() -> bool:
    """``RADIXFLOW_PALLAS_INTERPRET=1``: Pallas kernels run in interpret mode on the CPU. Read when a
    program is traced, so it is part of what a compiled step depends on (``runner/step.CompiledStep``
    keys its shared executables on it; the backend itself is forced there by :func:`use_backend`)."""
    return os.environ.get("RADIXFLOW_PALLAS_INTERPRET") == "1"


# Ops that are jnp under every backend by design (see ``_pallas_impl``): forcing ``pallas`` does not
# make them fail, because there is no Pallas kernel to prefer; backends other than ``reference``
# serve them with their faster XLA formulation where one exists.
JNP_ONLY = frozenset(
    {"gated_delta_decode", "ssd_decode", "causal_conv1d", "causal_conv1d_update", "conv_states_at", "write_kv"}
)


def resolve(op: str) -> Callable[..., Any]:
    """The implementation of ``op`` under the selected backend."""
    backend = selected_backend()
    if backend == "reference":
        return _REFERENCE[op]
    if op in JNP_ONLY or backend == "xla":
        return _FAST.get(op, _REFERENCE[op])  # ops without a faster formulation: the reference is the XLA one
    impl = _pallas_impl(op)
    if impl is not None:
        return _sharded(op, impl)
    if backend == "pallas":
        raise KernelUnavailableError(f"RADIXFLOW_KERNELS=pallas but no Pallas kernel for '{op}' on this platform")
    return _FAST.get(op, _REFERENCE[op])


def gated_delta_chunked(*args: Any, **kwargs: Any) -> Any:
    """See ``kernels/gated_delta.gated_delta_chunked``. On the CPU under ``auto`` the native
    token-by-token scan serves it (``kernels/native``), as :func:`gated_delta_decode_window` does."""
    if len(args) == 7 and _native_serves_scan(args[2], "gated_delta_chunked", _native.MAX_VALUE_DIM):
        return _native.gated_delta_scan(*args, **kwargs)
    return resolve("gated_delta_chunked")(*args, **kwargs)


def _native_may_serve(op: str | None) -> bool:
    """Whether a native kernel may replace ``op`` here: backend ``auto``, no tensor-parallel trace,
    and no Pallas kernel for the platform (``op`` None: an op without one). The kernel's own shape
    conditions and :func:`_native.enabled` come after."""
    shards = _shards.get()
    if selected_backend() != "auto" or not (shards is None or shards[0].shape[shards[1]] == 1):
        return False
    if platform() != "cpu":  # a program traced for another platform (target_platform)
        return False
    return op is None or _pallas_impl(op) is None


def _native_serves_scan(values: Any, op: str, max_dim: int | None) -> bool:
    """``values``: the per-token values (``v [T, Hv, dv]``, or SSD's ``x [T, H, P]``); ``max_dim``:
    the kernel's limit on their last dim (the Gated DeltaNet step's scratch), or None."""
    fits = values.ndim == 3 and (max_dim is None or values.shape[-1] <= max_dim)
    return _native_may_serve(op) and fits and _native.enabled()


def gated_delta_decode(*args: Any, **kwargs: Any) -> Any:
    return resolve("gated_delta_decode")(*args, **kwargs)


def gated_delta_decode_window(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
    pool: jax.Array, base: jax.Array, real: jax.Array, *, scale: float | None = None,
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """The decode rows' update of the pool window ``[base, base + d)``: row ``r`` steps the state
    of slot ``base + r`` with :func:`gated_delta_decode` and writes it back when ``real[r]`` (a
    padding row leaves its slot as it was); ``(out [d, Hv, dv], pool)``, the pool updated in place
    when donated. On the CPU under ``auto`` the native kernel serves it (``kernels/native``,
    ``RADIXFLOW_NATIVE``); elsewhere, under any forced backend and under a tensor-parallel trace, it
    is the window slice, :func:`gated_delta_decode` and one ``dynamic_update_slice``."""
    if _native_may_serve(None) and _native.serves_window(v, pool) and _native.enabled():
        return _native.gated_delta_decode_window(q, k, v, g, beta, pool, base, real, scale=scale)
    window = jax.lax.dynamic_slice_in_dim(pool, base, v.shape[0], 0)
    out, new = gated_delta_decode(q, k, v, g, beta, window, scale=scale)
    keep = real.reshape((-1,) + (1,) * (window.ndim - 1))
    return out, jax.lax.dynamic_update_slice_in_dim(pool, jnp.where(keep, new.astype(pool.dtype), window), base, 0)


def linear(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w.T`` (``w [out, in]``, the HF layout). On the CPU under ``auto``, one device, float32,
    with 1 to 128 rows in ``x`` (a small round's tokens: ``_native.SMALL_MATMUL_ROWS``), the native
    kernel serves it, reading each weight from memory once; elsewhere XLA's matmul."""
    rows = 1
    for d in x.shape[:-1]:
        rows *= d
    lo, hi = _native.SMALL_MATMUL_ROWS
    if (
        lo <= rows <= hi and w.ndim == 2 and x.dtype == w.dtype == jnp.float32 and jax.device_count() == 1
        and _native_may_serve(None) and _native.enabled()
    ):  # fmt: skip
        y = _native.small_matmul(x.reshape(rows, x.shape[-1]), w)
        return y.reshape(*x.shape[:-1], w.shape[0])
    return x @ w.T


def trace_flags() -> tuple[bool, str, str]:
    """What a traced step depends on beyond its backend name: :func:`pallas_interpret`, the native
    kernels' mode and the :func:`platform` kernels are picked for (``runner/step.CompiledStep`` keys
    its shared executables on all three)."""
    return pallas_interpret(), _native.mode(), platform()


def ssd_chunked(*args: Any, **kwargs: Any) -> Any:
    """See ``kernels/ssd.ssd_chunked``. On the CPU under ``auto`` the native token-by-token scan
    serves it (``kernels/native``), as for :func:`gated_delta_chunked`."""
    if len(args) == 7 and _native_serves_scan(args[0], "ssd_chunked", None):
        return _native.ssd_scan(*args, **kwargs)
    return resolve("ssd_chunked")(*args, **kwargs)


def ssd_decode(*args: Any, **kwargs: Any) -> Any:
    return resolve("ssd_decode")(*args, **kwargs)


def causal_conv1d(*args: Any, **kwargs: Any) -> Any:
    return resolve("causal_conv1d")(*args, **kwargs)


def causal_conv1d_update(*args: Any, **kwargs: Any) -> Any:
    return resolve("causal_conv1d_update")(*args, **kwargs)


def conv_states_at(*args: Any, **kwargs: Any) -> Any:
    return resolve("conv_states_at")(*args, **kwargs)


def paged_attention(*args: Any, **kwargs: Any) -> Any:
    """See ``kernels/attention.paged_attention``. On the CPU under ``auto`` a native kernel serves it,
    as :func:`gated_delta_decode_window` does (a forced ``pallas`` still raises on the CPU): a call
    with one query token per row (decode rows, or the last layer's sampled tokens) the decode kernel,
    any other (prefill and mixed rounds) the block kernel, whose cost follows the keys each row reads."""
    if len(args) == 6 and _native_attention(*args[:4], **kwargs):
        if args[0].shape[0] == args[3].shape[0]:
            return _native.paged_attention_decode(*args, **kwargs)
        return _native.paged_attention_blocks(*args, **kwargs)
    return resolve("paged_attention")(*args, **kwargs)


def _native_attention(q: Any, k_pages: Any, v_pages: Any, page_table: Any, **kwargs: Any) -> bool:
    return (
        _native_may_serve("paged_attention")
        and _native.serves_attention(q, k_pages, v_pages, page_table, **kwargs)
        and _native.enabled()
    )


def write_kv(*args: Any, **kwargs: Any) -> Any:
    return resolve("write_kv")(*args, **kwargs)
