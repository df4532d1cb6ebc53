"""Whole-model logits with RADIXFLOW_KERNELS=pallas (interpret mode on CPU) equal the reference."""

from __future__ import annotations

import numpy as np
import pytest

from radixflow_jax.kernels import ops
from radixflow_jax.models import load


@pytest.mark.parametrize("preset", ["tiny-qwen3.5", "tiny-bamba"])
def test_model_logits_pallas_equal_reference(preset: str, monkeypatch) -> None:
    ids = list(range(3, 43))  # 40 tokens: crosses no chunk boundary issues, keeps grids small
    model = load(preset)
    with ops.use_backend("reference"):
        ref = model.logits(ids)
    monkeypatch.setenv("RADIXFLOW_PALLAS_INTERPRET", "1")
    with ops.use_backend("pallas"):
        assert "pallas" in getattr(ops.resolve("paged_attention"), "func", ops.resolve("paged_attention")).__module__
        fresh = load(preset)  # a new jit so the kernels are traced under the forced backend
        got = fresh.logits(ids)
    assert np.abs(got - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))
