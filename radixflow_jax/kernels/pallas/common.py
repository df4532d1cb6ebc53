"""Shared plumbing of the Pallas kernels: backend variants, compiler params and in-kernel math.

Every Pallas kernel here exists in two lowering variants, chosen by a static ``backend`` argument:

* ``"tpu"`` (Mosaic): the grid runs *sequentially* on a core, so recurrent kernels put the chunk
  (or KV page) axis last as an ``"arbitrary"`` grid dimension, keep the running state in a VMEM
  scratch ref across grid steps, and read per-chunk metadata (row ids, reset flags, page tables)
  through scalar prefetch (``pltpu.PrefetchScalarGridSpec``) so that ``index_map``s can use them.
* ``"gpu"`` (Triton): grid programs run *concurrently* and there is no scalar prefetch and no
  persistent scratch, so each program loops over its chunks / pages in-kernel
  (``lax.fori_loop`` with the state as the loop carry) and reads metadata with scalar loads from
  ordinary int32 inputs. Triton also needs every array an op touches to have a power-of-two
  size, so chunk sizes, head dims, page sizes and block sizes must be powers of two.

Mosaic GPU is not targeted: the Triton lowering covers the same GPUs from the same kernel code.

Invariants:
  * In-kernel matmuls are float32 at ``Precision.HIGHEST`` (the references' numerics); inputs of
    any float dtype are cast to float32 after loading.
  * Kernels never reshape or bitcast refs (interpret mode cannot run that); all relayout happens
    in jnp around the ``pallas_call``.
  * ``interpret=True`` runs either variant on CPU (the variant then only fixes the grid and
    block structure, which is what the interpret-mode tests exercise).
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

Backend = Literal["tpu", "gpu"]
Ref = Any  # a Pallas kernel ref (its concrete class differs between lowerings and interpret mode)
BACKENDS: tuple[Backend, ...] = ("tpu", "gpu")

_HI = jax.lax.Precision.HIGHEST
_F32 = jnp.float32
NEG_INF = -1e30  # finite "minus infinity": fully masked rows stay free of NaN


def platform_backend(platform: str) -> Backend | None:
    """The kernel variant for a JAX platform name (``jax.default_backend()``), or None."""
    if platform == "tpu":
        return "tpu"
    if platform in ("gpu", "cuda", "rocm"):
        return "gpu"
    return None


def resolve_backend(backend: Backend | None, interpret: bool) -> Backend:
    """Validates ``backend``; None picks the current platform's variant (``"tpu"`` when interpreting on CPU)."""
    if backend is None:
        found = platform_backend(jax.default_backend())
        if found is None:
            if not interpret:
                raise ValueError(
                    f"no Pallas backend for platform {jax.default_backend()!r}; pass interpret=True to run on CPU"
                )
            found = "tpu"
        return found
    if backend not in BACKENDS:
        raise ValueError(f"Pallas backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    return backend


def compiler_params(backend: Backend, semantics: Sequence[str], num_warps: int = 4) -> Any:
    """Backend-specific compiler params; ``semantics`` are the TPU grid dimension semantics."""
    if backend == "tpu":
        return pltpu.CompilerParams(dimension_semantics=tuple(semantics))
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=2)


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def check_pow2(backend: Backend, **sizes: int) -> None:
    """Raises for the GPU (Triton) variant when a block dimension is not a power of two."""
    if backend != "gpu":
        return
    bad = {name: size for name, size in sizes.items() if not is_pow2(size)}
    if bad:
        raise ValueError(f"the Triton (gpu) Pallas variant needs power-of-two block dims; got {bad}")


def pick_block(dim: int, block: int | None) -> int:
    """A block size that divides ``dim`` (``dim`` itself when ``block`` is None or too large)."""
    if block is None or block >= dim:
        return dim
    if dim % block:
        raise ValueError(f"block size {block} does not divide dimension {dim}")
    return block


def mm(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """``a @ b`` in float32 at full precision (``[m, k] x [k, n]``)."""
    return jnp.dot(a, b, precision=_HI, preferred_element_type=_F32)


def mm_nt(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """``a @ b.T`` (``[m, k] x [n, k] -> [m, n]``) without materialising a transpose."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=_HI, preferred_element_type=_F32)


def mm_tn(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """``a.T @ b`` (``[k, m] x [k, n] -> [m, n]``) without materialising a transpose."""
    return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), precision=_HI, preferred_element_type=_F32)


def causal_mask(size: int) -> jnp.ndarray:
    """``[size, size]`` bool, true where column <= row (built from 2-D iotas, legal in every lowering)."""
    rows = jax.lax.broadcasted_iota(jnp.int32, (size, size), 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, (size, size), 1)
    return cols <= rows


def last_of_column(col: jnp.ndarray) -> jnp.ndarray:
    """``col[-1:, :]`` of a ``[n, 1]`` value as a ``[1, 1]`` value, via a masked sum (no value slicing)."""
    n = col.shape[0]
    idx = jax.lax.broadcasted_iota(jnp.int32, col.shape, 0)
    return jnp.sum(jnp.where(idx == n - 1, col, 0.0), axis=0, keepdims=True)


def decay_matrix(col: jnp.ndarray, row: jnp.ndarray) -> jnp.ndarray:
    """``exp(col_i - row_j)`` for ``j <= i`` else 0, from ``[n, 1]`` and ``[1, n]`` cumulative log-decays.

    The exponent is masked *before* ``exp`` so the (discarded) upper triangle cannot overflow.
    """
    causal = causal_mask(col.shape[0])
    return jnp.where(causal, jnp.exp(jnp.where(causal, col - row, 0.0)), 0.0)
