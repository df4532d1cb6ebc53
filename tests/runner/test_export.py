"""The whole jitted round lowers for GPU and TPU from this CPU host (``runner/export.py``), at a
reduced size: the tiny Gated DeltaNet and Mamba2 hybrids in bf16, a decode, a prefill and a mixed
variant each, with the platform's Pallas kernels selected by ``ops.target_platform``. The full
serving-size export (Qwen3.5-4B and Nemotron-H-8B shapes, 64 rows, 2k prefill) is
``benchmarks/export_step.py``."""

from __future__ import annotations

import pytest

from radixflow_jax.kernels import ops
from radixflow_jax.models.api import read_config, resolve_model_path
from radixflow_jax.runner.export import ExportError, ExportShapes, export_step, standard_variants

SIZES = ExportShapes(max_num_batched_tokens=256 + 8, max_num_seqs=8, max_model_len=512, num_pages=64, num_slots=16)
KERNEL_CALL = {"cuda": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}


@pytest.fixture(scope="module", params=["tiny-qwen3.5", "tiny-nemotron-h"])
def cfg(request):
    return read_config(resolve_model_path(request.param))


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_every_round_kind_lowers_with_pallas_kernels(cfg, platform: str) -> None:
    variants = standard_variants(SIZES.step_shapes(cfg), 256)
    assert {v.kind for v in variants.values()} >= {"decode", "mixed"}
    for kind, variant in variants.items():
        exp = export_step(cfg, "bfloat16", SIZES, variant, platform)
        assert exp.exported.platforms == (platform,)
        targets = dict(exp.custom_calls)
        # decode rounds: one paged-attention kernel per attention layer (the recurrent decode
        # updates are one fused XLA pass by design); prefill rounds add the chunked scans
        assert targets.get(KERNEL_CALL[platform], 0) >= len(cfg.attention_layers), (kind, targets)
        if variant.prefill_rows:
            assert targets[KERNEL_CALL[platform]] > len(cfg.attention_layers), (kind, targets)
        assert set(targets) == {KERNEL_CALL[platform]}, f"a call that is not the platform's kernel: {targets}"
    assert ops.platform() == "cpu"  # the target platform applied only while tracing


def test_xla_kernels_lower_without_pallas(cfg) -> None:
    variant = standard_variants(SIZES.step_shapes(cfg), 256)["prefill"]
    exp = export_step(cfg, "bfloat16", SIZES, variant, "tpu", kernels="xla")
    assert exp.custom_calls == ()


def test_an_op_that_cannot_lower_is_named(cfg) -> None:
    variant = standard_variants(SIZES.step_shapes(cfg), 256)["prefill"]
    with pytest.raises(ExportError, match=r"does not lower for cpu with pallas kernels.*no Pallas kernel for '\w+'"):
        export_step(cfg, "bfloat16", SIZES, variant, "cpu")


def test_unknown_target_platform_is_refused() -> None:
    with pytest.raises(ValueError, match="target platform 'metal'"):
        with ops.target_platform("metal"):
            pass
