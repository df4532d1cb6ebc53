"""Dispatch of the Pallas kernels through :mod:`radixflow_jax.kernels.ops` on CPU.

On CPU a Pallas kernel exists only in interpret mode, opted into by RADIXFLOW_PALLAS_INTERPRET=1;
without it a forced ``pallas`` backend must raise instead of silently falling back.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from radixflow_jax.kernels import ops
from radixflow_jax.kernels import ssd as ref_ssd
from radixflow_jax.kernels.pallas import gated_delta as pallas_gd
from radixflow_jax.kernels.pallas import paged_attention as pallas_attn
from radixflow_jax.kernels.pallas import ssd as pallas_ssd
from tests.kernels.pallas.test_ssd import make_inputs as ssd_inputs

PALLAS_OPS = {
    "gated_delta_chunked": pallas_gd.gated_delta_chunked,
    "ssd_chunked": pallas_ssd.ssd_chunked,
    "paged_attention": pallas_attn.paged_attention,
}

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU dispatch rules")


def test_forced_pallas_without_interpret_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXFLOW_KERNELS", "pallas")
    monkeypatch.delenv("RADIXFLOW_PALLAS_INTERPRET", raising=False)
    for op in PALLAS_OPS:
        with pytest.raises(ops.KernelUnavailableError):
            ops.resolve(op)


def test_auto_without_interpret_uses_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXFLOW_KERNELS", raising=False)
    monkeypatch.delenv("RADIXFLOW_PALLAS_INTERPRET", raising=False)
    assert ops.resolve("ssd_chunked") is ref_ssd.ssd_chunked


@pytest.mark.parametrize("op", sorted(PALLAS_OPS))
def test_interpret_env_resolves_to_pallas(monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    monkeypatch.setenv("RADIXFLOW_KERNELS", "pallas")
    monkeypatch.setenv("RADIXFLOW_PALLAS_INTERPRET", "1")
    impl = ops.resolve(op)
    assert isinstance(impl, functools.partial)
    assert impl.func is PALLAS_OPS[op]
    assert impl.keywords == {"backend": "tpu", "interpret": True}


def test_decode_and_conv_ops_stay_jnp_under_every_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """They have no Pallas kernel by design, so forcing pallas serves them with jnp, the faster XLA
    formulation where one exists (the whole model can run under RADIXFLOW_KERNELS=pallas)."""
    monkeypatch.setenv("RADIXFLOW_KERNELS", "pallas")
    monkeypatch.setenv("RADIXFLOW_PALLAS_INTERPRET", "1")
    for op in sorted(ops.JNP_ONLY):
        assert ops.resolve(op) is ops._FAST.get(op, ops._REFERENCE[op])
    assert ops.resolve("gated_delta_decode") is ops._FAST["gated_delta_decode"]


def test_ops_call_runs_the_interpreted_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end through ``ops.ssd_chunked``: the interpreted kernel equals the reference."""
    args = ssd_inputs(4, (3, 0, 10), 2)
    want = jax.jit(functools.partial(ref_ssd.ssd_chunked, chunk_size=8))(*args)
    monkeypatch.setenv("RADIXFLOW_KERNELS", "pallas")
    monkeypatch.setenv("RADIXFLOW_PALLAS_INTERPRET", "1")
    got = jax.jit(functools.partial(ops.ssd_chunked, chunk_size=8))(*args)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), atol=1e-4, rtol=1e-4)
