"""Tensor parallelism on a simulated 8-device CPU mesh: sharded logits, states and greedy generations
equal one device's (float32, max abs difference <= 1e-5); re-striping round-trips; heads that do
not divide N are refused naming the field.

Runs in its own pytest process with ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (set
before JAX starts; see README / .ci/run). Test models are 2-layer variants of the tiny presets with
enough heads for N = 4 (KV heads and Mamba2 groups replicated there)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

from radixflow_jax.engine.llm import LLM
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.models import presets
from radixflow_jax.models.api import LoadedModel
from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.hf_config import parse_hf_config
from radixflow_jax.models.sharding import (
    ShardedModel, check_tensor_parallel, make_mesh, restripe, shard_model, stripe_permutation, unstripe,
)  # fmt: skip
from radixflow_jax.models.weights import load_tensors_state

TOL = 1e-5
_GDN_HEADS = {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
              "linear_num_key_heads": 4, "linear_num_value_heads": 8}  # fmt: skip
CONFIGS = {
    "gdn": {**presets.PRESETS["tiny-qwen3.5"], **_GDN_HEADS},
    "next-moe": {**presets.PRESETS["tiny-qwen3-next"], **_GDN_HEADS},
    "mamba2": {**presets.PRESETS["tiny-bamba"], "num_hidden_layers": 2, "attn_layer_indices": [1]},
}
PROMPT = [int(t) for t in np.random.default_rng(0).integers(3, 500, size=37)]


def test_mesh_has_eight_devices() -> None:
    assert len(jax.devices()) >= 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"


def build(name: str) -> LoadedModel:
    config = {**CONFIGS[name], "eos_token_id": 1}
    cfg = parse_hf_config(config)
    tensors = presets._weights(config, seed=7)
    # the presets' head gives logits of magnitude ~16, where float32 spacing is ~2e-6 and a changed
    # reduction order alone moves them by ~1e-5; a head scaled to O(1) logits keeps the absolute
    # 1e-5 bound meaningful (relative error ~1e-6) without touching the layers under test
    tensors["lm_head.weight"] = tensors["lm_head.weight"] / 8
    graphdef, state = load_tensors_state(tensors, cfg, jnp.float32)
    return LoadedModel(f"test-{name}", cfg, graphdef, state, jnp.float32)


@pytest.fixture(scope="module")
def models() -> dict[str, LoadedModel]:
    return {name: build(name) for name in CONFIGS}


def run(model: LoadedModel) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Prefill logits, then two decode steps; returns all logits and the final recurrent states."""
    seq = model.new_sequence(64)
    logits = [model.extend(seq, PROMPT)]
    for _ in range(2):
        logits.append(model.decode(seq, int(np.argmax(logits[-1][-1] if logits[-1].ndim == 2 else logits[-1])))[None])
    return np.concatenate(logits), model.recurrent_states(seq)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sharded_logits_and_states_equal_one_device(models: dict[str, LoadedModel], name: str) -> None:
    base = models[name]
    ref_logits, ref_states = run(base)
    for tp in (2, 4):
        sharded = shard_model(base, tp)
        assert isinstance(sharded, ShardedModel)
        logits, states = run(sharded)
        assert np.max(np.abs(logits - ref_logits)) <= TOL, (name, tp)
        assert len(states) == len(ref_states) > 0
        for (conv, ssm), (rconv, rssm) in zip(states, ref_states):
            assert np.max(np.abs(conv - rconv)) <= TOL, (name, tp, "conv")
            assert np.max(np.abs(ssm - rssm)) <= TOL, (name, tp, "ssm")


def test_parameters_and_pools_are_split_on_heads(models: dict[str, LoadedModel]) -> None:
    sharded = shard_model(models["gdn"], 4)
    layer = sharded.params["model"]["layers"][0]["linear_attn"]
    qkv = layer["in_proj_qkv"]["weight"][...]
    assert isinstance(qkv.sharding, NamedSharding)
    assert qkv.addressable_shards[0].data.shape[0] == qkv.shape[0] // 4
    attn = sharded.params["model"]["layers"][1]["self_attn"]
    o_proj = attn["o_proj"]["weight"][...]
    assert o_proj.addressable_shards[0].data.shape[1] == o_proj.shape[1] // 4
    assert attn["k_proj"]["weight"][...].sharding.is_fully_replicated  # 2 KV heads < 4 ranks: replicated
    seq = sharded.new_sequence(32)
    ssm = seq.cache.ssm[0]
    assert ssm.addressable_shards[0].data.shape[1] == ssm.shape[1] // 4


def test_restripe_round_trip_and_stripe_contents(models: dict[str, LoadedModel]) -> None:
    gdn = models["gdn"].config.gdn
    assert gdn is not None
    hf = np.asarray(models["gdn"].params["model"]["layers"][0]["linear_attn"]["in_proj_qkv"]["weight"][...])
    for tp in (1, 2, 4):
        striped = np.asarray(restripe(hf, gdn, tp, axis=0))
        np.testing.assert_array_equal(np.asarray(unstripe(striped, gdn, tp, axis=0)), hf)
        assert sorted(stripe_permutation(gdn, tp).tolist()) == list(range(gdn.conv_dim))
        kd, vd = gdn.key_dim // tp, gdn.value_dim // tp
        width = 2 * kd + vd
        for r in range(tp):  # stripe r = [q_r | k_r | v_r] of the HF rows
            stripe = striped[r * width : (r + 1) * width]
            np.testing.assert_array_equal(stripe[:kd], hf[r * kd : (r + 1) * kd])
            k0, v0 = gdn.key_dim, 2 * gdn.key_dim
            np.testing.assert_array_equal(stripe[kd : 2 * kd], hf[k0 + r * kd : k0 + (r + 1) * kd])
            np.testing.assert_array_equal(stripe[2 * kd :], hf[v0 + r * vd : v0 + (r + 1) * vd])
    # the placed weight holds rank r's own stripe on device r
    sharded = shard_model(models["gdn"], 4)
    w = sharded.params["model"]["layers"][0]["linear_attn"]["in_proj_qkv"]["weight"][...]
    striped = np.asarray(restripe(hf, gdn, 4, axis=0))
    for shard in w.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), striped[shard.index])


def test_heads_that_do_not_divide_are_refused(models: dict[str, LoadedModel]) -> None:
    tiny = parse_hf_config({**presets.PRESETS["tiny-qwen3.5"], "eos_token_id": 1})  # 2 key heads
    with pytest.raises(ConfigError, match="linear_num_key_heads"):
        check_tensor_parallel(tiny, 4)
    with pytest.raises(ConfigError, match="num_attention_heads"):
        shard_model(models["mamba2"], 8)  # 4 attention heads
    with pytest.raises(ConfigError, match="mamba_n_heads"):
        cfg = models["mamba2"].config
        assert cfg.mamba is not None
        check_tensor_parallel(dataclasses.replace(cfg, mamba=dataclasses.replace(cfg.mamba, num_heads=6)), 4)
    with pytest.raises(ValueError, match="devices"):
        make_mesh(16)


def test_greedy_generations_identical_through_llm(models: dict[str, LoadedModel]) -> None:
    prompts = [PROMPT[:20], PROMPT[:20] + PROMPT[25:31], PROMPT[5:30]]
    params = SamplingParams(max_tokens=5, temperature=0.0)
    # fixed buckets: one step variant per engine (the subject is sharding, not bucketing)
    opts = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128, warmup_progress=False, bucket_mode="fixed")
    one = LLM(models["next-moe"], **opts).generate(prompts, params)
    two = LLM(models["next-moe"], tensor_parallel_size=2, **opts).generate(prompts, params)
    assert [o.token_ids for o in two] == [o.token_ids for o in one]
    assert all(len(o.token_ids) == 5 for o in one)


def test_serve_tp_refuses_heads_that_do_not_divide() -> None:
    import argparse

    from radixflow_jax.serve.server import add_arguments, build_state

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "tiny-qwen3.5", "--tp", "4", "--no-warmup"])
    with pytest.raises(ConfigError, match="linear_num_key_heads=2"):
        build_state(args)
