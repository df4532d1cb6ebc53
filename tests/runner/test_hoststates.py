"""The host tier's memory (``runner/hoststates.py``) against numpy: a spill then a restore moves a
device slot's conv and SSM rows of every recurrent layer into another slot through host memory;
every host slot, the last one included, is usable; a host row spilled twice holds the later state;
padding and untouched slots keep their values; more pairs than the width run in several calls."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax.cache import StateMove
from radixflow_jax.models.batch import ModelCache
from radixflow_jax.runner.hoststates import HostStates
from radixflow_jax.runner.pagecopy import StateCopier


def _cache(rng: np.random.Generator, slots: int = 6) -> ModelCache:
    conv = tuple(jnp.asarray(rng.standard_normal((slots, 2, 5)), jnp.float32) for _ in range(2))
    ssm = tuple(jnp.asarray(rng.standard_normal((slots, 3, 4)), jnp.float32) for _ in range(2))
    return ModelCache(kv=(), conv=conv, ssm=ssm)


def _arrays(cache: ModelCache) -> list[np.ndarray]:
    return [np.asarray(a).copy() for a in (*cache.conv, *cache.ssm)]


def test_spill_and_restore_through_every_host_slot() -> None:
    cache = _cache(np.random.default_rng(0))
    host = HostStates(cache, 3, width=2)
    before = _arrays(cache)
    host.spill(cache, [(1, 1), (2, 2), (3, 3)])  # host slot 3 is the last: row 3 exists
    cache = host.restore(cache, [(3, 4), (1, 5)])
    for b, a in zip(before, _arrays(cache)):
        want = b.copy()
        want[[4, 5]] = b[[3, 1]]
        np.testing.assert_array_equal(a, want)
    assert all(a.shape[0] == 4 for a in (*host.conv, *host.ssm))  # rows 0 .. 3


def test_a_row_spilled_twice_holds_the_later_state_and_moves_apply_in_order() -> None:
    rng = np.random.default_rng(1)
    cache = _cache(rng)
    host = HostStates(cache, 2, width=1)
    before = _arrays(cache)
    moves = [StateMove("spill", 1, 2), StateMove("copy", 3, 1), StateMove("spill", 1, 2),
             StateMove("restore", 2, 5)]  # fmt: skip
    cache = host.apply_moves(cache, moves, StateCopier(2))
    for b, a in zip(before, _arrays(cache)):
        want = b.copy()
        want[1] = b[3]
        want[5] = b[3]  # the second spill read slot 1 after the copy into it
        np.testing.assert_array_equal(a, want)
    with pytest.raises(ValueError, match="num_host_slots"):
        HostStates(cache, 0, width=1)
