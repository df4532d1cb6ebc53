"""Where data-parallel replicas live: which local devices each replica's model takes, and the
model copy of each replica (one per device group, or one shared)."""

from __future__ import annotations

from radixflow_jax.models.api import LoadedModel, load


def replica_groups(data_parallel_size: int, tensor_parallel_size: int) -> list[int] | None:
    """First local device of each replica's group, or ``None`` when the replicas share one model
    (one replica, or N == 1 replicas on a process with fewer than M devices)."""
    import jax

    m, n = data_parallel_size, tensor_parallel_size
    if m < 1 or n < 1:
        raise ValueError(f"data_parallel_size={m} and tensor_parallel_size={n} must be >= 1")
    if m == 1:
        return None
    have = len(jax.local_devices())
    if m * n <= have:
        return [i * n for i in range(m)]
    if n == 1:
        return None
    raise ValueError(
        f"data_parallel_size={m} x tensor_parallel_size={n} needs {m * n} local devices, {have} are available"
    )


def replica_models(
    model: str | LoadedModel, dtype: str, tensor_parallel_size: int, data_parallel_size: int, *, mtp: bool = False
) -> list[LoadedModel]:
    """The model of each data-parallel replica, placed as ``replica_groups`` says: one copy per
    device group (an orbax directory restores straight into the shards), or one copy shared by
    every replica when they share a device. ``mtp``: with the checkpoint's MTP layers (speculative
    method ``mtp``; one device for now)."""
    from radixflow_jax.models.sharding import load_sharded, shard_model

    groups = replica_groups(data_parallel_size, tensor_parallel_size)
    if mtp and (tensor_parallel_size > 1 or groups is not None):
        raise ValueError("speculative method 'mtp' runs on one device for now (tensor_parallel_size=1, no groups)")
    if isinstance(model, str) and (tensor_parallel_size > 1 or groups is not None):
        models = [load_sharded(model, dtype, tensor_parallel_size, first_device=g) for g in groups or [0]]
        return models if groups is not None else models * data_parallel_size
    loaded = model if isinstance(model, LoadedModel) else load(model, dtype=dtype, mtp=mtp)
    if groups is None:  # one model (on device 0, or a tp group from device 0) shared by the replicas
        return [shard_model(loaded, tensor_parallel_size)] * data_parallel_size
    return [shard_model(loaded, tensor_parallel_size, first_device=g) for g in groups]
