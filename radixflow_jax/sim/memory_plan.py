"""Memory plans from a configuration alone: what a model's weights, KV pages, state slots and
checkpoints take on a device, before any weight is loaded.

The parameter bytes come from the abstract model (``models/weights.abstract_model``: shapes only),
and the pools from ``engine/build.memory_pools``, the very sizer ``radixflow serve
--memory-fraction`` uses, so a plan and the server agree on the pools of a model (the server passes
the loaded parameters' bytes, which equal the abstract ones). A model that does not fit one chip is
planned over ``tensor_parallel`` chips: parameters, pages and slots spread evenly over them (what
``models/sharding.py`` does with heads and MLP columns), the activation reserve counted once (it is
sharded too).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from radixflow_jax.engine.build import memory_pools, pool_units
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.models.config import ModelConfig
from radixflow_jax.models.weights import abstract_model
from radixflow_jax.sim.specs import DeviceSpec

TENSOR_PARALLEL = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Pools of ``model`` on ``tensor_parallel`` chips of ``device`` (``num_pages`` / ``num_slots``
    include the reserved id 0 of each pool). ``checkpoint_slots``: the state slots left for prefix
    checkpoints once every running request (``max_num_seqs``) holds one. ``fits`` is False when no
    tensor-parallel size up to 8 leaves room; the pool fields are 0 then. Bytes and pool sizes are
    totals over the ``tensor_parallel`` chips."""

    model: str
    device: str
    dtype: str
    tensor_parallel: int
    param_bytes: int
    page_bytes: int
    slot_bytes: int
    num_pages: int
    num_slots: int
    kv_tokens: int
    checkpoint_slots: int
    fits: bool

    def line(self) -> str:
        head = f"{self.model:>14s} {self.device:>8s} {self.dtype:>9s}"
        if not self.fits:
            return f"{head} does not fit on {TENSOR_PARALLEL[-1]} chips"
        note = f"needs tensor parallel >= {self.tensor_parallel}" if self.tensor_parallel > 1 else "one chip"
        return (
            f"{head} {self.param_bytes / 2**30:8.2f} {self.num_pages - 1:9d} {self.kv_tokens:10d} "
            f"{self.num_slots - 1:6d} {self.checkpoint_slots:6d}  {note}"
        )


HEADER = (
    f"{'model':>14s} {'device':>8s} {'dtype':>9s} {'param GiB':>8s} {'KV pages':>9s} {'KV tokens':>10s} "
    f"{'slots':>6s} {'ckpts':>6s}  chips"
)


def param_bytes(cfg: ModelConfig, dtype: str) -> int:
    """Bytes of the model's parameters in ``dtype``, from the abstract model (nothing allocated)."""
    _, state = abstract_model(cfg, np.dtype(dtype))
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(state))


def plan(
    name: str,
    cfg: ModelConfig,
    device: DeviceSpec,
    ec: EngineConfig,
    *,
    dtype: str = "bfloat16",
    fraction: float = 0.9,
    params: int | None = None,
) -> MemoryPlan:
    """The plan on the fewest chips (1, 2, 4 or 8) where ``memory_pools`` leaves room for pools;
    ``params``: the model's parameter bytes in ``dtype`` when known (:func:`param_bytes` builds
    the abstract model, seconds for a 27B one)."""
    params = param_bytes(cfg, dtype) if params is None else params
    page, slot = pool_units(cfg, dtype, ec)
    for tp in TENSOR_PARALLEL:
        try:
            pages, slots = memory_pools(cfg, dtype, ec, fraction, int(tp * device.memory_bytes), params)
        except ValueError:
            continue
        checkpoints = max(slots - 1 - ec.scheduler.max_num_seqs, 0) if cfg.is_hybrid else 0
        return MemoryPlan(
            model=name, device=device.name, dtype=dtype, tensor_parallel=tp, param_bytes=params, page_bytes=page,
            slot_bytes=slot, num_pages=pages, num_slots=slots, kv_tokens=(pages - 1) * ec.scheduler.page_size,
            checkpoint_slots=checkpoints, fits=True,
        )
    return MemoryPlan(
        model=name, device=device.name, dtype=dtype, tensor_parallel=TENSOR_PARALLEL[-1], param_bytes=params,
        page_bytes=page, slot_bytes=slot, num_pages=0, num_slots=0, kv_tokens=0, checkpoint_slots=0, fits=False,
    )
