"""Hypothesis state-machine test: random request lifecycles against tiny pools.

The machine plays scheduler and device at once. Requests are admitted (match, lock the usable hit,
allocate pages all-or-nothing, plant pending checkpoints at grid/branch/end positions), their round
runs (the "device" writes each page's tokens and each planted slot's prefix), then they are
committed (commit fence + insert) and finish, or they are aborted at any point (unpublish). Probes,
evictions and flushes are interleaved. Checked after every step: the cache and pool invariants;
exact reference accounting (pool refcount == tree references + requests' own references); every
committed page and committed checkpoint holds exactly the data a cold run writes; no match ever
returns a pending checkpoint as usable; locked nodes and pending data survive eviction; and when
every request is gone and the cache is flushed, every page and slot is free. With a host tier for
KV pages, evicted pages are spilled there (the machine copies the data as the executor would) and
promoted back; a promoted page holds what a cold run writes, like any other.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixflow_jax.cache import (
    CacheConfig,
    FlopAwarePolicy,
    HostPool,
    Node,
    PagePool,
    PendingCheckpointError,
    RadixCache,
    SlotPool,
    checkpoint_positions,
)
from radixflow_jax.cache.invariants import host_page_references, tree_references
from radixflow_jax.cache.tree import iter_nodes
from tests.cache.helpers import Matched, matched

TOKENS = st.lists(st.integers(0, 1), min_size=0, max_size=9)


@dataclass
class Request:
    rid: int
    tokens: tuple[int, ...]
    lock: Node
    table: list[int]
    own: list[int]
    planted: list[tuple[int, int]] = field(default_factory=list)  # (depth, slot)
    ran: bool = False
    committed: bool = False


class CacheMachine(RuleBasedStateMachine):
    @initialize(
        page_size=st.sampled_from([1, 2]),
        grid_pages=st.integers(1, 3),
        hybrid=st.booleans(),
        num_pages=st.integers(3, 24),
        num_slots=st.integers(2, 6),
        flop_aware=st.booleans(),
        host_pages=st.sampled_from([0, 0, 4, 10]),
    )
    def setup(
        self, page_size: int, grid_pages: int, hybrid: bool, num_pages: int, num_slots: int, flop_aware: bool,
        host_pages: int,
    ) -> None:
        self.cfg = CacheConfig(page_size=page_size, grid=grid_pages * page_size, hybrid=hybrid)
        self.pages = PagePool(num_pages)
        self.slots = SlotPool(num_slots)
        policy = FlopAwarePolicy(flops=lambda a, b: float(b * b - a * a), page_bytes=1.0, state_bytes=2.0, alpha=0.5)
        self.host = HostPool(host_pages + 1) if host_pages else None
        self.cache = RadixCache(
            self.cfg, self.pages, self.slots, policy=policy if flop_aware else None, host_page_pool=self.host
        )
        self.page_data: dict[int, tuple[int, ...] | None] = {}
        self.host_data: dict[int, tuple[int, ...] | None] = {}
        self.slot_data: dict[int, tuple[int, ...] | None] = {}
        self.reqs: dict[int, Request] = {}
        self.next_rid = 0

    # ------------------------------------------------------------ checks on a match

    def check_match(self, tokens: tuple[int, ...], m: Matched) -> None:
        p = self.cfg.page_size
        assert m.hit_len <= max(len(tokens) - 1, 0) and m.kv_hit_len <= max(len(tokens) - 1, 0)
        assert m.hit_len % p == 0 and m.kv_hit_len % p == 0 and m.hit_len <= m.kv_hit_len
        assert m.hit_node.depth == m.hit_len and m.kv_node.depth == m.kv_hit_len
        assert len(m.kv_pages) == m.kv_hit_len // p and m.hit_pages == m.kv_pages[: m.hit_len // p]
        for i, page in enumerate(m.kv_pages):  # the pages hold what a cold run writes
            assert self.page_data.get(page) == tokens[i * p : (i + 1) * p]
        if m.committed_node is not None:
            assert m.committed_slot == m.committed_node.readable_slot
            assert self.slot_data.get(m.committed_slot) == tokens[: m.committed_depth]
        else:
            assert m.committed_slot is None and m.committed_depth == 0
        if self.cfg.hybrid:
            assert m.hit_len == m.committed_depth
        assert m.kv_hit_len <= m.pending_kv_len <= max(len(tokens) - 1, 0)
        if m.is_consumer:
            assert m.consumer_of in self.reqs
            if self.cfg.hybrid:
                assert m.consumer_of == m.producer_id and m.checkpoint_pending
            else:
                assert m.pending_kv_len > m.kv_hit_len
        elif not self.cfg.hybrid:
            assert m.pending_kv_len == m.kv_hit_len
        if m.checkpoint_pending:  # reported, never usable
            assert m.producer_id in self.reqs and m.checkpoint_depth > m.committed_depth
            assert m.checkpoint_node is not None and m.checkpoint_node.readable_slot is None
            try:
                _ = m.checkpoint_node.checkpoint.slot
                raise AssertionError("a pending slot was readable")
            except PendingCheckpointError:
                pass
            if self.cfg.hybrid:
                assert m.hit_len < m.checkpoint_depth

    # ------------------------------------------------------------ request lifecycle

    @rule(tokens=TOKENS)
    def probe(self, tokens: list[int]) -> None:
        self.check_match(tuple(tokens), matched(self.cache, tokens))

    @rule(tokens=TOKENS, evict_first=st.booleans(), data=st.data())
    def admit(self, tokens: list[int], evict_first: bool, data: st.DataObject) -> None:
        self._admit(tuple(tokens), evict_first, data)

    @precondition(lambda self: bool(self.reqs))
    @rule(keep=st.integers(0, 9), suffix=TOKENS, evict_first=st.booleans(), data=st.data())
    def admit_sharing(self, keep: int, suffix: list[int], evict_first: bool, data: st.DataObject) -> None:
        """A request sharing a prefix with a running one (a question on the same article)."""
        other = self._pick(data, lambda r: True)
        self._admit(other.tokens[:keep] + tuple(suffix[:3]), evict_first, data)

    def _admit(self, toks: tuple[int, ...], evict_first: bool, data: st.DataObject) -> None:
        m = matched(self.cache, toks)
        self.check_match(toks, m)
        self.cache.lock(m.hit_node)
        need = self.cfg.pages_for(len(toks)) - len(m.hit_pages)
        own = self.pages.alloc(need)
        if own is None and evict_first:
            self.cache.evict_kv(need - self.pages.num_free)
            self._apply_moves()  # before the freed pages are handed out again
            own = self.pages.alloc(need)
        if own is None:  # all-or-nothing: defer the request, release the tentative lock
            self.cache.unlock(m.hit_node)
            return
        for page in own:
            self.page_data[page] = None  # fresh pages hold garbage until the round writes them
        req = Request(self.next_rid, toks, m.hit_node, list(m.hit_pages) + own, own)
        self.next_rid += 1
        self.reqs[req.rid] = req
        depths = checkpoint_positions(
            m.hit_len, len(toks), grid=self.cfg.grid, page_size=self.cfg.page_size,
            branch_len=m.shared_len, final_len=len(toks),
        )
        for depth in depths:
            if not data.draw(st.integers(0, 3)):  # sometimes a position is not emitted
                continue
            if not self.cfg.hybrid and data.draw(st.booleans()):  # publish pending KV only
                self.cache.plant_pending(toks, depth, None, req.rid, req.table)
                continue
            slot = self.slots.alloc(1)
            if slot is None and self.cache.evict_states(1):
                slot = self.slots.alloc(1)
            if slot is None:
                continue
            self.slot_data[slot[0]] = None
            node = self.cache.plant_pending(toks, depth, slot[0], req.rid, req.table)
            self.slots.decref(slot[0])  # the tree holds its own reference (or the slot is free again)
            if node is not None:
                req.planted.append((depth, slot[0]))

    def _apply_moves(self) -> None:
        """The executor's part: the queued copies, in order (only KV moves: no host slots here)."""
        moves, restores = self.cache.take_moves()
        assert not restores
        for kind, src, dst in moves:
            assert kind in ("kv_spill", "kv_restore"), kind
            if kind == "kv_spill":
                self.host_data[dst] = self.page_data.get(src)
            else:
                self.page_data[dst] = self.host_data.get(src)

    @rule(tokens=TOKENS)
    def promote(self, tokens: list[int]) -> None:
        """A request about to start past host KV brings it back (``Allocator.promote``)."""
        toks = tuple(tokens)
        m = matched(self.cache, toks)
        if not m.host_kv:
            return
        self.cache.lock(m.host_kv[-1])
        need = sum(n.num_pages for n in m.host_kv)
        pages = self.pages.alloc(need)
        if pages is None:
            self.cache.evict_kv(need - self.pages.num_free)
            self._apply_moves()
            pages = self.pages.alloc(need)
        if pages is not None:
            self.cache.promote(m.host_kv, pages)
            self.pages.release(pages)
            self._apply_moves()
        self.cache.unlock(m.host_kv[-1])
        after = matched(self.cache, toks)
        self.check_match(toks, after)
        if pages is not None and not self.cfg.hybrid:
            assert after.kv_hit_len >= m.host_kv[-1].depth

    def _pick(self, data: st.DataObject, pred) -> Request:
        return self.reqs[data.draw(st.sampled_from(sorted(r.rid for r in self.reqs.values() if pred(r))))]

    @precondition(lambda self: any(not r.ran for r in self.reqs.values()))
    @rule(data=st.data(), then_commit=st.booleans())
    def run_round(self, data: st.DataObject, then_commit: bool) -> None:
        req = self._pick(data, lambda r: not r.ran)
        self._run(req)
        if then_commit:
            self._commit(req, data)

    def _run(self, req: Request) -> None:
        p = self.cfg.page_size
        start = len(req.table) - len(req.own)
        for i in range(start, len(req.table)):
            self.page_data[req.table[i]] = req.tokens[i * p : (i + 1) * p]
        for depth, slot in req.planted:
            self.slot_data[slot] = req.tokens[:depth]
        req.ran = True

    @precondition(lambda self: any(r.ran and not r.committed for r in self.reqs.values()))
    @rule(data=st.data())
    def commit_and_insert(self, data: st.DataObject) -> None:
        self._commit(self._pick(data, lambda r: r.ran and not r.committed), data)

    def _commit(self, req: Request, data: st.DataObject) -> None:
        upto = data.draw(st.integers(0, len(req.tokens)))
        partial = self.cache.commit(req.rid, upto)
        # nobody but the producer ever drops its pending checkpoints: all of them commit
        assert partial == sum(1 for d, _ in req.planted if d <= upto)
        assert partial + self.cache.commit(req.rid) == len(req.planted)
        req.committed = True
        res = self.cache.insert(req.tokens, req.table)
        n = len(res.pages)
        assert set(res.rejected) <= set(req.own) and not set(res.rejected) & set(res.adopted)
        req.table[:n] = res.pages  # switch to the tree's pages, then drop the duplicates
        for page in res.rejected:
            req.own.remove(page)
            self.pages.decref(page)
        self.cache.lock(res.node)
        self.cache.unlock(req.lock)
        req.lock = res.node

    @precondition(lambda self: bool(self.reqs))
    @rule(data=st.data())
    def finish_or_abort(self, data: st.DataObject) -> None:
        self._end(self._pick(data, lambda r: True))

    def _end(self, req: Request) -> None:
        self.cache.unpublish(req.rid)  # abort/preemption; a no-op once committed
        self.cache.unlock(req.lock)
        self.pages.release(req.own)
        del self.reqs[req.rid]

    # ------------------------------------------------------------ eviction and flush

    def _protected(self) -> tuple[list[Node], Counter]:
        locked = [r.lock for r in self.reqs.values()]
        pending = Counter(
            (id(n), n.kv_producer, n.checkpoint.producer_id if n.checkpoint and n.checkpoint.pending else None)
            for n in iter_nodes(self.cache.root)
            if n.kv_pending or (n.checkpoint is not None and n.checkpoint.pending)
        )
        return locked, pending

    def _check_protected(self, before: tuple[list[Node], Counter]) -> None:
        locked, pending = before
        assert all(n.attached for n in locked)
        assert self._protected()[1] == pending

    @rule(kind=st.sampled_from(["kv", "state"]), n=st.integers(0, 8))
    def evict(self, kind: str, n: int) -> None:
        before = self._protected()
        locked_slots = {r.lock: r.lock.readable_slot for r in self.reqs.values()}
        if kind == "kv":
            free = self.pages.num_free
            assert self.cache.evict_kv(n) == self.pages.num_free - free
            self._apply_moves()
        else:
            free = self.slots.num_free
            assert self.cache.evict_states(n) == self.slots.num_free - free
        self._check_protected(before)
        assert all(node.readable_slot == slot for node, slot in locked_slots.items())

    @rule(drain=st.integers(0, 3))
    def flush(self, drain: int) -> None:
        """Flush; sometimes first finish every request, after which everything must be free."""
        if drain == 0:
            self.drain()
            return
        before = self._protected()
        self.cache.flush()
        self._check_protected(before)

    def drain(self) -> None:
        for req in list(self.reqs.values()):
            self._end(req)
        self.cache.flush()
        assert self.cache.stats().nodes == 0
        assert self.pages.num_used == 0 and self.slots.num_used == 0
        assert self.host is None or self.host.num_used == 0

    # ------------------------------------------------------------ invariants

    @invariant()
    def consistent(self) -> None:
        self.cache.check_invariants()
        page_refs, slot_refs = tree_references(self.cache.root)
        page_refs.update(p for r in self.reqs.values() for p in r.own)
        assert all(self.pages.refcount(i) == page_refs[i] for i in range(1, self.pages.size))
        assert all(self.slots.refcount(i) == slot_refs[i] for i in range(1, self.slots.size))
        if self.host is not None:
            host_refs = host_page_references(self.cache.root)
            assert all(self.host.refcount(i) == host_refs[i] for i in range(1, self.host.size))
        assert set(self.cache.pending_producers()) <= set(self.reqs)
        stats = self.cache.stats()
        assert stats.pages_held == sum(tree_references(self.cache.root)[0].values())
        assert stats.checkpoints_pending + stats.checkpoints_committed == sum(slot_refs.values())
        assert stats.producers == len(self.cache.pending_producers())
        p = self.cfg.page_size
        for node in iter_nodes(self.cache.root):
            if node.kv_pending:
                continue
            for i, page in enumerate(node.pages):
                assert self.page_data.get(page) == node.key[i * p : (i + 1) * p]
            if node.readable_slot is not None:
                assert self.slot_data.get(node.readable_slot) == node.path_tokens()

    def teardown(self) -> None:
        if hasattr(self, "cache"):
            self.drain()


CacheMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)
TestCacheMachine = CacheMachine.TestCase
