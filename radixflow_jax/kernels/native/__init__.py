"""Native CPU kernels: C++ sources in this folder, built on first use and called through the XLA FFI.

Four kernels, each sharing its work over XLA's intra-op threads:
  * ``gated_delta_decode.cc``: the decode rows' Gated DeltaNet update of a window of a state pool,
    in place (:func:`gated_delta_decode_window`). XLA:CPU splits that update into a batched
    matrix-vector fusion, a materialised decayed state and a single-threaded in-place write of the
    window; the kernel reads each state once and writes it once.
  * ``paged_attention.cc``: paged attention with one query token per row
    (:func:`paged_attention_decode`), where XLA runs a loop over page-table columns with a gather
    per step on one thread.
  * ``gated_delta_scan.cc``: the prefill rows' Gated DeltaNet recurrence token by token
    (:func:`gated_delta_scan`, the contract of ``gated_delta_chunked`` with ``pair_chunk``), each
    (row, head) keeping its state in a local buffer; XLA's chunked form spends its time in small
    matmuls, chunk gathers and loops there.
  * ``ssd_scan.cc``: the same for Mamba2's SSD recurrence (:func:`ssd_scan`, the contract of
    ``ssd_chunked``), where the CPU had only the reference's chunked form.
docs/performance.md, section "Native decode kernels", has the measurements.

``RADIXFLOW_NATIVE`` says whether the step uses them: ``auto`` (default) builds them where a C++
compiler is found and warns once, naming the reason, where it cannot (the step then runs the XLA
formulations, ``kernels/fast.py``); ``1`` requires them on the CPU (:class:`NativeUnavailableError`
otherwise; other platforms never use them); ``0`` turns them off. ``kernels/ops.py`` decides per
call site at trace time, and the compiled step keys on :func:`mode`.

Invariants:
  * The built library lives in ``$RADIXFLOW_CACHE/native/<key>/``; the key hashes the sources, the
    compiler's version, the flags, jaxlib's version and FFI headers, and the CPU's flags
    (``-march=native``), so a cached library never runs on a CPU or a jaxlib it was not built for.
    A build writes a temporary file and renames it, so concurrent processes never load a
    half-written library.
  * The FFI target is registered once per process (the registry is XLA's, process-wide), by
    :func:`_load`, which is memoised for that reason.
  * Each kernel has the contract of its reference (``kernels/gated_delta.gated_delta_decode`` on the
    window, ``kernels/attention.paged_attention``, ``gated_delta_chunked``, ``ssd_chunked``) and
    is tested against it or the per-token oracle
    (``tests/kernels/test_native.py``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from radixflow_jax.paths import cache_root

TARGET = "radixflow_gated_delta_decode_window"
ATTENTION_TARGET = "radixflow_paged_attention_decode"
SCAN_TARGET = "radixflow_gated_delta_scan"
SSD_TARGET = "radixflow_ssd_scan"
TARGETS = {
    TARGET: "RadixflowGatedDeltaDecodeWindow",
    ATTENTION_TARGET: "RadixflowPagedAttentionDecode",
    SCAN_TARGET: "RadixflowGatedDeltaScan",
    SSD_TARGET: "RadixflowSsdScan",
}
SOURCES = tuple(
    Path(__file__).with_name(n)
    for n in ("gated_delta_decode.cc", "paged_attention.cc", "gated_delta_scan.cc", "ssd_scan.cc")
)
HEADERS = (Path(__file__).with_name("common.h"),)  # the work-sharing runner and the one-token delta rule
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC", "-w")
MAX_VALUE_DIM = 512  # the kernel's per-head scratch (kMaxValueDim in the source)
MODES = ("auto", "1", "0")


class NativeUnavailableError(RuntimeError):
    """``RADIXFLOW_NATIVE=1`` but the native kernels cannot be built or loaded here."""


def mode() -> str:
    """``RADIXFLOW_NATIVE``: ``auto`` (default), ``1`` (required) or ``0`` (off)."""
    value = os.environ.get("RADIXFLOW_NATIVE", "auto")
    if value not in MODES:
        raise ValueError(f"RADIXFLOW_NATIVE={value!r}: expected one of {', '.join(MODES)}")
    return value


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), platform.processor())
    except OSError:
        return platform.processor()


def _build(compiler: str) -> Path:
    include = jax.ffi.include_dir()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    api = Path(include) / "xla" / "ffi" / "api"
    headers = b"".join(h.read_bytes() for h in sorted(api.glob("*.h"))) + jaxlib.__version__.encode()
    digest = hashlib.sha256()
    sources = b"".join(src.read_bytes() for src in (*SOURCES, *HEADERS))
    for part in (sources, version.encode(), " ".join(FLAGS).encode(), headers, _cpu_flags().encode()):
        digest.update(hashlib.sha256(part).digest())
    target = Path(cache_root()) / "native" / digest.hexdigest()[:16] / "libradixflow_native.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        cmd = [compiler, *FLAGS, f"-I{include}", *map(str, SOURCES), "-o", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise NativeUnavailableError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        os.chmod(tmp, 0o755)  # mkstemp's 0600 would keep other users of a shared cache out
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.cache
def _load() -> str | None:
    """Builds (or finds) the library and registers its FFI target; ``None`` on success, else why not."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        return "no C++ compiler (g++, c++, clang++ or $CXX) on PATH"
    try:
        lib = ctypes.cdll.LoadLibrary(str(_build(compiler)))
        for target, symbol in TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    except (OSError, subprocess.SubprocessError, NativeUnavailableError, AttributeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@functools.cache
def _warn_once(reason: str) -> None:
    warnings.warn(
        f"native CPU kernels unavailable ({reason}); the step runs the XLA formulation. "
        "Set RADIXFLOW_NATIVE=0 to silence this or RADIXFLOW_NATIVE=1 to make it an error.",
        RuntimeWarning,
        stacklevel=3,
    )


def enabled() -> bool:
    """Whether a step traced now on this platform uses the native kernels (see the module docstring)."""
    want = mode()
    if want == "0" or jax.default_backend() != "cpu":
        return False
    reason = _load()
    if reason is None:
        return True
    if want == "1":
        raise NativeUnavailableError(f"RADIXFLOW_NATIVE=1 but the native kernels cannot be used: {reason}")
    _warn_once(reason)
    return False


def available() -> bool:
    """Whether the kernels can run here: not turned off, on the CPU, and built and registered
    (builds them on first call; unlike :func:`enabled` it neither warns nor raises)."""
    return mode() != "0" and jax.default_backend() == "cpu" and _load() is None


def _require() -> None:
    """Builds and registers the kernels before a direct call traces one of them."""
    reason = _load()
    if reason is not None:
        raise NativeUnavailableError(f"the native kernels cannot be used: {reason}")


def serves_window(v: jax.Array, pool: jax.Array) -> bool:
    """Shapes and dtypes the kernel takes: a float32 pool and a value head dim within its scratch."""
    return pool.dtype == jnp.float32 and pool.ndim == 4 and v.shape[-1] <= MAX_VALUE_DIM


def gated_delta_decode_window(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
    pool: jax.Array, base: jax.Array, real: jax.Array, *, scale: float | None = None,
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """``ops.gated_delta_decode_window`` on the native kernel: decode row ``r`` updates slot
    ``base + r`` of ``pool [S, Hv, dk, dv]`` in place when ``real[r]`` (``q, k [d, Hk, dk]``,
    ``v [d, Hv, dv]``, ``g, beta [d, Hv]``; ``0 <= base <= S - d``); returns ``(out [d, Hv, dv] in
    v.dtype, pool)``. ``ops`` calls it where :func:`enabled` and :func:`serves_window` hold."""
    _require()
    d, heads, dv = v.shape
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    f32 = jnp.float32
    call = jax.ffi.ffi_call(
        TARGET,
        (jax.ShapeDtypeStruct((d, heads, dv), f32), jax.ShapeDtypeStruct(pool.shape, pool.dtype)),
        input_output_aliases={7: 1},
    )
    out, pool = call(
        jnp.reshape(jnp.asarray(base, jnp.int32), (1,)), real.astype(jnp.int32),
        q.astype(f32), k.astype(f32), v.astype(f32), g.astype(f32), beta.astype(f32), pool,
        scale=np.float32(scale),
    )  # fmt: skip
    return out.astype(v.dtype), pool


def serves_attention(
    q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array,
    sliding_window: int | None = None, logit_soft_cap: float | None = None, **_: object,
) -> bool:  # fmt: skip
    """What :func:`paged_attention_decode` takes: one query token per row, float32 pages, and a
    window and a soft cap that are absent or positive (the kernel reads 0 as absent)."""
    return (
        q.ndim == 3 and k_pages.ndim == 4 and q.shape[0] == page_table.shape[0]
        and k_pages.dtype == v_pages.dtype == jnp.float32 and q.shape[-1] == k_pages.shape[-1]
        and (sliding_window is None or sliding_window > 0) and (logit_soft_cap is None or logit_soft_cap > 0)
    )  # fmt: skip


def paged_attention_decode(
    q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array, cu_seqlens: jax.Array,
    kv_lens: jax.Array, *, scale: float, sliding_window: int | None = None, logit_soft_cap: float | None = None,
) -> jax.Array:  # fmt: skip
    """``ops.paged_attention`` on the native kernel, for calls with one query token per row
    (``q [R, Hq, D]``, ``page_table [R, M]``; :func:`serves_attention`): the contract of
    ``kernels/attention.paged_attention``, output in ``q``'s dtype."""
    _require()
    call = jax.ffi.ffi_call(ATTENTION_TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32))
    out = call(
        q.astype(jnp.float32), k_pages, v_pages, jnp.asarray(page_table, jnp.int32),
        jnp.asarray(cu_seqlens, jnp.int32), jnp.asarray(kv_lens, jnp.int32),
        scale=np.float32(scale), window=np.int64(sliding_window or 0), soft_cap=np.float32(logit_soft_cap or 0.0),
    )  # fmt: skip
    return out.astype(q.dtype)


def _scan(
    target: str, values: jax.Array, per_token: tuple[jax.Array, ...], cu_seqlens: jax.Array, initial_state: jax.Array,
    chunk_size: int, pair_chunk: jax.Array | None, **attrs: object,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """The FFI call of a scan kernel: operands ``(*per_token, cu_seqlens, initial_state, pair)``,
    results ``(out like values [T, H, D], final [R, ...], chunk_states [N, ...])`` in float32."""
    _require()
    from radixflow_jax.kernels.layout import num_chunks_for

    f32 = jnp.float32
    rows, block = initial_state.shape[0], initial_state.shape[1:]
    shapes = (
        jax.ShapeDtypeStruct(values.shape, f32),
        jax.ShapeDtypeStruct((rows, *block), f32),
        jax.ShapeDtypeStruct((num_chunks_for(values.shape[0], rows, chunk_size), *block), f32),
    )
    pair = jnp.full((rows,), -1, jnp.int32) if pair_chunk is None else jnp.asarray(pair_chunk, jnp.int32)
    return jax.ffi.ffi_call(target, shapes)(
        *(jnp.asarray(x, f32) for x in per_token), jnp.asarray(cu_seqlens, jnp.int32),
        jnp.asarray(initial_state, f32), pair, chunk=np.int64(chunk_size), **attrs,
    )  # fmt: skip


def gated_delta_scan(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, cu_seqlens: jax.Array,
    initial_state: jax.Array, *, chunk_size: int = 64, scale: float | None = None, pair_chunk: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """``ops.gated_delta_chunked`` on the native kernel (the contract of
    ``kernels/gated_delta.gated_delta_chunked``): the recurrence token by token, each (row, head)
    holding its state in a local buffer, checkpoints written at the chunk grid; unused chunks are 0."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    out, final, chunks = _scan(
        SCAN_TARGET, v, (q, k, v, g, beta), cu_seqlens, initial_state, chunk_size, pair_chunk, scale=np.float32(scale)
    )
    return out.astype(v.dtype), final, chunks


def ssd_scan(
    x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array, cu_seqlens: jax.Array,
    initial_state: jax.Array, *, chunk_size: int = 64, pair_chunk: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """``ops.ssd_chunked`` on the native kernel (the contract of ``kernels/ssd.ssd_chunked``): the
    recurrence token by token, checkpoints at the chunk grid; unused chunks are 0."""
    from radixflow_jax.kernels.ssd import _check_shapes

    _check_shapes(x, dt, A, B, C)  # the reference's checks, at trace time
    y, final, chunks = _scan(SSD_TARGET, x, (x, dt, A, B, C), cu_seqlens, initial_state, chunk_size, pair_chunk)
    return y.astype(x.dtype), final, chunks
