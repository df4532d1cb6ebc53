"""Host-side prefix cache: radix tree of KV pages + recurrent-state checkpoints, pools, eviction.

Plain Python over integers: this package imports neither JAX nor numpy (docs/design.md, "Layers").
"""

from radixflow_jax.cache.config import CacheConfig
from radixflow_jax.cache.eviction import EvictionPolicy, EvictTarget, FlopAwarePolicy, LRUPolicy
from radixflow_jax.cache.placement import branch_point, checkpoint_positions, end_position, grid_positions
from radixflow_jax.cache.pools import RESERVED_ID, HostPool, InvariantError, PagePool, SlotPool
from radixflow_jax.cache.radix import RadixCache
from radixflow_jax.cache.results import CacheStats, InsertResult, MatchResult, StateMove
from radixflow_jax.cache.tree import Checkpoint, CheckpointStatus, Node, PendingCheckpointError

__all__ = [
    "RESERVED_ID",
    "CacheConfig",
    "CacheStats",
    "Checkpoint",
    "CheckpointStatus",
    "EvictTarget",
    "EvictionPolicy",
    "FlopAwarePolicy",
    "HostPool",
    "InsertResult",
    "InvariantError",
    "LRUPolicy",
    "MatchResult",
    "Node",
    "PagePool",
    "PendingCheckpointError",
    "RadixCache",
    "SlotPool",
    "StateMove",
    "branch_point",
    "checkpoint_positions",
    "end_position",
    "grid_positions",
]
