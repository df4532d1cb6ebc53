"""The host tier's KV pages: demoting a node's pages to host memory and bringing them back.

Under page pressure ``TieredStore._demote_kv`` (``cache/tiers.py``, which also moves the node's
checkpoint) moves a node's committed pages to host pages
(``kv_spill`` moves, ``StateMove``) instead of dropping the node: the node stays in the tree as *host
KV* (``Node.kv_on_host``, ``tree.py``), with its checkpoint demoted to a host slot (or dropped when
none can be had). Eviction goes leaf-first over the device part of the tree, so the host part hangs
below it: a node whose children are all host KV is the next candidate (``eviction.kv_evictable``).

Host KV comes back in two ways, both committed at once:

* :meth:`HostKVStore.promote`: a request that will start past it allocates device pages; ``kv_restore``
  moves (host page -> device page) are queued for the plan being built and the nodes hold the
  device pages from then on. No pending phase is needed: every reader of those pages is a step
  launched after that plan's moves, which the executor makes before its step in booking order;
* the insert of a request that recomputed the span (:meth:`_promote` from ``_ensure_path``): its
  written pages replace the host copy.

Either way the host pages go back to their pool at once: a later ``kv_spill`` that reuses one is
booked after the ``kv_restore`` that reads it, and the executor keeps that order.

Invariants (``invariants.check_tree``): a host-KV node holds no device page and one host page per
page of its span, each referenced by the tree once; its children are host KV and its checkpoint is
a host one or none; nothing pending hangs below it (``TreeStore._can_plant``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence

from radixflow_jax.cache.eviction import EvictionPolicy, EvictTarget
from radixflow_jax.cache.pools import HostPool
from radixflow_jax.cache.results import StateMove
from radixflow_jax.cache.store import TreeStore
from radixflow_jax.cache.tree import Node, iter_nodes, iter_postorder

__all__ = ["HostKVStore"]


class HostKVStore(TreeStore):
    """The KV half of the host tier (see the module docstring); ``host_page_pool=None`` or empty:
    evicted pages are dropped with their node, as without a host tier."""

    def __init__(self, *args, host_page_pool: HostPool | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        pool = host_page_pool
        self._host_pages = pool if pool is not None and pool.capacity > 0 else None
        self.kv_demoted = 0  # pages spilled to the host tier
        self.kv_restored = 0  # host pages brought back (promote) or replaced by a recompute (insert)
        self.kv_host_dropped = 0  # host pages dropped for room (or with their node)

    @property
    def host_page_pool(self) -> HostPool | None:
        return self._host_pages

    def _host_page_tier(self) -> HostPool | None:
        return self._host_pages

    # ------------------------------------------------------------------ coming back

    def promote(self, nodes: Sequence[Node], pages: Sequence[int]) -> None:
        """Brings the host KV of ``nodes`` (a match's ``host_kv``: host-KV nodes of one path, in
        path order) back onto device ``pages``, which the caller allocated (``num_pages`` of each
        node, in order; the tree takes its own reference on each and the caller drops its own):
        ``kv_restore`` moves are queued for the plan being built and the nodes are committed device
        KV from now on. ``ValueError`` (changing nothing) when a node is not attached host KV below
        device KV, or when the page count is not theirs."""
        need = sum(n.num_pages for n in nodes)
        if len(pages) != need or len(set(pages)) != need:
            raise ValueError(f"promote needs {need} distinct pages, got {len(pages)}")
        above = None
        for node in nodes:
            parent_on_device = node.parent is above or (node.parent is not None and not node.parent.kv_on_host)
            if not node.attached or not node.kv_on_host or not parent_on_device:
                raise ValueError(f"promote needs attached host KV below device KV, in path order: {node!r}")
            above = node
        for page in pages:
            if self._pages.refcount(page) == 0:
                raise ValueError(f"page {page} is free; allocate it before promoting onto it")
        at = 0
        for node in nodes:
            given = list(pages[at : at + node.num_pages])
            at += node.num_pages
            assert node.host_pages is not None
            self._moves.extend(StateMove("kv_restore", h, d) for h, d in zip(node.host_pages, given))
            self._promote(node, given, [])

    def _promote(self, node: Node, given: Sequence[int], adopted: list[int]) -> None:
        """``node``'s host KV now lives in the device pages ``given`` (written, or being restored by
        moves queued before any reader): the tree takes a reference on each, its host pages go back."""
        assert node.host_pages is not None and len(given) == len(node.host_pages)
        for page in given:
            self._pages.incref(page)
        adopted.extend(given)
        node.pages = list(given)
        self._release_host_kv(node)
        self.kv_restored += len(given)

    def _release_host_kv(self, node: Node) -> None:
        if node.host_pages is not None:
            if self._host_pages is not None:
                self._host_pages.release(node.host_pages)
            node.host_pages = None

    # ------------------------------------------------------------------ going down

    def _drop_host_kv(self, num: int, policy: EvictionPolicy | None, *, keep: Node | None = None) -> int:
        """Drops host-KV leaves of no lock (with their host checkpoints), lowest policy score first,
        until ``num`` host pages went back or none is left; never ``keep``. Returns the pages freed."""
        pool = self._host_pages
        assert pool is not None
        start = pool.num_free
        done = lambda: pool.num_free - start >= num  # noqa: E731
        self._sweep(lambda n: self._host_leaf(n, keep), self._drop_host_node, done, policy)
        return pool.num_free - start

    def _sweep(
        self, evictable: Callable[[Node], bool], act: Callable[[Node], None], done: Callable[[], bool],
        policy: EvictionPolicy | None,
    ) -> None:
        """Leaf-first eviction in policy order: ``act`` on each ``evictable`` node, lowest score
        first, until ``done()``; a parent that ``act`` left evictable joins the heap (one tree walk
        plus a heap, O(nodes log nodes))."""
        heap = self._heap((n for n in iter_nodes(self._root) if evictable(n)), "kv", policy)
        tie = itertools.count(len(heap))
        while heap and not done():
            node = heapq.heappop(heap)[-1]
            if not evictable(node):
                continue  # an earlier act took it
            parent = node.parent
            act(node)
            if parent is not None and evictable(parent):
                heapq.heappush(heap, self._entry(parent, "kv", policy, next(tie)))

    def _entry(
        self, node: Node, target: EvictTarget, policy: EvictionPolicy | None, seq: int
    ) -> tuple[float, int, int, Node]:
        """Heap key: the policy's score, then (ties, e.g. a path matched at once) KV leaves deepest
        first but checkpoints *shallowest* first: under slot pressure the deep, most reusable
        checkpoint of a path is the one kept."""
        pol = policy if policy is not None else self._policy
        tie = -node.depth if target == "kv" else node.depth
        return (pol.score(node, self._clock, target), tie, seq, node)

    def _heap(
        self, nodes: Iterable[Node], target: EvictTarget, policy: EvictionPolicy | None
    ) -> list[tuple[float, int, int, Node]]:
        heap = [self._entry(n, target, policy, i) for i, n in enumerate(nodes)]
        heapq.heapify(heap)
        return heap

    @staticmethod
    def _host_checkpoint_below(node: Node) -> bool:
        """Some node below ``node`` holds a host checkpoint (its subtree, which is host KV)."""
        return any(n.checkpoint is not None and n.checkpoint.on_host for n in iter_nodes(node))

    @staticmethod
    def _host_leaf(node: Node, keep: Node | None) -> bool:
        return node.attached and node.kv_on_host and not node.children and node.lock_count == 0 and node is not keep

    def _drop_host_node(self, node: Node) -> None:
        """Removes a host-KV leaf (its host pages and host checkpoint go back)."""
        assert node.host_pages is not None
        self.kv_host_dropped += len(node.host_pages)
        self._remove_leaf(node)

    def _remove_subtree(self, node: Node) -> None:
        """Removes ``node`` (an evictable node, unlocked) with the host KV below it, leaves first."""
        for below in iter_postorder(node):
            self._drop_host_node(below)
        self._remove_leaf(node)
