"""The radix tree's state and its structural mutations (the base of ``RadixCache``).

``TreeStore`` owns the root, the producer index (producer id -> nodes holding its pending KV or
pending checkpoint) and the logical clock, and implements every mutation that must keep the tree's
page/slot references in step with the pools: creating nodes (taking a reference on each page),
splitting, upgrading pending KV, dropping checkpoints and removing leaves (releasing references).
The invariants are the ones in ``tree.py`` and ``invariants.py``; the public API is ``radix.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixflow_jax.cache.config import CacheConfig
from radixflow_jax.cache.eviction import EvictionPolicy, LRUPolicy, state_evictable
from radixflow_jax.cache.invariants import check_tree
from radixflow_jax.cache.partners import Partners, discard_member
from radixflow_jax.cache.pools import HostPool, InvariantError, PagePool, SlotPool
from radixflow_jax.cache.results import CacheStats, StateMove
from radixflow_jax.cache.tree import Node, attach, common_prefix_len, detach_leaf, iter_nodes, split

__all__ = ["TreeStore"]


class TreeStore:
    """State and reference-keeping mutations of the prefix cache (see ``RadixCache``)."""

    def __init__(
        self,
        config: CacheConfig,
        page_pool: PagePool,
        slot_pool: SlotPool | None = None,
        *,
        policy: EvictionPolicy | None = None,
    ) -> None:
        self._config = config
        self._pages = page_pool
        self._slots = slot_pool if slot_pool is not None else SlotPool(1)
        self._policy: EvictionPolicy = policy if policy is not None else LRUPolicy()
        self._root = Node((), [], None)
        self._pending: dict[int, set[Node]] = {}  # producer -> nodes with its pending KV/checkpoint
        self._paired = Partners()  # producer -> consumers paired with it in its uncommitted round
        self._clock = 0
        self._evicted_unused = 0
        self._moves: list[StateMove] = []  # state copies the next launched plan makes, in order

    @property
    def config(self) -> CacheConfig:
        return self._config

    @property
    def page_pool(self) -> PagePool:
        return self._pages

    @property
    def slot_pool(self) -> SlotPool:
        return self._slots

    @property
    def root(self) -> Node:
        return self._root

    @property
    def now(self) -> int:
        """The logical clock (last value stamped into ``last_access``)."""
        return self._clock

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _descend(self, toks: tuple[int, ...], limit: int) -> tuple[list[Node], Node | None, int]:
        """Nodes fully matched within ``toks[:limit]``, then the next partly matched node (or None)
        and how many of its pages match."""
        p = self._config.page_size
        node, depth, path = self._root, 0, []
        while depth < limit:
            child = node.children.get(toks[depth : depth + p])
            if child is None:
                break
            k = min(common_prefix_len(child.key, toks, depth) // p, (limit - depth) // p)
            if k < child.num_pages:
                return path, child, k
            path.append(child)
            node, depth = child, child.depth
        return path, None, 0

    def _shared_len(self, toks: tuple[int, ...]) -> int:
        """Token-granular common prefix of ``toks`` with any path in the tree (pending included)."""
        p = self._config.page_size
        node, depth = self._root, 0
        while True:
            child = node.children.get(toks[depth : depth + p]) if len(toks) - depth >= p else None
            if child is None:
                best = (common_prefix_len(c.key[:p], toks, depth) for c in node.children.values())
                return depth + max(best, default=0)
            n = common_prefix_len(child.key, toks, depth)
            if n < len(child.key):
                return depth + n
            node, depth = child, child.depth

    def _can_plant(self, toks: tuple[int, ...], depth: int, producer_id: int, *, with_checkpoint: bool) -> bool:
        """Whether ``plant_pending`` may mark ``depth``: no other producer's pending KV and no host
        KV on the way (pending KV never hangs below host KV; the producer's end inserts its written
        pages there instead, :meth:`_ensure_path`) and, ``with_checkpoint``, no checkpoint there yet
        (read-only)."""
        p = self._config.page_size
        node, d = self._root, 0
        while d < depth:
            child = node.children.get(toks[d : d + p])
            if child is None:
                return True
            if child.kv_producer not in (None, producer_id) or child.kv_on_host:
                return False
            if min(common_prefix_len(child.key, toks, d) // p, (depth - d) // p) < child.num_pages:
                return True  # a split will create a fresh node ending at depth
            node, d = child, child.depth
        return not with_checkpoint or node.checkpoint is None

    # ------------------------------------------------------------------ introspection

    def stats(self) -> CacheStats:
        """Counts over the whole tree (O(nodes))."""
        nodes = cached = pending_tokens = held = ck_pending = ck_committed = ck_host = locked = host_tokens = 0
        for node in iter_nodes(self._root):
            nodes += 1
            held += len(node.pages)
            if node.kv_on_host:
                host_tokens += len(node.key)
            elif node.kv_producer is None:
                cached += len(node.key)
            else:
                pending_tokens += len(node.key)
            if node.checkpoint is not None:
                ck_pending += node.checkpoint.pending
                ck_committed += node.checkpoint.committed
                ck_host += node.checkpoint.on_host
            locked += node.lock_count > 0
        return CacheStats(
            nodes, cached, pending_tokens, held, ck_pending, ck_committed, locked, len(self._pending), ck_host,
            host_tokens,
        )

    def check_invariants(self) -> None:
        """Raise ``InvariantError`` unless the tree, the producer index and the pools are consistent."""
        check_tree(self._root, self._config, self._pages, self._slots, self._pending, self._host_tier(),
                   self._host_page_tier())  # fmt: skip
        for producer, consumers in self._paired.as_dict().items():
            if producer not in self._pending:
                raise InvariantError(f"paired consumers {sorted(consumers)} of producer {producer} with nothing pending")

    # ------------------------------------------------------------------ internals

    def _host_tier(self) -> HostPool | None:
        """The host tier's pool (``cache/tiers.py`` has one)."""
        return None

    def _host_page_tier(self) -> HostPool | None:
        """The host tier's KV pages (``cache/tiers.py`` has them)."""
        return None

    def _promote(self, node: Node, given: Sequence[int], adopted: list[int]) -> None:
        """Host KV is written again on the device with the ``given`` pages (``cache/tiers.py``)."""
        raise InvariantError(f"host KV without a host tier: {node!r}")

    def _release_host_kv(self, node: Node) -> None:
        """Gives back ``node``'s host pages, if any (``cache/tiers.py``)."""

    def _validate_pages(self, pages: Sequence[int], n: int) -> None:
        if len(pages) < n:
            raise ValueError(f"{len(pages)} pages given, {n} needed")
        head = list(pages[:n])
        if len(set(head)) != n:
            raise ValueError("the same page is given twice")
        for page in head:
            if self._pages.refcount(page) == 0:
                raise ValueError(f"page {page} is free; the caller must own the pages it passes")

    def _split(self, node: Node, num_pages: int) -> Node:
        upper = split(node, num_pages, self._config.page_size)
        if upper.kv_producer is not None:
            self._pending.setdefault(upper.kv_producer, set()).add(upper)
        return upper

    def _ensure_path(
        self, toks: tuple[int, ...], depth: int, pages: Sequence[int], producer: int | None
    ) -> tuple[Node, list[int], list[int], list[int]]:
        """Walk or create the path of ``toks[:depth]``; return (end node, tree pages, adopted,
        rejected). ``producer=None``: committed data (pending KV on the path is upgraded to the given
        pages, and host KV comes back onto them: :meth:`_promote`). Otherwise missing spans become
        pending KV of ``producer`` and existing nodes stay (``_can_plant`` keeps host KV off its way)."""
        p = self._config.page_size
        now = self._clock
        node, d = self._root, 0
        tree_pages: list[int] = []
        adopted: list[int] = []
        rejected: list[int] = []
        while d < depth:
            child = node.children.get(toks[d : d + p])
            if child is None:
                new_pages = list(pages[d // p : depth // p])
                for page in new_pages:
                    self._pages.incref(page)
                child = Node(toks[d:depth], new_pages, node, kv_producer=producer, last_access=now)
                attach(node, child, p)
                if producer is not None:
                    self._pending.setdefault(producer, set()).add(child)
                adopted += new_pages
            else:
                k = min(common_prefix_len(child.key, toks, d) // p, (depth - d) // p)
                if k < child.num_pages:
                    child = self._split(child, k)
                given = pages[d // p : child.depth // p]
                if child.kv_on_host:
                    assert producer is None, "pending KV planted through host KV"
                    self._promote(child, given, adopted)
                elif producer is None and child.kv_producer is not None:
                    self._upgrade(child, given, adopted)
                elif producer is None:
                    rejected += [g for g, held in zip(given, child.pages) if g != held]
                child.last_access = now
            tree_pages += child.pages
            node, d = child, child.depth
        return node, tree_pages, adopted, rejected

    def _tail_at(self, toks: tuple[int, ...], depth: int) -> Node | None:
        """The tail ending at ``depth`` (off the page grid) along ``toks``, if the tree holds one (read-only)."""
        p = self._config.page_size
        base = depth - depth % p
        path, partial, _ = self._descend(toks, base)
        parent = path[-1] if path else self._root
        if partial is not None or parent.depth != base:
            return None
        tail = parent.children.get(toks[base:depth])
        return tail if tail is not None and tail.is_tail else None

    def _new_tail(self, parent: Node, key: tuple[int, ...], page: int, producer: int | None) -> Node:
        """A tail of ``key`` under ``parent`` (which ends on a page boundary) sharing ``page``: the
        tree takes a reference on it; a producer's tail is pending KV of it until its commit."""
        tail = Node(key, [page], parent, kv_producer=producer, last_access=self._clock, is_tail=True)
        self._pages.incref(page)
        attach(parent, tail, self._config.page_size)
        if producer is not None:
            self._pending.setdefault(producer, set()).add(tail)
        return tail

    def _upgrade(self, node: Node, given: Sequence[int], adopted: list[int]) -> None:
        """Pending KV becomes committed, holding the given (written) pages instead."""
        pid = node.kv_producer
        assert pid is not None
        for i, (new, old) in enumerate(zip(given, node.pages)):
            if new != old:
                self._pages.incref(new)
                self._pages.decref(old)
                node.pages[i] = new
                adopted.append(new)
        node.kv_producer = None
        ckpt = node.checkpoint
        if ckpt is None or not ckpt.pending:
            self._unindex(pid, node)

    def _unindex(self, producer_id: int, node: Node) -> None:
        discard_member(self._pending, producer_id, node)

    @property
    def has_pending(self) -> bool:
        """Some producer or restore has pending KV or checkpoints (they commit with a round in
        flight or about to be planned, and their checkpoints become evictable)."""
        return bool(self._pending)

    @property
    def queued_moves(self) -> tuple[StateMove, ...]:
        """The state copies queued for the next launched plan (read-only view of ``take_moves``'s)."""
        return tuple(self._moves)

    @property
    def evicted_unused(self) -> int:
        """Committed checkpoints dropped (evicted or flushed) before any request read them."""
        return self._evicted_unused

    def _drop_checkpoint(self, node: Node) -> None:
        ckpt = node.checkpoint
        if ckpt is not None:
            if ckpt.committed and not ckpt.reads:
                self._evicted_unused += 1
            node.checkpoint = None
            self._slots.decref(ckpt.held_slot)

    def move_checkpoint_out(self, below: int, to: int) -> int | None:
        """Moves one committed checkpoint held in a slot ``< below`` (the lowest such) of an unlocked
        node, whose only reference is the tree's, into slot ``to``, which the caller holds: the tree
        takes its own reference on ``to`` and frees the slot it left, which is returned (None: no
        such checkpoint, nothing changes). The copy is queued (``take_moves``) for the next launched
        plan, which makes it before its step (``RoundPlan.state_moves``); an unlocked node has no
        reader in the round being planned. Walks the tree."""
        movable = [
            node for node in iter_nodes(self._root)
            if state_evictable(node) and node.checkpoint.held_slot < below
            and self._slots.refcount(node.checkpoint.held_slot) == 1
        ]  # fmt: skip
        if not movable:
            return None
        node = min(movable, key=lambda n: n.checkpoint.held_slot)
        src = node.checkpoint.held_slot
        self._slots.incref(to)
        node.checkpoint.move(to)
        self._slots.decref(src)
        self._moves.append(StateMove("copy", src, to))
        return src

    def _remove_leaf(self, node: Node) -> None:
        detach_leaf(node, self._config.page_size)
        self._release_host_kv(node)
        self._drop_checkpoint(node)
        self._pages.release(node.pages)
        node.pages = []
