"""Where a restore's slot comes from (``Allocator.restore``): above the request band, evicting
(demoting) committed checkpoints there as planting does; a slot of the band only while nothing else
is pending (a burst of returning conversations must not hold every slot with restores waiting for
their round while no request can be admitted; a lone restore commits with the next round)."""

from __future__ import annotations

from radixflow_jax.cache import CacheConfig, HostPool, PagePool, RadixCache, SlotPool
from radixflow_jax.scheduler.allocator import Allocator
from tests.cache.helpers import committed_checkpoint

A = list(range(100, 112))
B = list(range(200, 212))


def _demoted(*, num_slots: int, band: int) -> tuple[Allocator, list]:
    """An allocator whose cache holds A's and B's checkpoints on the host only."""
    cfg = CacheConfig(page_size=2, grid=4, hybrid=True)
    pages, slots = PagePool(32), SlotPool(num_slots, request_slots=band)
    alloc = Allocator(cfg, pages, slots, RadixCache(cfg, pages, slots, host_pool=HostPool(5)))
    cache = alloc.cache
    committed_checkpoint(cache, A, 8)
    committed_checkpoint(cache, B, 8)
    assert cache.evict_states(2) == 2 and cache.take_moves()[0]  # both demoted, spills queued
    nodes = [cache.match(t + [1]).host_node for t in (A, B)]
    assert all(n is not None and n.checkpoint.on_host for n in nodes)
    return alloc, nodes


def test_restores_take_no_band_slot_while_another_is_pending() -> None:
    alloc, (node_a, node_b) = _demoted(num_slots=6, band=2)  # band: slots 1, 2; above: 3, 4, 5
    cache = alloc.cache
    held = cache.slot_pool.alloc_high(2, band=False)  # something else holds two slots above the band
    assert held is not None and cache.slot_pool.num_free == 3
    assert alloc.restore(node_a) and node_a.checkpoint.restoring and cache.has_pending
    (move,), (rid,) = cache.take_moves()
    assert move.kind == "restore" and move.dst > alloc.slots.request_slots
    assert not alloc.restore(node_b)  # only band slots are free and A's restore is pending
    assert cache.slot_pool.num_free == 2 and node_b.checkpoint.on_host and not cache.restores_queued
    cache.slot_pool.release(held[:1])
    assert alloc.restore(node_b)
    (move,), _ = cache.take_moves()
    assert move.dst == held[0] and cache.commit(rid) == 1


def test_a_lone_restore_may_take_a_band_slot() -> None:
    alloc, (node_a, _) = _demoted(num_slots=5, band=2)
    cache = alloc.cache
    held = cache.slot_pool.alloc_high(2, band=False)  # every slot above the band
    assert held is not None and not cache.has_pending
    assert alloc.restore(node_a)
    (move,), _ = cache.take_moves()
    assert move.dst <= alloc.slots.request_slots
