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
import numpy as np
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


ZEROED = ("o_proj", "out_proj", "down_proj")  # every layer's output projections: the bigram form's trunk


def bigram_tensor(key: str, value: np.ndarray, final_norm: np.ndarray) -> np.ndarray:
    """Checkpoint tensor ``key`` (HF name) of a model's bigram form: every layer's output
    projections zeroed (the trunk's hidden state is the final norm of the last token's embedding),
    ``mtp.fc`` passing the embedding half, the MTP layer's norms the trunk's ``final_norm``. Its
    MTP guesses are then the trunk's own predictions; shapes and cost are unchanged."""
    if any(n in key.split(".") for n in ZEROED) or key == "mtp.pre_fc_norm_embedding.weight":
        return np.zeros_like(value)
    if key == "mtp.fc.weight":
        hidden = value.shape[0]
        return np.concatenate([np.eye(hidden, dtype=value.dtype), np.zeros((hidden, hidden), value.dtype)], axis=1)
    if key == "mtp.norm.weight":
        return np.asarray(final_norm, dtype=value.dtype)
    return value


def bigram_mtp(model: LoadedModel) -> LoadedModel:
    """``model`` (with an MTP layer) made its bigram form (:func:`bigram_tensor`), in place."""
    pure = nnx.to_pure_dict(model.params)
    names = model.config.checkpoint_names
    final_norm = np.asarray(pure["model"]["norm"]["weight"])

    def edit(path: tuple, leaf: jax.Array) -> jax.Array:
        key = names.key(tuple(getattr(p, "key", getattr(p, "idx", p)) for p in path))
        return jnp.asarray(bigram_tensor(key, np.asarray(leaf), final_norm))

    nnx.replace_by_pure_dict(model.params, jax.tree_util.tree_map_with_path(edit, pure))
    return model
