"""Native CPU kernels: C++ sources in this folder, built on first use and called through the XLA FFI.

Six kernels, each sharing its work over XLA's intra-op threads:
  * ``gated_delta_decode.cc``: the decode rows' Gated DeltaNet update of a window of a state pool,
    in place (:func:`gated_delta_decode_window`). XLA:CPU splits that update into a batched
    matrix-vector fusion, a materialised decayed state and a single-threaded in-place write of the
    window; the kernel reads each state once and writes it once.
  * ``paged_attention.cc``: paged attention with one query token per row
    (:func:`paged_attention_decode`), where XLA runs a loop over page-table columns with a gather
    per step on one thread.
  * ``paged_attention_blocks.cc``: paged attention for rows with any number of query tokens
    (:func:`paged_attention_blocks`): a task per (block of consecutive tokens of one row, KV head)
    reads only the keys its block attends to, where XLA's loop runs every block over the longest
    row's columns.
  * ``gated_delta_scan.cc``: the prefill rows' Gated DeltaNet recurrence token by token
    (:func:`gated_delta_scan`, the contract of ``gated_delta_chunked`` with ``pair_chunk``), each
    (row, head) keeping its state in a local buffer; XLA's chunked form spends its time in small
    matmuls, chunk gathers and loops there.
  * ``ssd_scan.cc``: the same for Mamba2's SSD recurrence (:func:`ssd_scan`, the contract of
    ``ssd_chunked``), where the CPU had only the reference's chunked form.
  * ``small_matmul.cc``: ``x @ w.T`` for 1 to 128 rows (:func:`small_matmul`, ``ops.linear``) as
    dot products along K in register tiles of weight rows by rows of ``x``, each weight read from
    memory once (prefetched a tile ahead), where XLA:CPU's matmul reads the weights at a third to
    two thirds of the memory floor.
docs/perf-log.md, section "Native CPU kernels", has the measurements.

``RADIXFLOW_NATIVE`` says whether the step uses them: ``auto`` (default) builds them where a C++
compiler is found and warns once, naming the reason, where it cannot (the step then runs the XLA
formulations, ``kernels/fast.py``); ``1`` requires them on the CPU (:class:`NativeUnavailableError`
otherwise; other platforms never use them); ``0`` turns them off. ``kernels/ops.py`` decides per
call site at trace time, and the compiled step keys on :func:`mode`.

Invariants:
  * The built library lives in ``$RADIXFLOW_CACHE/native/<key>/``; the key (:func:`build_key`) hashes
    the sources and every header of this folder (a changed header rebuilds), the compiler's version,
    the flags, jaxlib's version and FFI headers, and the CPU's flags (``-march=native``), so a cached
    library never runs on a CPU or a jaxlib it was not built for.
    A build writes a temporary file and renames it, so concurrent processes never load a
    half-written library.
  * One table, :data:`KERNELS`, names each kernel's source, handler symbol, FFI target and operand
    dtypes; the build, the registration and every call (:func:`_call`) read it, so a kernel is
    added in one place.
  * The FFI targets are registered once per process (the registry is XLA's, process-wide), by
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
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from radixflow_jax.paths import cache_root

_DTYPES = {"f": jnp.float32, "i": jnp.int32}  # a Kernel.operands letter -> the dtype its Arg binds


class Kernel(NamedTuple):
    """One C++ kernel as the FFI sees it: its source file, the handler symbol that file exports and
    the FFI target it is registered as.

    Invariant: ``operands`` has one letter per operand dtype of the handler's binding in ``source``
    (``BindKernel<results, dtypes...>`` or ``BindScan`` in ``common.h``), in order: ``f`` (``F32``;
    :func:`_call` casts to float32), ``i`` (``S32``; cast to int32) or ``=`` (``F32`` passed as it
    is: a buffer the caller has checked is float32, such as an aliased pool). Every result is an
    ``F32`` buffer."""

    source: str
    symbol: str
    target: str
    operands: str


WINDOW = Kernel(
    "gated_delta_decode.cc",
    "RadixflowGatedDeltaDecodeWindow",
    "radixflow_gated_delta_decode_window",
    operands="iifffff=",  # base, real, q, k, v, g, beta, pool (aliased to the second result)
)
ATTENTION = Kernel(
    "paged_attention.cc",
    "RadixflowPagedAttentionDecode",
    "radixflow_paged_attention_decode",
    operands="f==iii",  # q, k_pages, v_pages, page_table, cu_seqlens, kv_lens
)
BLOCKS = Kernel(
    "paged_attention_blocks.cc",
    "RadixflowPagedAttentionBlocks",
    "radixflow_paged_attention_blocks",
    operands="f==iii",  # q, k_pages, v_pages, page_table, cu_seqlens, kv_lens
)
SCAN = Kernel(
    "gated_delta_scan.cc",
    "RadixflowGatedDeltaScan",
    "radixflow_gated_delta_scan",
    operands="fffffifi",  # q, k, v, g, beta, cu_seqlens, initial_state, pair
)
SSD = Kernel(
    "ssd_scan.cc",
    "RadixflowSsdScan",
    "radixflow_ssd_scan",
    operands="fffffifi",  # x, dt, A, B, C, cu_seqlens, initial_state, pair
)
MATMUL = Kernel(
    "small_matmul.cc",
    "RadixflowSmallMatmul",
    "radixflow_small_matmul",
    operands="ff",  # x, w
)
KERNELS = (WINDOW, ATTENTION, BLOCKS, SCAN, SSD, MATMUL)  # the build compiles their sources in this order (part of the key)
SOURCES = tuple(Path(__file__).with_name(kernel.source) for kernel in KERNELS)
# every header of this folder (common.h: the binding, the work-sharing runner, the delta rule, the scans'
# layout and phases); part of the build key, so a changed or added header rebuilds the library
HEADERS = tuple(sorted(Path(__file__).parent.glob("*.h")))
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC", "-w")
MAX_VALUE_DIM = 512  # the kernel's per-head scratch (kMaxValueDim in the source)
# rows small_matmul.cc serves: where it beat XLA:CPU's matmul on hybrid-81m's MLP weights (36 x 2048 x
# 768 f32, tools/perf/small_dot.py, 2026-12-07 18:33-18:37 on an Intel Xeon, with its four-at-once
# sums and four blocks per task): 0.62-0.76x at 1-16 rows, 0.80-0.93x at 32-128; 0.98x at 192 and
# 1.05-1.06x at 256-512 stay XLA's (docs/perf-log.md)
SMALL_MATMUL_ROWS = (1, 128)
BLOCK_Q = 16  # query tokens per block of paged_attention_blocks.cc (measured: docs/perf-log.md)
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


def build_key(compiler: str) -> str:
    """The library's cache key: a hash of :data:`SOURCES` and :data:`HEADERS` (their bytes), the
    compiler's version, :data:`FLAGS`, jaxlib's version and FFI headers, and the CPU's flags."""
    api = Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api"
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    headers = b"".join(h.read_bytes() for h in sorted(api.glob("*.h"))) + jaxlib.__version__.encode()
    digest = hashlib.sha256()
    sources = b"".join(src.read_bytes() for src in (*SOURCES, *HEADERS))
    for part in (sources, version.encode(), " ".join(FLAGS).encode(), headers, _cpu_flags().encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def _build(compiler: str) -> Path:
    include = jax.ffi.include_dir()
    target = Path(cache_root()) / "native" / build_key(compiler) / "libradixflow_native.so"
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
        for kernel in KERNELS:
            jax.ffi.register_ffi_target(kernel.target, jax.ffi.pycapsule(getattr(lib, kernel.symbol)), platform="cpu")
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


def _call(
    kernel: Kernel, operands: Sequence[jax.typing.ArrayLike], shapes: Sequence[tuple[int, ...]], out_dtype: jnp.dtype,
    *, aliases: dict[int, int] | None = None, **attrs: object,
) -> list[jax.Array]:  # fmt: skip
    """The one FFI call path: builds and registers the library if needed (:func:`_require`), casts
    ``operands`` as ``kernel.operands`` says, and runs ``kernel`` with float32 results of ``shapes``
    (``aliases``: operand index -> result index updated in place) and scalar ``attrs``. Returns the
    results, the first (the per-token output) cast to ``out_dtype``, the rest (states) float32."""
    _require()
    if len(operands) != len(kernel.operands):
        raise TypeError(f"{kernel.target} takes {len(kernel.operands)} operands, got {len(operands)}")
    cast = [x if code == "=" else jnp.asarray(x, _DTYPES[code]) for code, x in zip(kernel.operands, operands)]
    results = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes]
    out, *rest = jax.ffi.ffi_call(kernel.target, results, input_output_aliases=aliases)(*cast, **attrs)
    return [out.astype(out_dtype), *rest]


def _scale(q: jax.Array, scale: float | None) -> np.float32:
    """The ``scale`` attribute: the given query scale, or ``dk ** -0.5``."""
    return np.float32(q.shape[-1] ** -0.5 if scale is None else scale)


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
    operands = (jnp.reshape(jnp.asarray(base, jnp.int32), (1,)), real, q, k, v, g, beta, pool)
    out, pool = _call(WINDOW, operands, (v.shape, pool.shape), v.dtype, aliases={7: 1}, scale=_scale(q, scale))
    return out, pool


def serves_attention(
    q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array,
    sliding_window: int | None = None, logit_soft_cap: float | None = None, **_: object,
) -> bool:  # fmt: skip
    """What :func:`paged_attention_decode` (one query token per row) and :func:`paged_attention_blocks`
    (any number) take: float32 pages, and a
    window and a soft cap that are absent or positive (the kernel reads 0 as absent)."""
    return (
        q.ndim == 3 and k_pages.ndim == 4
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
    (out,) = _call(
        ATTENTION, (q, k_pages, v_pages, page_table, cu_seqlens, kv_lens), (q.shape,), q.dtype,
        scale=np.float32(scale), window=np.int64(sliding_window or 0), soft_cap=np.float32(logit_soft_cap or 0.0),
    )  # fmt: skip
    return out


def paged_attention_blocks(
    q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array, cu_seqlens: jax.Array,
    kv_lens: jax.Array, *, scale: float, sliding_window: int | None = None, logit_soft_cap: float | None = None,
    block_q: int = BLOCK_Q,
) -> jax.Array:  # fmt: skip
    """``ops.paged_attention`` on the native kernel over query blocks, for rows with any number of
    query tokens (``q [T, Hq, D]``; :func:`serves_attention`): the contract of
    ``kernels/attention.paged_attention``, output in ``q``'s dtype. Each (block of up to ``block_q``
    consecutive tokens of one row, KV head) reads only the keys its block attends to."""
    (out,) = _call(
        BLOCKS, (q, k_pages, v_pages, page_table, cu_seqlens, kv_lens), (q.shape,), q.dtype,
        scale=np.float32(scale), window=np.int64(sliding_window or 0), soft_cap=np.float32(logit_soft_cap or 0.0),
        block=np.int64(block_q),
    )  # fmt: skip
    return out


def _scan(
    kernel: Kernel, values: jax.Array, per_token: tuple[jax.Array, ...], cu_seqlens: jax.Array,
    initial_state: jax.Array, chunk_size: int, pair_chunk: jax.Array | None, **attrs: object,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """A scan kernel's call: operands ``(*per_token, cu_seqlens, initial_state, pair)``, results
    ``(out like values [T, H, D] in values.dtype, final [R, ...], chunk_states [N, ...])``, the
    states float32; no pairing is ``pair = -1`` for every row."""
    from radixflow_jax.kernels.layout import num_chunks_for

    rows, block = initial_state.shape[0], initial_state.shape[1:]
    chunks = num_chunks_for(values.shape[0], rows, chunk_size)
    pair = jnp.full((rows,), -1, jnp.int32) if pair_chunk is None else pair_chunk
    out, final, states = _call(
        kernel, (*per_token, cu_seqlens, initial_state, pair), (values.shape, (rows, *block), (chunks, *block)),
        values.dtype, chunk=np.int64(chunk_size), **attrs,
    )  # fmt: skip
    return out, final, states


def gated_delta_scan(
    q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array, cu_seqlens: jax.Array,
    initial_state: jax.Array, *, chunk_size: int = 64, scale: float | None = None, pair_chunk: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """``ops.gated_delta_chunked`` on the native kernel (the contract of
    ``kernels/gated_delta.gated_delta_chunked``): the recurrence token by token, each (row, head)
    holding its state in a local buffer, checkpoints written at the chunk grid; unused chunks are 0."""
    return _scan(SCAN, v, (q, k, v, g, beta), cu_seqlens, initial_state, chunk_size, pair_chunk, scale=_scale(q, scale))


def ssd_scan(
    x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array, cu_seqlens: jax.Array,
    initial_state: jax.Array, *, chunk_size: int = 64, pair_chunk: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """``ops.ssd_chunked`` on the native kernel (the contract of ``kernels/ssd.ssd_chunked``): the
    recurrence token by token, checkpoints at the chunk grid; unused chunks are 0."""
    from radixflow_jax.kernels.ssd import check_shapes

    check_shapes(x, dt, A, B, C)  # the reference's checks, at trace time
    return _scan(SSD, x, (x, dt, A, B, C), cu_seqlens, initial_state, chunk_size, pair_chunk)


def small_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w.T`` (``x [M, K]``, ``w [N, K]``, float32) on the native kernel, each weight read from
    memory once; for the matmuls of small rounds (``ops.linear``)."""
    (out,) = _call(MATMUL, (x, w), ((x.shape[0], w.shape[0]),), x.dtype)
    return out
