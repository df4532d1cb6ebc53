"""``HybridLM.__call__(..., row_last=...)``: the last layer computes only each row's last token past
its mixers. Oracle: the same call without ``row_last``, whose hidden states at those tokens it must
equal, with identical pools (every token's KV and state is still written). Every kind of last layer
is covered: attention with a dense MLP (Qwen3.5) and with MoE (Qwen3-Next), an MLP block
(Nemotron-H), a parallel attention + Mamba2 layer (Falcon-H1), and, from configs whose last layer
is recurrent (no preset has one), Gated DeltaNet and Mamba2."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from radixflow_jax.models import api, presets
from radixflow_jax.models.batch import Batch, init_cache
from radixflow_jax.models.hf_config import parse_hf_config
from radixflow_jax.models.hybrid import HybridLM

PAGE, PAGES_PER_ROW = 4, 8
SPANS = (13, 1, 6, 0)  # a prefill row, a one-token row, another prefill row, a padding row


def _call(model: types.SimpleNamespace | api.LoadedModel, row_last: bool) -> tuple[np.ndarray, list[np.ndarray]]:
    cfg = model.config
    rng = np.random.default_rng(3)
    cu = np.concatenate([[0], np.cumsum(SPANS)]).astype(np.int32)
    tokens = np.zeros(int(cu[-1]) + 3, np.int32)  # three padding token slots
    tokens[: cu[-1]] = rng.integers(0, cfg.vocab_size, int(cu[-1]))
    starts = np.array([0, 5, 2, 0], np.int32)  # rows 1 and 2 continue a context already in their pages
    table = np.zeros((len(SPANS), PAGES_PER_ROW), np.int32)
    slots = np.zeros(tokens.shape[0], np.int32)
    for r, span in enumerate(SPANS):
        if span:
            table[r] = 1 + r * PAGES_PER_ROW + np.arange(PAGES_PER_ROW)
            pos = starts[r] + np.arange(span)
            slots[cu[r] : cu[r + 1]] = table[r, pos // PAGE] * PAGE + pos % PAGE
    real = np.asarray(SPANS) > 0
    batch = Batch(
        cu_seqlens=jnp.asarray(cu), kv_lens=jnp.asarray(np.where(real, starts + np.asarray(SPANS), 0), jnp.int32),
        page_table=jnp.asarray(table), slot_mapping=jnp.asarray(slots),
        state_slots=jnp.asarray(np.where(real, 1 + np.arange(len(SPANS)), 0), jnp.int32),
    )  # fmt: skip
    cache = init_cache(cfg, num_pages=1 + len(SPANS) * PAGES_PER_ROW, page_size=PAGE, num_slots=8, dtype=model.dtype)
    cache = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape) * 0.1, p.dtype), cache)  # a prior context
    last = jnp.asarray(np.maximum(cu[1:] - 1, 0), jnp.int32)

    def run(params: nnx.State, ids: jax.Array, cache: object) -> tuple[jax.Array, object]:
        module = nnx.merge(model.graphdef, params)
        hidden, cache = module(ids, batch, cache, row_last=last if row_last else None)
        return (hidden if row_last else hidden[last]), cache

    hidden, cache = jax.jit(run)(model.params, jnp.asarray(tokens), cache)
    return np.asarray(hidden)[real], [np.asarray(p) for p in jax.tree.leaves(cache)]


def _recurrent_last(preset: str) -> types.SimpleNamespace:
    """``preset``'s config with a recurrent last layer, random weights."""
    raw = dict(presets.PRESETS[preset])
    if "layer_types" in raw:
        raw["layer_types"] = raw["layer_types"][:-1] + ["linear_attention"]
    else:
        raw["attn_layer_indices"] = [3]
    cfg = parse_hf_config(raw)
    graphdef, params = nnx.split(HybridLM(cfg, dtype=jnp.float32, rngs=nnx.Rngs(0)))
    return types.SimpleNamespace(config=cfg, graphdef=graphdef, params=params, dtype=jnp.float32)


CASES = ["tiny-qwen3.5", "tiny-qwen3-next", "tiny-nemotron-h", "tiny-falcon-h1", "gdn-last", "mamba2-last"]


@pytest.mark.parametrize("case", CASES)
def test_row_last_equals_the_full_call_at_each_rows_last_token(case: str) -> None:
    built = {"gdn-last": "tiny-qwen3.5", "mamba2-last": "tiny-bamba"}
    model = _recurrent_last(built[case]) if case in built else api.load(case)
    kinds = (model.config.mixers[-1], model.config.mlps[-1])
    if case.endswith("-last"):
        assert kinds[0] == case.split("-")[0].replace("mamba2", "mamba"), kinds
    narrow, narrow_pools = _call(model, row_last=True)
    full, full_pools = _call(model, row_last=False)
    assert narrow.shape == full.shape == (3, model.config.hidden_size), kinds
    np.testing.assert_allclose(narrow, full, rtol=1e-5, atol=1e-5)
    for got, want in zip(narrow_pools, full_pools):
        np.testing.assert_array_equal(got, want)
