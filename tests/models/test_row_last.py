"""``HybridLM.__call__(..., row_last=...)``: the last layer computes only each row's last token past
its mixers. Oracle: the same call without ``row_last``, whose hidden states at those tokens it must
equal, with identical pools (every token's KV and state is still written). Every kind of last layer
is covered, each from a preset's config cut to two or three layers: attention with a dense MLP
(Qwen3.5) and with MoE (Qwen3-Next), Gated DeltaNet and Mamba2 (no preset ends in one), an MLP block
(Nemotron-H) and a parallel attention + Mamba2 layer (Falcon-H1)."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from radixflow_jax.models import presets
from radixflow_jax.models.batch import Batch, init_cache
from radixflow_jax.models.hf_config import parse_hf_config
from radixflow_jax.models.hybrid import HybridLM

PAGE, PAGES_PER_ROW = 4, 8
SPANS = (13, 1, 6, 0)  # a prefill row, a one-token row, another prefill row, a padding row


def _call(model: types.SimpleNamespace, row_last: bool) -> tuple[np.ndarray, list[np.ndarray]]:
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


def _model(preset: str, **overrides: object) -> types.SimpleNamespace:
    """``preset``'s config shortened to two or three layers (``overrides``), random weights."""
    cfg = parse_hf_config({**presets.PRESETS[preset], **overrides})
    graphdef, params = nnx.split(HybridLM(cfg, dtype=jnp.float32, rngs=nnx.Rngs(0)))
    return types.SimpleNamespace(config=cfg, graphdef=graphdef, params=params, dtype=jnp.float32)


# case: (preset, overrides, the last layer's (mixer, MLP) kinds)
CASES = {
    "attention": ("tiny-qwen3.5", {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]},
                  ("attention", "dense")),
    "attention-moe": (
        "tiny-qwen3-next", {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]},
        ("attention", "moe"),
    ),
    "gdn": ("tiny-qwen3.5", {"num_hidden_layers": 2, "layer_types": ["full_attention", "linear_attention"]},
            ("gdn", "dense")),
    "mamba2": ("tiny-bamba", {"num_hidden_layers": 2, "attn_layer_indices": [0]}, ("mamba", "dense")),
    "mlp-block": ("tiny-nemotron-h", {"hybrid_override_pattern": "M*-", "num_hidden_layers": 3}, ("none", "relu2")),
    "parallel": ("tiny-falcon-h1", {"num_hidden_layers": 2}, ("parallel", "dense")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_row_last_equals_the_full_call_at_each_rows_last_token(case: str) -> None:
    preset, overrides, want = CASES[case]
    model = _model(preset, **overrides)
    kinds = (model.config.mixers[-1], model.config.mlps[-1])
    assert kinds == want, kinds
    narrow, narrow_pools = _call(model, row_last=True)
    full, full_pools = _call(model, row_last=False)
    assert narrow.shape == full.shape == (3, model.config.hidden_size), kinds
    np.testing.assert_allclose(narrow, full, rtol=1e-5, atol=1e-5)
    for got, want in zip(narrow_pools, full_pools):
        np.testing.assert_array_equal(got, want)
