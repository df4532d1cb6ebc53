"""Models for measuring and testing MTP drafts where no checkpoint with trained MTP weights exists
(the machine has none): :func:`with_mtp_layer` gives a model a random MTP layer (its guesses are
almost never accepted: speculation's pure cost), and :func:`bigram_mtp` turns a Qwen3.5-style model
into one whose MTP layer guesses exactly what the trunk will predict (every draft accepted: the
most speculation can gain). The two bound what a trained MTP layer does.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from radixflow_jax.models.api import LoadedModel
from radixflow_jax.models.hybrid import HybridLM


def with_mtp_layer(model: LoadedModel, seed: int = 0) -> LoadedModel:
    """``model`` with one randomly initialised MTP layer beside its trunk (the trunk's parameters
    unchanged); a model that has one is returned as it is."""
    if model.config.mtp_layers:
        return model
    cfg = dataclasses.replace(model.config, mtp_layers=1)
    graphdef, state = nnx.split(HybridLM(cfg, dtype=model.dtype, rngs=nnx.Rngs(seed)))
    pure = nnx.to_pure_dict(state)
    pure.update(nnx.to_pure_dict(model.params))  # every trunk parameter; the MTP layer stays random
    nnx.replace_by_pure_dict(state, pure)
    return LoadedModel(model.model_dir, cfg, graphdef, state, model.dtype, tokenizer=model.tokenizer)


def bigram_mtp(model: LoadedModel) -> LoadedModel:
    """``model`` (with an MTP layer) made a bigram model whose MTP guesses are the trunk's own
    predictions, in place: every layer's output projections zeroed (the trunk's hidden state is the
    final norm of the last token's embedding), ``fc`` passing the embedding half, the MTP layer's
    outputs zeroed and its norms the trunk's. The computation keeps its shape and cost."""
    pure = nnx.to_pure_dict(model.params)
    hidden = model.config.hidden_size

    def edit(path: tuple, leaf: jax.Array) -> jax.Array:
        names = [str(getattr(p, "key", p)) for p in path]
        if any(n in ("o_proj", "out_proj", "down_proj") for n in names):
            return jnp.zeros_like(leaf)
        if names[:2] == ["mtp", "fc"]:
            return jnp.concatenate([jnp.eye(hidden, dtype=leaf.dtype), jnp.zeros_like(leaf[:, hidden:])], axis=1)
        if names[:2] == ["mtp", "pre_fc_norm_embedding"]:
            return jnp.zeros_like(leaf)
        if names[:2] == ["mtp", "norm"]:
            return pure["model"]["norm"]["weight"]
        return leaf

    nnx.replace_by_pure_dict(model.params, jax.tree_util.tree_map_with_path(edit, pure))
    return model
