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

from radixflow_jax.llm import LLM
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


@pytest.mark.parametrize("name", ["gdn", "mamba2"])
def test_speculation_keeps_the_accepted_state_on_a_sharded_pool(models: dict[str, LoadedModel], name: str,
                                                                monkeypatch) -> None:  # fmt: skip
    """Verify rows on two devices: the verify lanes and the accepted state's write into the
    head-sharded state pools (``runner/rollback.py``) give the one-device greedy tokens, with drafts
    accepted whole, in part and not at all (the oracle drafter of ``tests/engine/test_speculative.py``)."""
    from radixflow_jax.scheduler import running
    from radixflow_jax.bench.oracle import oracle_drafter

    prompts = [PROMPT[:20], PROMPT[5:30]]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    opts = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128, warmup_progress=False, bucket_mode="fixed")
    one = [tuple(o.token_ids) for o in LLM(models[name], **opts).generate(prompts, params)]
    full = [tuple(p) + o for p, o in zip(prompts, one)]
    monkeypatch.setattr(running, "ngram_draft", oracle_drafter(full, presets.VOCAB_SIZE))
    llm = LLM(models[name], tensor_parallel_size=2, speculative={"num_draft": 3}, **opts)
    assert [tuple(o.token_ids) for o in llm.generate(prompts, params)] == one
    records = llm.replicas.engines[0].records
    assert 0 < sum(r.accepted_tokens for r in records) < sum(r.drafted_tokens for r in records)


def test_serve_tp_refuses_heads_that_do_not_divide() -> None:
    import argparse

    from radixflow_jax.serve.server import add_arguments, build_state

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "tiny-qwen3.5", "--tp", "4", "--no-warmup"])
    with pytest.raises(ConfigError, match="linear_num_key_heads=2"):
        build_state(args)


def test_mamba2_in_proj_split_per_head_round_trip(models: dict[str, LoadedModel]) -> None:
    from radixflow_jax.models.mixers.mamba2 import conv_permutation, proj_permutation
    from radixflow_jax.models.sharding import restripe_param, restriped, striped_config

    base = models["mamba2"]
    m = base.config.mamba
    assert m is not None and m.n_groups == 2
    layer = base.params["model"]["layers"][0]["mamba"]
    hf = {name: np.asarray(layer[name]["weight"][...]) for name in ("in_proj", "conv1d")}
    inner, gs, h = m.inner_dim, m.n_groups * m.state_size, m.num_heads
    for tp in (1, 2):
        cfg = striped_config(base.config, tp)
        for name, perm in (("in_proj", proj_permutation(m, tp)), ("conv1d", conv_permutation(m, tp))):
            path = ("model", "layers", 0, "mamba", name, "weight")
            assert restriped(cfg, path) == (tp > 1)
            assert sorted(perm.tolist()) == list(range(hf[name].shape[0]))
            striped = np.asarray(restripe_param(cfg, path, hf[name], tp))
            np.testing.assert_array_equal(np.asarray(restripe_param(cfg, path, striped, tp, inverse=True)), hf[name])
        # stripe r of in_proj = [z_r | x_r | B_r | C_r | dt_r]: heads r*H/tp.. with their groups
        striped = np.asarray(restripe_param(cfg, ("mamba", "in_proj", "weight"), hf["in_proj"], tp))
        zi, gi, hi = inner // tp, gs // tp, h // tp
        for r, stripe in enumerate(np.split(striped, tp)):
            starts = (r * zi, inner + r * zi, 2 * inner + r * gi, 2 * inner + gs + r * gi, 2 * inner + 2 * gs + r * hi)
            want = np.concatenate([hf["in_proj"][a : a + n] for a, n in zip(starts, (zi, zi, gi, gi, hi))])
            np.testing.assert_array_equal(stripe, want)
    sharded = shard_model(base, 2)
    assert sharded.config.mamba is not None and sharded.config.mamba.proj_stripes == 2
    w = sharded.params["model"]["layers"][0]["mamba"]["in_proj"]["weight"][...]
    assert w.addressable_shards[0].data.shape[0] == w.shape[0] // 2  # split, no longer replicated
    assert shard_model(base, 4).config.mamba.proj_stripes == 1  # 2 groups < 4 ranks: replicated


@pytest.mark.parametrize("name", ["gdn", "mamba2"])
def test_pallas_kernels_per_shard_equal_one_device(name: str, monkeypatch) -> None:
    """Pallas (interpret mode on CPU) inside ``shard_map``, one shard per rank: logits and states
    equal one device's running the same kernels."""
    from radixflow_jax.kernels import ops
    from radixflow_jax.models.sharding import check_pallas_shards

    monkeypatch.setenv("RADIXFLOW_PALLAS_INTERPRET", "1")
    wrapped: list[int] = []
    shard_map = jax.shard_map

    def counting(f, **kwargs):  # type: ignore[no-untyped-def]
        wrapped.append(kwargs["mesh"].shape["tensor"])
        return shard_map(f, **kwargs)

    monkeypatch.setattr(ops.jax, "shard_map", counting)
    base = build(name)  # a fresh model: its jitted forward is traced under the Pallas backend
    check_pallas_shards(base.config, 2)
    with ops.use_backend("pallas"):
        ref_logits, ref_states = run(base)
        assert not wrapped  # one device: the kernels as they are
        logits, states = run(shard_model(base, 2))
    assert wrapped and set(wrapped) == {2}  # the sharded model's Pallas calls ran inside shard_map, 2 shards
    assert np.max(np.abs(logits - ref_logits)) <= TOL
    for (conv, ssm), (rconv, rssm) in zip(states, ref_states):
        assert np.max(np.abs(conv - rconv)) <= TOL and np.max(np.abs(ssm - rssm)) <= TOL


def test_pallas_refused_where_heads_are_not_self_contained(models: dict[str, LoadedModel]) -> None:
    from radixflow_jax.engine.build import step_kernels

    with pytest.raises(ConfigError, match="num_key_value_heads"):
        LLM(models["gdn"], tensor_parallel_size=4, kernels="pallas")  # 2 KV heads < 4 ranks
    from radixflow_jax.models.sharding import check_pallas_shards

    cfg = models["mamba2"].config
    assert cfg.attention is not None
    four_kv = dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention, num_kv_heads=4))
    with pytest.raises(ConfigError, match="mamba_n_groups"):
        check_pallas_shards(four_kv, 4)  # KV heads divide, 2 groups < 4 ranks
    assert step_kernels(shard_model(models["gdn"], 4), "auto") == "xla"  # auto: the forms that can run
    assert step_kernels(shard_model(models["gdn"], 2), "pallas") == "pallas"
    assert step_kernels(models["gdn"], "pallas") == "pallas"


def test_pallas_pair_chunk_per_shard(monkeypatch) -> None:
    """``pair_chunk`` (policy ``pair``) reaches the Pallas kernels inside ``shard_map`` as a
    replicated operand: per-shard results equal the one-device reference's."""
    from jax.sharding import Mesh

    from radixflow_jax.kernels import ops
    from radixflow_jax.kernels.ssd import ssd_chunked
    from tests.kernels.test_pair_chunk import CHUNK, LENS, _pair_chunk, _ssd_inputs

    monkeypatch.setenv("RADIXFLOW_PALLAS_INTERPRET", "1")
    inp = _ssd_inputs(p=4, n=8)
    args = [jnp.asarray(inp[k]) for k in ("x", "dt", "A", "B", "C", "cu_seqlens", "initial_state")]
    pair_chunk = jnp.asarray(_pair_chunk(LENS))
    want = ssd_chunked(*args, chunk_size=CHUNK, pair_chunk=pair_chunk)
    mesh = Mesh(np.asarray(jax.devices()[:2]), ("tensor",))
    with ops.use_backend("pallas"), ops.per_shard(mesh, "tensor"):
        got = jax.jit(lambda *a: ops.ssd_chunked(*a, chunk_size=CHUNK, pair_chunk=pair_chunk))(*args)
    for g, w in zip(got[:2], want[:2]):  # outputs and final states (unused chunk states are junk)
        assert np.max(np.abs(np.asarray(g) - np.asarray(w))) <= 1e-4
