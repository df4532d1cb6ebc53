"""The transformers side of ``benchmarks/vs_transformers.py`` (``radixflow_jax/bench/vs_hf.py``) on a
tiny Qwen3.5-text hybrid: prefix reuse (each shared prefix prefilled once, its cache copied into the
batch) gives the same greedy ids as plain batched ``generate``, in every configuration the probe
tries; the reuse plan and the paired-ratio statistics. No timing is asserted."""

from __future__ import annotations

import pathlib

import pytest

from radixflow_jax.bench.args import PrefixWorkload
from radixflow_jax.bench.synthetic import ModelShape, write_model
from radixflow_jax.bench.vs_hf import (
    ProbeResult, fastest, hf_generate, plain_generate, plan_reuse, prefill_prefixes, probe_configs, ratio_spread,
    reuse_generate,
)  # fmt: skip

TINY = ModelShape(hidden=64, intermediate=128, layers=4, heads=2, kv_heads=1, head_dim=32, linear_key_heads=1,
                  linear_value_heads=2, linear_head_dim=32, vocab=256)  # fmt: skip
WORKLOAD = PrefixWorkload(requests=6, prefixes=2, prefix_len=24, suffix_len=5, output_len=4)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - a transformers model
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    directory = write_model(TINY, str(tmp_path_factory.mktemp("tiny") / "model"), seed=0, head_std=8.0)
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def test_plan_groups_by_prefix_and_suffix_length() -> None:
    prompts = [[1, 2, 3, 9], [4, 5, 6, 9, 9], [1, 2, 3, 8], [4, 5, 6, 7], [1, 2, 3, 7, 7]]
    plan = plan_reuse(prompts, prefix_len=3, batch_size=2)
    assert plan.prefixes == [[1, 2, 3], [4, 5, 6]]
    assert plan.prefix_of == [0, 1, 0, 1, 0]
    assert plan.batches == [[0, 2], [3], [1, 4]]  # one suffix length per batch, at most 2 requests
    assert sorted(i for b in plan.batches for i in b) == list(range(len(prompts)))
    with pytest.raises(ValueError):
        plan_reuse([[1, 2, 3]], prefix_len=3, batch_size=2)  # nothing after the prefix


@pytest.mark.parametrize("batch_size", [6, 4])
def test_reuse_matches_plain_generate(model, batch_size: int) -> None:  # noqa: ANN001
    prompts = WORKLOAD.prompts(TINY.vocab)
    plain = plain_generate(model, prompts, batch_size, WORKLOAD.output_len, "eager")
    plan = plan_reuse(prompts, WORKLOAD.prefix_len, batch_size)
    reused = reuse_generate(model, prompts, plan, WORKLOAD.output_len, "eager")
    assert reused == plain and all(len(o) == WORKLOAD.output_len for o in reused)


def test_prefix_cache_is_copied_not_consumed(model) -> None:  # noqa: ANN001
    """The prefix cache holds one row per distinct prefix, and a batch that continued a copy of it
    (expanded to its rows) leaves it as it was, so the next batch can copy it again."""
    import copy

    import torch

    prompts = WORKLOAD.prompts(TINY.vocab)
    plan = plan_reuse(prompts, WORKLOAD.prefix_len, 3)
    assert len(plan.batches) == 2  # the second batch reuses the same prefix cache
    cache = prefill_prefixes(model, plan.prefixes, "eager", 64)
    state = cache.layers[0].recurrent_states[0]  # layer 0 is a Gated DeltaNet layer
    assert cache.get_seq_length() == WORKLOAD.prefix_len and state.shape[0] == len(plan.prefixes)
    before = state.clone()
    batch = plan.batches[0]
    rows = copy.deepcopy(cache)
    rows.reorder_cache(torch.tensor([plan.prefix_of[i] for i in batch]))
    out = hf_generate(model, [prompts[i] for i in batch], 2, "eager", rows)
    assert out == plain_generate(model, [prompts[i] for i in batch], 3, 2, "eager")
    assert torch.equal(cache.layers[0].recurrent_states[0], before)
    assert cache.get_seq_length() == WORKLOAD.prefix_len


def test_probe_tries_static_and_reports_failures(model) -> None:  # noqa: ANN001
    """The static cache works on both paths with eager's ids; a failing configuration is reported
    with its error and never chosen. (``compile`` is left out here: inductor takes minutes cold.)"""
    prompts = WORKLOAD.prompts(TINY.vocab)
    plan = plan_reuse(prompts, WORKLOAD.prefix_len, 6)

    def broken(config: str) -> list[list[int]]:
        if config == "static":
            raise RuntimeError("not supported\nsecond line")
        return plain_generate(model, prompts, 6, 2, config)

    paths = {"plain": lambda c: plain_generate(model, prompts, 6, 2, c),
             "reuse": lambda c: reuse_generate(model, prompts, plan, 2, c)}  # fmt: skip
    results = probe_configs(paths, ("eager", "static"), repeats=1)
    assert all(r.error is None and r.same_as_eager and len(r.seconds) == 1 for r in results.values())
    assert fastest(results) in ("eager", "static")
    failed = probe_configs({"plain": broken}, ("eager", "static"), repeats=1)
    assert failed["static"].error == "RuntimeError: not supported" and fastest(failed) == "eager"
    assert fastest({"eager": ProbeResult("eager", error="x")}) == "eager"


def test_ratio_spread_is_the_median_of_per_run_ratios() -> None:
    r = ratio_spread([2.0, 1.0, 4.0, 3.0])
    assert r["median"] == 2.5 and (r["min"], r["max"]) == (1.0, 4.0) and r["q1"] <= r["median"] <= r["q3"]
    assert r["runs"] == [2.0, 1.0, 4.0, 3.0]
    with pytest.raises(ValueError):
        ratio_spread([])


def test_benchmark_help_is_instant() -> None:
    """The script's options parse without importing JAX, torch or transformers."""
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    code = ("import sys; sys.argv = ['x']; import runpy; m = runpy.run_path(%r, run_name='m'); "
            "a = m['parse_args'](['--quick', '--no-prefix-cache', '--hf-config', 'static']); "
            "assert a.modes == 'engine_only' and a.hf_config == 'static'; "
            "assert not {'jax', 'torch', 'transformers'} & set(sys.modules), sorted(sys.modules)")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code % str(root / "benchmarks" / "vs_transformers.py")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
