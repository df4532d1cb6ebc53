"""Unit and property tests of the reference-counted page and slot pools."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixflow_jax.cache import InvariantError, PagePool, SlotPool


@pytest.mark.parametrize("pool_cls", [PagePool, SlotPool])
def test_reserved_id_zero_is_never_handed_out(pool_cls):
    pool = pool_cls(5)
    assert pool.capacity == 4 and pool.num_free == 4 and pool.num_used == 0
    ids = pool.alloc(4)
    assert ids == [1, 2, 3, 4]
    assert pool.alloc(1) is None
    for bad in (0, 5, -1):
        with pytest.raises(ValueError):
            pool.incref(bad)
        with pytest.raises(ValueError):
            pool.decref(bad)
    pool.check_invariants()


def test_alloc_is_transactional():
    pool = PagePool(4)
    first = pool.alloc(2)
    assert first == [1, 2]
    before = (pool.num_free, pool.num_used, [pool.refcount(i) for i in range(1, 4)])
    assert pool.alloc(2) is None  # only one left: all or nothing
    assert (pool.num_free, pool.num_used, [pool.refcount(i) for i in range(1, 4)]) == before
    assert pool.alloc(1) == [3]
    assert pool.alloc(0) == []
    with pytest.raises(ValueError):
        pool.alloc(-1)
    pool.check_invariants()


def test_refcounts_free_at_zero_and_never_go_negative():
    pool = SlotPool(3)
    (s,) = pool.alloc(1)
    pool.incref(s)
    assert pool.refcount(s) == 2
    assert pool.decref(s) is False
    assert pool.num_free == 1
    assert pool.decref(s) is True
    assert pool.is_free(s) and pool.num_free == 2
    with pytest.raises(ValueError):
        pool.decref(s)  # below zero
    with pytest.raises(ValueError):
        pool.incref(s)  # no resurrection of a free id
    assert pool.refcount(s) == 0
    pool.check_invariants()


def test_release_and_reuse_order_is_deterministic():
    pool = PagePool(6)
    ids = pool.alloc(5)
    assert pool.release(ids[1:3]) == 2
    assert pool.alloc(2) == [3, 2]  # last freed, first reused
    pool.check_invariants()


def test_check_invariants_detects_corruption():
    pool = PagePool(4)
    pool.alloc(1)
    pool._free.append(1)  # an owned page on the free list
    with pytest.raises(InvariantError):
        pool.check_invariants()


def test_bad_sizes_and_types():
    with pytest.raises(ValueError):
        PagePool(0)
    pool = PagePool(1)  # only the reserved page
    assert pool.capacity == 0 and pool.alloc(1) is None and pool.alloc(0) == []
    with pytest.raises(TypeError):
        PagePool(3).incref(True)


def test_slot_pool_hands_request_slots_low_and_checkpoint_slots_high():
    pool = SlotPool(9)
    assert pool.alloc(2) == [1, 2] and pool.alloc_high(2) == [8, 7]
    assert pool.alloc(1) == [3]
    pool.release([2, 8])
    assert pool.alloc(1) == [2] and pool.alloc_high(1) == [8]  # the lowest / highest free, not the last freed
    assert pool.alloc_high(3) == [6, 5, 4] and pool.alloc(1) is None and pool.alloc_high(1) is None
    pool.check_invariants()


def test_checkpoints_leave_the_request_band_to_requests_unless_allowed():
    pool = SlotPool(9, request_slots=3)  # the band: slots 1, 2, 3
    assert pool.alloc_high(5, band=False) == [8, 7, 6, 5, 4]
    assert pool.alloc_high(1, band=False) is None  # only band slots are free
    assert pool.alloc(1) == [1]
    assert pool.alloc_high(1) == [3]  # allowed: the band's highest free slot
    pool.release([5])
    assert pool.alloc_high(2, band=False) is None and pool.alloc_high(1, band=False) == [5]
    assert SlotPool(3, request_slots=8).request_slots == 2  # never more than the pool
    pool.check_invariants()


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(1, 8),
    slots=st.booleans(),
    ops=st.lists(st.tuples(st.sampled_from("ahid"), st.integers(0, 8)), max_size=60),
)
def test_pool_matches_a_model(size, slots, ops):
    """Random alloc/incref/decref against a dict model: counts, free xor owned, never negative;
    a slot pool's low and high ends hand out the lowest and highest free ids."""
    pool = SlotPool(size) if slots else PagePool(size)
    model: dict[int, int] = {}
    for op, arg in ops:
        if op in "ah":
            free = sorted(set(range(1, size)) - set(model))
            got = pool.alloc_high(arg) if op == "h" and slots else pool.alloc(arg)
            if slots and got is not None:
                assert sorted(got) == (free[len(free) - arg :] if op == "h" else free[:arg])
            if arg > size - 1 - len(model):
                assert got is None
            else:
                assert got is not None and len(got) == arg and not set(got) & set(model)
                model.update({i: 1 for i in got})
        elif op == "i":
            if arg in model:
                pool.incref(arg)
                model[arg] += 1
            else:
                with pytest.raises(ValueError):
                    pool.incref(arg)
        else:
            if arg in model:
                freed = pool.decref(arg)
                model[arg] -= 1
                assert freed == (model[arg] == 0)
                if freed:
                    del model[arg]
            else:
                with pytest.raises(ValueError):
                    pool.decref(arg)
        pool.check_invariants()
        assert pool.num_used == len(model) and pool.num_free == size - 1 - len(model)
        assert all(pool.refcount(i) == n for i, n in model.items())
