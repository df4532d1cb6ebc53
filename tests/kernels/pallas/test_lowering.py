"""Both lowering variants of every Pallas kernel lower for their real platform, from a CPU host.

``jax.export`` lowers for a platform that is not present: the ``"tpu"`` variant goes through the
Pallas Mosaic lowering (block-shape rules, scalar prefetch, grid semantics) and the ``"gpu"``
variant through the Pallas Triton lowering (power-of-two tensors, supported ops). The device
compilers themselves (libtpu's Mosaic passes, Triton's PTX backend) only run on real hardware,
so this catches lowering errors, not device compile errors. Shapes are serving-sized.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import pytest

from radixflow_jax.kernels.pallas import gated_delta, paged_attention, ssd

S = jax.ShapeDtypeStruct
BF16, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32
T, R = 256, 4
PLATFORM = {"tpu": "tpu", "gpu": "cuda"}


def _gated_delta(backend: str) -> tuple[Callable[..., Any], tuple]:
    hk, hv, dk, dv = 2, 4, 128, 128
    args = (S((T, hk, dk), BF16), S((T, hk, dk), BF16), S((T, hv, dv), BF16), S((T, hv), F32), S((T, hv), F32))
    args += (S((R + 1,), I32), S((R, hv, dk, dv), F32))
    block_v = 64 if backend == "gpu" else None
    return functools.partial(gated_delta.gated_delta_chunked, chunk_size=64, backend=backend, block_v=block_v), args


def _ssd(backend: str) -> tuple[Callable[..., Any], tuple]:
    heads, groups, p, n = 8, 2, 64, 128
    args = (S((T, heads, p), BF16), S((T, heads), F32), S((heads,), F32), S((T, groups, n), BF16))
    args += (S((T, groups, n), BF16), S((R + 1,), I32), S((R, heads, p, n), F32))
    return functools.partial(ssd.ssd_chunked, chunk_size=64, backend=backend), args


def _attention(backend: str) -> tuple[Callable[..., Any], tuple]:
    hq, hkv, d, pages, page_size, max_pages = 8, 2, 128, 64, 16, 16
    pool = S((pages, page_size, hkv, d), BF16)
    args = (S((T, hq, d), BF16), pool, pool, S((R, max_pages), I32), S((R + 1,), I32), S((R,), I32))
    kernel = functools.partial(
        paged_attention.paged_attention,
        scale=d**-0.5,
        sliding_window=128,
        logit_soft_cap=30.0,
        backend=backend,
        block_q=16,
    )
    return kernel, args


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
@pytest.mark.parametrize("build", [_gated_delta, _ssd, _attention], ids=["gated_delta", "ssd", "attention"])
def test_lowers_for_platform(build: Callable[[str], tuple[Callable[..., Any], tuple]], backend: str) -> None:
    kernel, args = build(backend)
    triton_call = jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
    exported = jax.export.export(jax.jit(kernel), platforms=[PLATFORM[backend]], disabled_checks=[triton_call])(*args)
    text = exported.mlir_module()
    assert ("tpu_custom_call" in text) if backend == "tpu" else ("triton" in text)
