"""The host tier's memory (``runner/hoststates.py``) against numpy: a spill then a restore moves a
device slot's conv and SSM rows of every recurrent layer into another slot through host memory;
every host slot, the last one included, is usable; a host row spilled twice holds the later state;
padding and untouched slots keep their values; more pairs than the width run in several calls. KV
pages the same way (``kv_spill`` / ``kv_restore``, every attention and MTP layer's K and V),
interleaved with state moves in one ordered list; a tier of pages only; refusals; the model
executor's pools (a tiny model with its MTP layer) through a plan of KV moves only."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax.cache import StateMove
from radixflow_jax.models.batch import ModelCache
from radixflow_jax.runner.hoststates import HostStates
from radixflow_jax.runner.pagecopy import StateCopier


def _cache(rng: np.random.Generator, slots: int = 6, *, pages: int = 0, mtp: int = 0) -> ModelCache:
    """Two recurrent layers (when ``slots``); with ``pages``, two attention layers and ``mtp`` MTP
    layers of ``pages`` pages (page 2, 1 KV head, dim 3)."""
    conv = tuple(jnp.asarray(rng.standard_normal((slots, 2, 5)), jnp.float32) for _ in range(2 if slots else 0))
    ssm = tuple(jnp.asarray(rng.standard_normal((slots, 3, 4)), jnp.float32) for _ in range(2 if slots else 0))

    def layer() -> tuple[jnp.ndarray, jnp.ndarray]:
        return tuple(jnp.asarray(rng.standard_normal((pages, 2, 1, 3)), jnp.bfloat16) for _ in range(2))  # type: ignore

    kv = tuple(layer() for _ in range(2 if pages else 0))
    return ModelCache(kv=kv, conv=conv, ssm=ssm, mtp=tuple(layer() for _ in range(mtp)))


def _arrays(cache: ModelCache) -> list[np.ndarray]:
    return [np.asarray(a).copy() for a in (*cache.conv, *cache.ssm)]


def _page_arrays(cache: ModelCache) -> list[np.ndarray]:
    return [np.asarray(a).copy() for pair in (*cache.kv, *cache.mtp) for a in pair]


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


def test_kv_pages_round_trip_through_host_pages_in_every_layer() -> None:
    cache = _cache(np.random.default_rng(2), slots=0, pages=7, mtp=1)
    host = HostStates(cache, 0, width=2, num_host_pages=4)  # a tier of KV pages only
    cache = host.prime(cache)
    before = _page_arrays(cache)
    moves = [StateMove("kv_spill", p, h) for p, h in ((1, 1), (2, 4), (3, 2))]  # host page 4 is the last
    moves += [StateMove("kv_restore", 4, 5), StateMove("kv_restore", 1, 6), StateMove("kv_restore", 2, 1)]
    cache = host.apply_moves(cache, moves, StateCopier(2))  # page 1, freed by its spill, is written back
    after = _page_arrays(cache)
    assert len(after) == 6  # two attention layers and one MTP layer, K and V each
    for b, a in zip(before, after):
        want = b.copy()
        want[[5, 6, 1]] = b[[2, 1, 3]]
        np.testing.assert_array_equal(a, want)
    assert len(host.kv) == 2 and len(host.mtp) == 1 and host.kv[0][0].shape == (5, 2, 1, 3)  # rows 0 .. 4
    assert not host.conv and not host.ssm
    with pytest.raises(ValueError, match="host slots"):  # no checkpoint rows in this tier
        host.apply_moves(cache, [StateMove("spill", 1, 1)], StateCopier(2))
    with pytest.raises(ValueError, match="host pages"):  # host page 5 is past this tier's 4
        host.apply_moves(cache, [StateMove("kv_spill", 1, 5)], StateCopier(2))


def test_state_and_kv_moves_interleave_in_order() -> None:
    rng = np.random.default_rng(3)
    cache = _cache(rng, pages=6)
    host = HostStates(cache, 2, width=1, num_host_pages=3)
    cache = host.prime(cache)
    states, pages = _arrays(cache), _page_arrays(cache)
    moves = [StateMove("kv_spill", 1, 3), StateMove("spill", 2, 1), StateMove("kv_spill", 4, 1),
             StateMove("copy", 3, 2), StateMove("kv_restore", 3, 4), StateMove("kv_restore", 1, 1),
             StateMove("spill", 2, 2)]  # fmt: skip
    cache = host.apply_moves(cache, moves, StateCopier(1))
    # a later round: a state spilled in the earlier one comes back, with pages spilled in it
    cache = host.apply_moves(cache, [StateMove("restore", 1, 5), StateMove("restore", 2, 4),
                                     StateMove("kv_restore", 3, 5)], StateCopier(1))  # fmt: skip
    for b, a in zip(states, _arrays(cache)):
        want = b.copy()
        want[2] = b[3]
        want[5] = b[2]  # spilled before the copy into slot 2
        want[4] = b[3]  # spilled after it
        np.testing.assert_array_equal(a, want)
    for b, a in zip(pages, _page_arrays(cache)):
        want = b.copy()
        want[[4, 1, 5]] = b[[1, 4, 1]]
        np.testing.assert_array_equal(a, want)


def test_refusals() -> None:
    cache = _cache(np.random.default_rng(4), pages=3)
    with pytest.raises(ValueError, match="num_host_pages"):
        HostStates(cache, 0, width=1, num_host_pages=0)
    with pytest.raises(ValueError, match="num_host_pages"):
        HostStates(cache, 2, width=1, num_host_pages=-1)
    host = HostStates(cache, 2, width=1)  # checkpoints only
    assert not host.kv and not host.mtp
    with pytest.raises(ValueError, match="host pages"):
        host.apply_moves(cache, [StateMove("kv_restore", 1, 1)], StateCopier(1))


def test_the_executor_moves_kv_pages_of_a_model_with_mtp_layers() -> None:
    from radixflow_jax.engine.executor import ModelExecutor
    from radixflow_jax.models.api import load
    from radixflow_jax.runner.shapes import ShapeConfig
    from radixflow_jax.scheduler.plan import RoundPlan, RoundStats

    model = load("tiny-qwen3.5", mtp=True)
    shapes = ShapeConfig(max_num_batched_tokens=64, max_num_seqs=2, max_pages_per_row=8, grid=16, max_draft=1, mtp=True)
    options = dict(page_size=16, num_pages=8, num_slots=4, warmup=False)
    ex = ModelExecutor(model, shapes, **options, num_host_pages=3)  # type: ignore[arg-type]
    rng = np.random.default_rng(5)
    pools = (*ex.cache.kv, *ex.cache.mtp)
    random = [tuple(jnp.asarray(rng.standard_normal(a.shape), a.dtype) for a in pair) for pair in pools]
    ex.cache = ex.cache._replace(kv=tuple(random[: len(ex.cache.kv)]), mtp=tuple(random[len(ex.cache.kv) :]))
    ex.warmup([], scorer=False)  # primes the host tier's page programs (and none for states: no host slots)
    before = _page_arrays(ex.cache)
    moves = (StateMove("kv_spill", 2, 1), StateMove("kv_spill", 3, 3), StateMove("kv_restore", 3, 2),
             StateMove("kv_restore", 1, 5))  # fmt: skip
    ex.launch(RoundPlan(rows=(), num_decode=0, stats=RoundStats(), state_moves=moves), {})
    after = _page_arrays(ex.cache)
    assert len(after) == 2 * (len(model.config.attention_layers) + 1)  # the MTP layer's K and V too
    for b, a in zip(before, after):
        want = b.copy()
        want[[2, 5]] = b[[3, 2]]
        np.testing.assert_array_equal(a, want)
    bare = ModelExecutor(model, shapes, **options)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="KV pages.*no host tier"):
        bare.launch(RoundPlan(rows=(), num_decode=0, stats=RoundStats(), state_moves=moves[:1]), {})
