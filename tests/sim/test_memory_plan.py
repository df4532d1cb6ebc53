"""Memory plans from the configuration alone agree with the pools the server sizes from a loaded
model (``--memory-fraction``), and a model too large for one chip is planned over several."""

from __future__ import annotations

import jax
import numpy as np

from radixflow_jax.engine.build import memory_pools
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.models.api import load
from radixflow_jax.models.serving_configs import serving_config
from radixflow_jax.sim.memory_plan import param_bytes, plan
from radixflow_jax.sim.specs import DeviceSpec, get_device_spec

EC = EngineConfig.from_options(max_num_seqs=4, max_num_batched_tokens=64)


def test_plan_agrees_with_the_server_sizing_of_a_loaded_model() -> None:
    model = load("tiny-qwen3.5", dtype="bfloat16")
    loaded = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model.params))
    assert param_bytes(model.config, "bfloat16") == loaded  # the abstract model's bytes are the real ones
    device = DeviceSpec("small", 1e12, 1e11, 2**30)
    got = plan("tiny-qwen3.5", model.config, device, EC, fraction=0.5)
    assert got.fits and got.tensor_parallel == 1
    assert (got.num_pages, got.num_slots) == memory_pools(model.config, "bfloat16", EC, 0.5, 2**30, loaded)
    assert got.kv_tokens == (got.num_pages - 1) * 16 and got.checkpoint_slots == got.num_slots - 1 - 4


def test_a_model_larger_than_one_chip_needs_tensor_parallel() -> None:
    cfg = serving_config("qwen3.5-27b")
    params = param_bytes(cfg, "bfloat16")  # the abstract 27B model once (seconds), for both plans
    on_h200 = plan("qwen3.5-27b", cfg, get_device_spec("h200"), EC, params=params)
    on_v5e = plan("qwen3.5-27b", cfg, get_device_spec("tpu-v5e"), EC, params=params)
    assert on_h200.tensor_parallel == 1 and on_h200.param_bytes == params > 40 * 2**30
    assert on_v5e.tensor_parallel >= 4 and "needs tensor parallel >= " in on_v5e.line()


def test_a_model_no_chip_count_holds_is_reported() -> None:
    tiny_chip = DeviceSpec("tiny", 1e12, 1e11, 2**20)
    got = plan("qwen3.5-4b", serving_config("qwen3.5-4b"), tiny_chip, EC)
    assert not got.fits and "does not fit" in got.line()
    assert np.isclose(got.param_bytes / 2**30, 9.02, atol=0.01)


def test_mtp_layers_count_in_a_page_only_for_an_engine_that_drafts_with_them() -> None:
    """A model loaded with its MTP layers, served without MTP drafts, allocates no MTP KV
    (``ModelExecutor.pool_config``): its pages are sized, and moved to the host, without it."""
    import dataclasses

    from radixflow_jax.models.batch import pool_config

    cfg = dataclasses.replace(serving_config("qwen3.5-4b"), mtp_layers=1)
    mtp = EngineConfig.from_options(max_num_seqs=4, max_num_batched_tokens=64, speculative="mtp")
    assert not EC.scheduler.mtp_drafts and mtp.scheduler.mtp_drafts
    assert pool_config(cfg, mtp=False).mtp_layers == 0 and pool_config(cfg, mtp=True).mtp_layers == 1
    plain_pages, _ = memory_pools(cfg, "bfloat16", EC, 0.5, 2**34, 0)
    drafting_pages, _ = memory_pools(cfg, "bfloat16", mtp, 0.5, 2**34, 0)
    assert plain_pages > drafting_pages  # the MTP layer's KV takes a share of every page
