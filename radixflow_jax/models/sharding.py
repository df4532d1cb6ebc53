"""Tensor parallelism: a ``("data", "tensor")`` mesh, a partition spec per parameter and pool, and
the load-time re-striping of Qwen3.5's split ``in_proj_qkv`` / conv channels and of Mamba2's
``in_proj`` / conv channels; :func:`load_sharded` restores an orbax directory straight into the layout.

The step stays one SPMD program: parameters and pools are placed with ``NamedSharding`` and the
jitted step is partitioned by XLA (GSPMD), which inserts the reductions after row-parallel
projections. What is split on which axis (see docs/design.md, "Sharding"):

* attention: ``q_proj`` and (when the KV heads divide N) ``k_proj``/``v_proj`` column-parallel on
  heads, KV pages on the KV-head axis; KV projections and pages are replicated when N exceeds the
  KV heads (N must then be a multiple of them); ``o_proj`` row-parallel;
* Gated DeltaNet: key heads with their value heads. Qwen3-Next's ``in_proj_qkvz``/``in_proj_ba`` are
  already grouped by key head; Qwen3.5's ``in_proj_qkv`` rows and the conv weight / conv-state
  channels are re-striped (:func:`stripe_permutation`) so stripe r holds ``[q_r | k_r | v_r]`` and
  each rank's contiguous slice is its own; recurrent state ``[S, Hv, dk, dv]`` on heads;
  ``A_log``/``dt_bias`` local; ``out_proj`` row-parallel;
* Mamba2: ``A_log``/``D``/``dt_bias``, the SSD state ``[S, H, P, N]`` and ``out_proj`` (rows) on
  heads; when the groups divide N, ``in_proj`` rows and the conv channels are re-striped per head
  group (``MambaConfig.proj_stripes``; stripe r = ``[z_r | x_r | B_r | C_r | dt_r]``) and split,
  otherwise replicated; the gated norm replicated;
* MLP and MoE experts: gate/up column-parallel, down row-parallel; router and norms replicated.

Invariant: sharding never changes the math: logits and states equal one device's up to float
reduction order (tests/multidevice).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from radixflow_jax.models.api import LoadedModel
from radixflow_jax.models.batch import ModelCache
from radixflow_jax.models.config import ConfigError, GdnConfig, ModelConfig
from radixflow_jax.models.weights import abstract_model

TENSOR = "tensor"
DATA = "data"
# column-parallel projections: attention and MLP, then the Gated DeltaNet input projections
_COLUMN = set("q_proj k_proj v_proj gate_proj up_proj".split()) | set(
    "in_proj_qkvz in_proj_ba in_proj_qkv in_proj_z in_proj_a in_proj_b".split()
)
_ROW = {"o_proj", "down_proj", "out_proj"}


def make_mesh(tensor_parallel_size: int, data_parallel_size: int = 1, first_device: int = 0) -> Mesh:
    """A ``(data, tensor)`` mesh over local devices ``first_device .. first_device + data * tensor - 1``.

    Local: in a job of several processes (``replicas/distributed.py``) a mesh never spans processes,
    so an engine's one host-side scheduler drives all of its devices."""
    n = tensor_parallel_size * data_parallel_size
    if tensor_parallel_size < 1 or data_parallel_size < 1 or first_device < 0:
        raise ValueError(f"mesh sizes must be >= 1, got tensor={tensor_parallel_size} data={data_parallel_size}")
    devices = jax.local_devices()
    if first_device + n > len(devices):
        raise ValueError(
            f"a mesh of {n} devices from local device {first_device} needs {first_device + n} devices; "
            f"{len(devices)} are available"
        )
    grid = np.asarray(devices[first_device : first_device + n]).reshape(data_parallel_size, tensor_parallel_size)
    return Mesh(grid, (DATA, TENSOR))


def kv_heads_sharded(cfg: ModelConfig, tp: int) -> bool:
    return cfg.attention is not None and cfg.attention.num_kv_heads % tp == 0


def check_tensor_parallel(cfg: ModelConfig, tp: int) -> None:
    """Raises :class:`ConfigError` naming the HF config field whose size ``tp`` does not divide."""
    if tp < 1:
        raise ConfigError(f"tensor_parallel_size must be >= 1, got {tp}")

    def need(value: int, field: str) -> None:
        if value % tp:
            raise ConfigError(f"tensor_parallel_size={tp} does not divide {field}={value}")

    if cfg.attention_layers:
        att = cfg.attention
        assert att is not None
        need(att.num_heads, "num_attention_heads")
        if att.num_kv_heads % tp and tp % att.num_kv_heads:
            raise ConfigError(
                f"tensor_parallel_size={tp} and num_key_value_heads={att.num_kv_heads}: one must divide the other"
            )
    if cfg.gdn is not None and any(cfg.mixers[i] == "gdn" for i in cfg.recurrent_layers):
        need(cfg.gdn.num_k_heads, "linear_num_key_heads")
    if cfg.mamba is not None and any(cfg.mixers[i] != "gdn" for i in cfg.recurrent_layers):
        need(cfg.mamba.num_heads, "mamba_n_heads")
    need(cfg.intermediate_size, "intermediate_size")
    if cfg.moe is not None:
        need(cfg.moe.intermediate_size, "moe_intermediate_size")
        if cfg.moe.shared_intermediate_size:
            need(cfg.moe.shared_intermediate_size, "shared_expert_intermediate_size")


def check_pallas_shards(cfg: ModelConfig, tp: int) -> None:
    """Pallas kernels run per shard (``kernels/ops.per_shard``) only where a rank's heads are
    self-contained: its query heads' KV heads and its SSD heads' groups live on the rank. Raises
    :class:`ConfigError` naming the field otherwise (the XLA forms serve those models)."""
    if tp == 1:
        return
    if cfg.attention_layers and not kv_heads_sharded(cfg, tp):
        assert cfg.attention is not None
        raise ConfigError(
            f"kernels='pallas' with tensor_parallel_size={tp} needs num_key_value_heads={cfg.attention.num_kv_heads} "
            "divisible by it (replicated KV heads are served by the XLA kernel forms)"
        )
    if cfg.mamba is not None and any(cfg.mixers[i] != "gdn" for i in cfg.recurrent_layers) and not mamba_striped(cfg, tp):
        raise ConfigError(
            f"kernels='pallas' with tensor_parallel_size={tp} needs mamba_n_groups={cfg.mamba.n_groups} divisible by it "
            "(replicated groups are served by the XLA kernel forms)"
        )


# --- re-striping of Qwen3.5's q/k/v channels -------------------------------------------------


def stripe_permutation(gdn: GdnConfig, stripes: int) -> np.ndarray:
    """``perm`` with ``striped = hf[perm]`` over the ``conv_dim`` channels: stripe r is
    ``[q_r | k_r | v_r]``, the q, k and v channels of key heads ``r*nk/s .. (r+1)*nk/s``."""
    kd, vd = gdn.key_dim // stripes, gdn.value_dim // stripes
    parts = []
    for r in range(stripes):
        parts += [np.arange(r * kd, (r + 1) * kd), gdn.key_dim + np.arange(r * kd, (r + 1) * kd)]
        parts.append(2 * gdn.key_dim + np.arange(r * vd, (r + 1) * vd))
    return np.concatenate(parts)


def restripe(x: Any, gdn: GdnConfig, stripes: int, axis: int) -> Any:
    """HF channel order -> ``stripes`` stripes along ``axis``."""
    return jnp.take(x, stripe_permutation(gdn, stripes), axis=axis)


def unstripe(x: Any, gdn: GdnConfig, stripes: int, axis: int) -> Any:
    """Inverse of :func:`restripe`."""
    return jnp.take(x, np.argsort(stripe_permutation(gdn, stripes)), axis=axis)


def mamba_striped(cfg: ModelConfig, tp: int) -> bool:
    """Mamba2 ``in_proj``/conv are split per head group when the groups divide N (else replicated)."""
    return tp > 1 and cfg.mamba is not None and cfg.mamba.n_groups % tp == 0


def _mamba_param(cfg: ModelConfig, names: list[str]) -> str | None:
    """``"in_proj"`` / ``"conv1d"`` for a Mamba2 mixer's ``in_proj`` / conv parameter, else None."""
    if cfg.mamba is None or "linear_attn" in names:
        return None
    if "in_proj" in names:
        return "in_proj"
    return "conv1d" if "conv1d" in names else None


def restriped(cfg: ModelConfig, path: tuple[Any, ...]) -> bool:
    """Whether a parameter is re-striped at load: Qwen3.5's split ``in_proj_qkv`` and the GDN conv
    weight (Qwen3-Next's packed ``in_proj_qkvz`` is grouped per key head already); Mamba2's
    ``in_proj`` and conv weight/bias when ``MambaConfig.proj_stripes > 1``."""
    names = _names(path)
    if cfg.mamba is not None and cfg.mamba.proj_stripes > 1 and _mamba_param(cfg, names) is not None:
        return True
    if cfg.gdn is None or "linear_attn" not in names:
        return False
    return ("conv1d" in names and "weight" in names) or (not cfg.gdn.packed and "in_proj_qkv" in names)


def restripe_param(cfg: ModelConfig, path: tuple[Any, ...], x: Any, stripes: int, inverse: bool = False) -> Any:
    """A re-striped parameter (:func:`restriped`) from HF order (``inverse``: back to HF order)."""
    from radixflow_jax.models.mixers.mamba2 import conv_permutation, proj_permutation

    kind = _mamba_param(cfg, _names(path))
    if kind is None:
        assert cfg.gdn is not None
        return (unstripe if inverse else restripe)(x, cfg.gdn, stripes, axis=0)
    assert cfg.mamba is not None
    perm = (proj_permutation if kind == "in_proj" else conv_permutation)(cfg.mamba, stripes)
    return jnp.take(x, np.argsort(perm) if inverse else perm, axis=0)


# --- partition specs ---------------------------------------------------------------------------


def _names(path: tuple[Any, ...]) -> list[str]:
    return [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]


def param_spec(cfg: ModelConfig, path: tuple[Any, ...], ndim: int, tp: int) -> P:
    """The partition spec of one parameter (weights in ``[out, in]`` layout; experts ``[E, in, out]``)."""
    names = _names(path)
    if tp == 1 or ndim == 0:
        return P()
    mamba = "mamba" in names or "ssm" in names
    module = names[-3] if names[-1] == "value" and len(names) >= 3 else names[-2]
    leaf = names[-2] if names[-1] == "value" else names[-1]
    if module in ("k_proj", "v_proj") and not kv_heads_sharded(cfg, tp):
        return P()
    if "experts" in names and ndim == 3:
        return P(None, TENSOR, None) if leaf == "down_proj" else P(None, None, TENSOR)
    if leaf in ("A_log", "dt_bias", "D") and ndim == 1:
        return P(TENSOR)
    if _mamba_param(cfg, names) is not None and mamba_striped(cfg, tp):  # striped per head group
        return P(TENSOR, *([None] * (ndim - 1)))
    if mamba:  # in_proj / conv mix heads and groups that do not divide N: replicated; gated norm replicated
        return P(None, TENSOR) if module == "out_proj" and ndim == 2 else P()
    if module == "conv1d" and leaf == "weight" and cfg.gdn is not None:
        return P(TENSOR, None, None)
    if module in _COLUMN:
        return P(TENSOR, None) if ndim == 2 else P(TENSOR)
    if module in _ROW and ndim == 2:
        return P(None, TENSOR)
    return P()


def cache_specs(cfg: ModelConfig, tp: int) -> ModelCache:
    """Specs of the pools: KV pages on the KV-head axis (replicated when N exceeds the KV heads);
    GDN conv channels (striped) and states on heads; Mamba2 states on heads, conv replicated."""
    kv = P(None, None, TENSOR, None) if kv_heads_sharded(cfg, tp) else P()
    conv, ssm = [], []
    for i in cfg.recurrent_layers:
        gdn = cfg.mixers[i] == "gdn"
        conv.append(P(None, None, TENSOR) if gdn or mamba_striped(cfg, tp) else P())
        ssm.append(P(None, TENSOR, None, None))
    mtp = tuple((kv, kv) for _ in range(cfg.mtp_layers))  # the MTP layers' KV: as the trunk's
    return ModelCache(tuple((kv, kv) for _ in cfg.attention_layers), tuple(conv), tuple(ssm), mtp)


def striped_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    """``cfg`` with the stripe counts of an N-way split (GDN q/k/v channels; Mamba2 ``in_proj``/conv
    when its groups divide N)."""
    if cfg.gdn is not None:
        cfg = dataclasses.replace(cfg, gdn=dataclasses.replace(cfg.gdn, qkv_stripes=tp))
    if cfg.mamba is not None and mamba_striped(cfg, tp):
        cfg = dataclasses.replace(cfg, mamba=dataclasses.replace(cfg.mamba, proj_stripes=tp))
    return cfg


class ShardedModel(LoadedModel):
    """A :class:`LoadedModel` whose parameters live on a tensor-parallel mesh; pools it creates are
    placed by :func:`cache_specs`. ``config.gdn.qkv_stripes == tensor_parallel_size``."""

    def __init__(self, base: LoadedModel, mesh: Mesh):
        tp = mesh.shape[TENSOR]
        check_tensor_parallel(base.config, tp)
        cfg = base.config
        cfg = striped_config(cfg, tp)
        graphdef, _ = abstract_model(cfg, base.dtype)

        def place(path: tuple[Any, ...], x: jax.Array) -> jax.Array:
            if restriped(cfg, path):
                x = restripe_param(cfg, path, x, tp)
            target = NamedSharding(mesh, param_spec(cfg, path, x.ndim, tp))
            if isinstance(x.sharding, NamedSharding) and x.sharding == target:
                return x  # restored straight into its layout (load_sharded)
            return jax.device_put(x, target)

        params = jax.tree_util.tree_map_with_path(place, base.params)
        self.mesh = mesh
        self.tensor_parallel_size = tp
        super().__init__(base.model_dir, cfg, graphdef, params, base.dtype, base.tokenizer)

    def cache_shardings(self) -> ModelCache:
        specs = cache_specs(self.config, self.tensor_parallel_size)
        return jax.tree.map(lambda s: NamedSharding(self.mesh, s), specs, is_leaf=lambda x: isinstance(x, P))

    def place_cache(self, cache: ModelCache) -> ModelCache:
        return jax.device_put(cache, self.cache_shardings())

    def _forward_impl(self, params, tokens, batch, cache, *, num_decode):  # type: ignore[no-untyped-def]
        from radixflow_jax.kernels import ops

        with ops.per_shard(self.mesh, TENSOR):  # Pallas kernels (if selected) run per shard
            logits, cache = super()._forward_impl(params, tokens, batch, cache, num_decode=num_decode)
        return logits, jax.lax.with_sharding_constraint(cache, self.cache_shardings())

    def recurrent_states(self, seq):  # type: ignore[no-untyped-def]
        """As :meth:`LoadedModel.recurrent_states`, with GDN conv channels back in HF order."""
        states = super().recurrent_states(seq)
        out = []
        for i, (conv, ssm) in zip(self.config.recurrent_layers, states):
            if self.config.mixers[i] == "gdn" and self.config.gdn is not None:
                conv = np.asarray(unstripe(conv, self.config.gdn, self.tensor_parallel_size, axis=-1))
            elif self.config.mamba is not None and self.config.mamba.proj_stripes > 1:
                from radixflow_jax.models.mixers.mamba2 import conv_permutation

                perm = conv_permutation(self.config.mamba, self.config.mamba.proj_stripes)
                conv = np.take(conv, np.argsort(perm), axis=-1)
            out.append((conv, ssm))
        return out


def load_sharded(
    path_or_preset: str, dtype: str, tensor_parallel_size: int, first_device: int | None = None
) -> LoadedModel:
    """Loads a model onto a ``(1, N)`` mesh from local device ``first_device`` (default 0). An orbax
    directory (``radixflow convert``) is restored straight into the sharded layout (every parameter
    with its target ``NamedSharding``; the re-striped ones replicated, then re-striped in place);
    other formats load on one device and are then placed by :func:`shard_model`."""
    from radixflow_jax.models.api import load, read_config, resolve_dtype, resolve_model_path
    from radixflow_jax.models.weights import has_orbax, load_orbax_state

    path = resolve_model_path(path_or_preset)
    if not os.path.isdir(path) or not has_orbax(path):
        return shard_model(load(path_or_preset, dtype=dtype), tensor_parallel_size, first_device)
    cfg = read_config(path)
    check_tensor_parallel(cfg, tensor_parallel_size)
    mesh = make_mesh(tensor_parallel_size, first_device=first_device or 0)

    striped = striped_config(cfg, tensor_parallel_size)

    def sharding(p: tuple[Any, ...], leaf: Any) -> NamedSharding:
        spec = P() if restriped(striped, p) else param_spec(cfg, p, len(leaf.shape), tensor_parallel_size)
        return NamedSharding(mesh, spec)

    jdtype = resolve_dtype(dtype)
    graphdef, state = load_orbax_state(path, cfg, jdtype, sharding)
    return ShardedModel(LoadedModel(path, cfg, graphdef, state, jdtype), mesh)


def shard_model(model: LoadedModel, tensor_parallel_size: int, first_device: int | None = None) -> LoadedModel:
    """``model`` unchanged for N == 1 without a ``first_device``, else a :class:`ShardedModel` on a
    ``(1, N)`` mesh over local devices ``first_device .. first_device + N - 1`` (default 0): one
    data-parallel replica's device group."""
    if tensor_parallel_size == 1 and first_device is None:
        return model
    check_tensor_parallel(model.config, tensor_parallel_size)
    return ShardedModel(model, make_mesh(tensor_parallel_size, first_device=first_device or 0))
