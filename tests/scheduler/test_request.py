"""``Request.token_span`` equals slicing the whole token sequence, on every boundary case; a request's
life through its methods (launch, commit, requeue, finish) and the allocator's all-or-nothing seat."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from radixflow_jax.cache import CacheConfig, PagePool, RadixCache, SlotPool
from radixflow_jax.scheduler.allocator import Allocator
from radixflow_jax.scheduler.plan import UNKNOWN_TOKEN
from radixflow_jax.scheduler.request import Request, RequestStatus


@given(
    prompt=st.lists(st.integers(0, 50), min_size=1, max_size=12),
    output=st.lists(st.integers(0, 50), max_size=12),
    bounds=st.tuples(st.integers(0, 26), st.integers(0, 26)),
)
def test_token_span_is_a_slice_of_tokens(prompt: list[int], output: list[int], bounds: tuple[int, int]) -> None:
    req = Request(1, tuple(prompt), max_tokens=32)
    req.output.extend(output)
    start, end = min(bounds), max(bounds)
    span = req.token_span(start, end)
    assert span == req.tokens[start:end]
    assert isinstance(span, tuple)


def test_launch_commit_and_requeue_keep_the_overlap_counts() -> None:
    req = Request(1, (1, 2, 3), max_tokens=4)
    req.start_running()
    req.launch(0, 3, sample=True, launch_index=5)  # the prompt, launched: its token is not known yet
    assert (req.num_computed, req.uncommitted_tokens, req.unknown_tokens, req.last_launch) == (3, 3, 1, 5)
    assert req.output == [UNKNOWN_TOKEN] and req.committed_output == []
    req.launch(3, 4, sample=True, launch_index=6)  # the next decode row, launched before the commit
    req.commit_span(0, 3, launched=True)
    req.commit_token(9, 3, launched=True, round_index=1)
    assert req.output == [9, UNKNOWN_TOKEN] and req.committed_output == [9] and req.first_token_round == 1
    assert (req.num_computed, req.uncommitted_tokens, req.unknown_tokens) == (4, 1, 1)
    req.requeue(preempted=True)  # back to the queue: the uncommitted work goes, a new epoch
    assert req.output == [9] and (req.num_computed, req.uncommitted_tokens, req.unknown_tokens) == (0, 0, 0)
    assert req.status is RequestStatus.WAITING and (req.epoch, req.num_preemptions, req.num_rollbacks) == (1, 1, 0)
    req.requeue(preempted=False)
    assert (req.epoch, req.num_preemptions, req.num_rollbacks) == (2, 1, 1)
    req.commit_span(0, 4, launched=False)  # without overlap a commit advances the request itself
    req.commit_token(4, 4, launched=False, round_index=2)
    assert req.output == [9, 4] and req.num_computed == 4 and req.first_token_round == 1
    req.finish("length")
    assert req.is_finished and req.finish_reason == "length"
    req.amend_finish_reason("stop")
    assert req.finish_reason == "stop"


def _allocator(num_pages: int, num_slots: int) -> Allocator:
    cfg = CacheConfig(page_size=4, grid=8, hybrid=True)
    pages, slots = PagePool(num_pages), SlotPool(num_slots)
    return Allocator(cfg, pages, slots, RadixCache(cfg, pages, slots))


def test_seat_is_all_or_nothing() -> None:
    alloc = _allocator(num_pages=6, num_slots=2)  # 5 usable pages (id 0 is reserved), 1 usable slot
    req = Request(1, tuple(range(24)), max_tokens=2)
    assert not alloc.seat(req, computed=0, end=24, slot=True)  # 6 pages wanted
    assert (req.pages, req.own_pages, req.slot, req.num_computed) == ([], [], None, 0)
    assert alloc.pages.num_used == 0 and alloc.slots.num_used == 0
    assert alloc.seat(req, computed=0, end=12, slot=True)
    assert len(req.own_pages) == 3 and req.pages == req.own_pages and req.slot is not None
    other = Request(2, tuple(range(20)), max_tokens=2)
    assert not alloc.seat(other, computed=8, end=12, shared_pages=req.pages[:2], slot=True)  # no slot left
    assert (other.pages, other.own_pages, other.slot) == ([], [], None) and alloc.pages.refcount(req.pages[0]) == 1
    assert alloc.seat(other, computed=8, end=12, shared_pages=req.pages[:2], slot=False)
    assert other.own_pages[:2] == req.pages[:2] and len(other.own_pages) == 3
    assert alloc.pages.refcount(req.pages[0]) == 2
    assert other.num_computed == other.cached_tokens == 8
