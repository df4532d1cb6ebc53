"""Load a :class:`HybridLM` from a HF directory (safetensors) or a converted orbax directory.

The model is first built abstractly (``nnx.eval_shape``: shapes only, no memory), then every
parameter is read once from its checkpoint tensor, checked, cast and placed. A parameter's NNX path
(fixed attribute names) renamed by the family's table (``ModelConfig.checkpoint_names``) and joined
by dots is its checkpoint key, except the stacked MoE experts, assembled from per-expert keys or
fused ``gate_up_proj`` tensors. An orbax directory (``radixflow convert``) stores the parameters
under the same renamed paths (root ``model``), so directories written before the model's attribute
names were fixed load unchanged.

Errors (:class:`WeightsError`) name the tensor: missing, unexpected, or of the wrong shape.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from radixflow_jax.models.config import ModelConfig
from radixflow_jax.models.hybrid import HybridLM
from radixflow_jax.models.safetensors_io import SafetensorsDir, WeightsError

ORBAX_SUBDIR = "orbax"
MARKER_FILE = "radixflow.json"
_MTP = re.compile(r"^mtp\.")  # MTP layers: read only when the model is loaded with them (ModelConfig.mtp_layers)
_IGNORED = (re.compile(r"^model\.visual\."), _MTP, re.compile(r"rotary_emb\.inv_freq$"))
_EXPERT = re.compile(r"^(?P<layer>.*\.mlp\.experts)\.(?P<name>gate_proj|up_proj|down_proj)$")


def abstract_model(cfg: ModelConfig, dtype: jnp.dtype) -> tuple[nnx.GraphDef, nnx.State]:
    """Graph definition and shape-only state of the model (allocates nothing)."""
    abstract = nnx.eval_shape(lambda: HybridLM(cfg, dtype=dtype, rngs=nnx.Rngs(0)))
    return nnx.split(abstract)


def _key_of(path: tuple[Any, ...], cfg: ModelConfig) -> str:
    return cfg.checkpoint_names.key(path)


def _flat(tree: Mapping[Any, Any], prefix: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], Any]:
    """A nested pure dict as ``{path: leaf}``."""
    out: dict[tuple[Any, ...], Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, (*prefix, k)))
        else:
            out[(*prefix, k)] = v
    return out


def _nested(flat: Mapping[tuple[Any, ...], Any]) -> dict[Any, Any]:
    """The inverse of :func:`_flat`."""
    out: dict[Any, Any] = {}
    for path, leaf in flat.items():
        node = out
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = leaf
    return out


def _stored_tree(pure: Mapping[Any, Any], cfg: ModelConfig) -> dict[Any, Any]:
    """The model's pure dict under the checkpoint's names (the orbax form)."""
    return _nested({cfg.checkpoint_names.stored(p): leaf for p, leaf in _flat(pure).items()})


def _expert_source(
    tensors: Mapping[str, np.ndarray], base: str, name: str, num_experts: int, used: set[str]
) -> np.ndarray:
    """Stacked ``[E, in, out]`` expert weight from per-expert or fused checkpoint tensors."""
    per_expert = [f"{base}.{e}.{name}.weight" for e in range(num_experts)]
    if all(k in tensors for k in per_expert):
        used.update(per_expert)
        return np.stack([np.asarray(tensors[k]).T for k in per_expert])
    if name in ("gate_proj", "up_proj") and f"{base}.gate_up_proj" in tensors:
        fused = np.asarray(tensors[f"{base}.gate_up_proj"])  # [E, 2I, H]
        used.add(f"{base}.gate_up_proj")
        half = fused.shape[1] // 2
        part = fused[:, :half] if name == "gate_proj" else fused[:, half:]
        return np.transpose(part, (0, 2, 1))
    if name == "down_proj" and f"{base}.down_proj" in tensors:
        used.add(f"{base}.down_proj")
        return np.transpose(np.asarray(tensors[f"{base}.down_proj"]), (0, 2, 1))  # [E, H, I] -> [E, I, H]
    missing = next(k for k in per_expert if k not in tensors)
    raise WeightsError(f"missing tensor '{missing}' (nor a fused '{base}.gate_up_proj'/'{base}.down_proj')")


def _read_param(tensors: Mapping[str, np.ndarray], cfg: ModelConfig, path: tuple[Any, ...], used: set[str]) -> np.ndarray:
    key = _key_of(path, cfg)
    match = _EXPERT.match(key)
    if match and cfg.moe is not None:
        return _expert_source(tensors, match["layer"], match["name"], cfg.moe.num_experts, used)
    if key not in tensors:
        raise WeightsError(f"missing tensor '{key}'")
    used.add(key)
    return tensors[key]


def load_safetensors_state(model_dir: str, cfg: ModelConfig, dtype: jnp.dtype) -> tuple[nnx.GraphDef, nnx.State]:
    """Reads every parameter from the safetensors files of ``model_dir``."""
    return load_tensors_state(SafetensorsDir(model_dir), cfg, dtype)


def load_tensors_state(
    tensors: Mapping[str, np.ndarray], cfg: ModelConfig, dtype: jnp.dtype
) -> tuple[nnx.GraphDef, nnx.State]:
    """Reads every parameter from ``tensors`` (HF checkpoint keys, ``[out, in]`` layout): a
    safetensors directory or a GGUF file's dequantised tensors. Each tensor is read once."""
    graphdef, state = abstract_model(cfg, dtype)
    used: set[str] = set()
    pure = nnx.to_pure_dict(state)

    def fill(path: tuple[Any, ...], leaf: jax.ShapeDtypeStruct) -> jax.Array:
        arr = _read_param(tensors, cfg, tuple(getattr(p, "key", getattr(p, "idx", p)) for p in path), used)
        if tuple(arr.shape) != tuple(leaf.shape):
            raise WeightsError(
                f"tensor '{_key_of(tuple(getattr(p, 'key', getattr(p, 'idx', p)) for p in path), cfg)}' "
                f"has shape {tuple(arr.shape)}, the config implies {tuple(leaf.shape)}"
            )
        return jnp.asarray(np.asarray(arr).astype(leaf.dtype))

    filled = jax.tree_util.tree_map_with_path(fill, pure)
    tied_head = "lm_head.weight" if cfg.tie_word_embeddings else None
    ignored = _IGNORED if not cfg.mtp_layers else tuple(p for p in _IGNORED if p is not _MTP)
    extra = [k for k in tensors if k not in used and k != tied_head and not any(p.search(k) for p in ignored)]
    if extra:
        raise WeightsError(f"unexpected tensor '{extra[0]}' ({len(extra)} unexpected in all) for {cfg.model_type}")
    nnx.replace_by_pure_dict(state, filled)
    return graphdef, state


def save_orbax(model: HybridLM, out_dir: str) -> None:
    """Writes the model's parameters as an orbax checkpoint under ``out_dir/orbax``."""
    import orbax.checkpoint as ocp

    _, state = nnx.split(model)
    path = os.path.abspath(os.path.join(out_dir, ORBAX_SUBDIR))
    if os.path.exists(path):
        shutil.rmtree(path)
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(path, _stored_tree(nnx.to_pure_dict(state), model.config))


def load_orbax_state(
    model_dir: str,
    cfg: ModelConfig,
    dtype: jnp.dtype,
    sharding: Callable[[tuple[Any, ...], Any], jax.sharding.Sharding] | None = None,
) -> tuple[nnx.GraphDef, nnx.State]:
    """Restores parameters from ``model_dir/orbax`` straight into the abstract model's shapes, and
    with ``sharding(path, abstract leaf)`` (``path``: the model's, not the stored one) straight into
    that layout (each process reads only the shards its devices hold; ``models/sharding.py``)."""
    import orbax.checkpoint as ocp

    graphdef, state = abstract_model(cfg, dtype)
    model_leaves = _flat(nnx.to_pure_dict(state))
    if sharding is not None:
        model_leaves = {
            p: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding(p, leaf))
            for p, leaf in model_leaves.items()
        }
    stored_of = {p: cfg.checkpoint_names.stored(p) for p in model_leaves}
    target = _nested({stored_of[p]: leaf for p, leaf in model_leaves.items()})
    path = os.path.abspath(os.path.join(model_dir, ORBAX_SUBDIR))
    with ocp.StandardCheckpointer() as ckpt:
        meta = ckpt.metadata(path)
        tree = getattr(meta, "item_metadata", meta)
        stored_shapes = {_dotted(p): tuple(getattr(m, "shape", ())) for p, m in jax.tree_util.tree_leaves_with_path(tree)}
        for p, leaf in jax.tree_util.tree_leaves_with_path(target):
            name = _dotted(p)
            if name not in stored_shapes:
                raise WeightsError(f"orbax checkpoint {path}: missing parameter {name}")
            if stored_shapes[name] != tuple(leaf.shape):
                raise WeightsError(
                    f"orbax checkpoint {path}: parameter {name} has shape {stored_shapes[name]}, "
                    f"the config implies {tuple(leaf.shape)}"
                )
        restored = _flat(ckpt.restore(path, target))
    nnx.replace_by_pure_dict(state, _nested({p: restored[stored_of[p]] for p in model_leaves}))
    return graphdef, state


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in path)


def has_orbax(model_dir: str) -> bool:
    return os.path.isdir(os.path.join(model_dir, ORBAX_SUBDIR))


def write_marker(out_dir: str, info: dict[str, Any]) -> None:
    with open(os.path.join(out_dir, MARKER_FILE), "w") as f:
        json.dump(info, f, indent=2)


StateLoader = Callable[[str, ModelConfig, jnp.dtype], tuple[nnx.GraphDef, nnx.State]]


def param_keys(state: nnx.State, cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """The checkpoint keys and on-disk shapes that a model with this state is loaded from
    (stacked experts listed per expert, HF ``[out, in]`` layout), in the order of the checkpoint's
    names (presets draw their random weights in this order)."""
    out: list[tuple[str, tuple[int, ...]]] = []
    leaves = _flat(nnx.to_pure_dict(state))
    for path in sorted(leaves, key=cfg.checkpoint_names.stored):
        leaf = leaves[path]
        key = _key_of(path, cfg)
        match = _EXPERT.match(key)
        if match:
            num, d_in, d_out = leaf.shape
            out.extend((f"{match['layer']}.{e}.{match['name']}.weight", (d_out, d_in)) for e in range(num))
        else:
            out.append((key, tuple(leaf.shape)))
    return out
