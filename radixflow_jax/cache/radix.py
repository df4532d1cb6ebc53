"""The prefix cache: a radix tree over token ids holding KV pages and recurrent-state checkpoints.

Ownership: the tree holds exactly one reference (``incref``) on every page and checkpoint slot it
stores and drops it (``decref``) when it stops storing it. Callers keep and release their own
references independently, so a page shared by the tree and a running request stays allocated until
both let go. The usual protocols:

  * insert: a request passes its page table; pages of spans new to the tree are ``adopted`` (the
    tree takes its own reference); pages duplicating a cached span are ``rejected``: the caller
    switches to the tree's pages and ``decref``s its duplicates. Finished requests ``decref`` the
    pages they allocated; what the tree adopted survives.
  * checkpoint lifecycle: ``alloc`` a slot, ``plant_pending`` (the tree takes its reference), then
    ``decref`` the caller's reference. When the producer's round has finished and its result has been
    processed, ``commit`` (the commit fence); on abort or preemption ``unpublish``, which drops the
    pending checkpoints (freeing their slots) and the pending KV nodes planting created.

Readability: a pending checkpoint is reported only as pending (the request is a *consumer*); its
slot is never returned (``Checkpoint.slot`` raises while pending). Pending KV (nodes created by
``plant_pending`` whose pages the producer's round is writing) is never part of a KV hit.

All depths are page-aligned (see ``config.py``); ``last_access`` uses a logical clock that advances
once per ``match``/``insert``/``lock``/``plant_pending``/``commit`` call, never wall time.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixflow_jax.cache.pools import InvariantError
from radixflow_jax.cache.results import InsertResult, MatchResult
from radixflow_jax.cache.tiers import TieredStore
from radixflow_jax.cache.tree import Checkpoint, CheckpointStatus, Node, tails_along

__all__ = ["RadixCache"]


class RadixCache(TieredStore):
    """See the module docstring. Construct with ``RadixCache(config, page_pool, slot_pool, policy=...,
    host_pool=...)`` (``slot_pool`` may be omitted for attention-only models; ``host_pool``: the host
    tier, ``cache/tiers.py``). Not thread-safe: one scheduler thread owns it."""

    # ------------------------------------------------------------------ lookup

    def shared_len(self, tokens: Sequence[int]) -> int:
        """Token-granular common prefix of ``tokens`` with any path in the tree (pending included):
        ``match(tokens, shared=True).shared_len`` without walking, splitting or stamping the path."""
        return self._shared_len(tuple(tokens))

    def match(self, tokens: Sequence[int], *, touch: bool = True, shared: bool = True) -> MatchResult:
        """Walk the tree along ``tokens``; see ``MatchResult`` for what comes back.

        Never covers more than ``len(tokens) - 1`` tokens: full pages up to ``align_down(len(tokens)
        - 1)``, and a tail (an exact-depth checkpoint off the page grid, ``tree.py``) up to
        ``len(tokens) - 1``. May split the last matched node so that the path ends exactly at the
        matched depth (the committed KV prefix then ends at a node). ``touch`` stamps the matched
        nodes' access time. ``shared=False`` skips the token-granular divergence search (it scans
        every child at the divergence node) and reports as ``shared_len`` the matched path's depth
        (pending KV included), a page-granular lower bound.
        """
        p = self._config.page_size
        toks = tuple(tokens)
        cap = self._config.align_down(len(toks) - 1) if toks else 0
        now = self._tick() if touch else self._clock
        path, partial, k = self._descend(toks, cap)
        if partial is not None and k > 0:
            path.append(self._split(partial, k))  # the path now ends exactly at the matched depth
        kv_node = self._root
        kv_pages: list[int] = []
        ckpt_node: Node | None = None
        committed: Node | None = None
        host: Node | None = None
        reach = 0  # depth of the committed KV (device or host) from the root
        for node in path:
            if node.kv_producer is None and reach == node.start_depth:
                reach = node.depth
            if node.kv_producer is None and not node.kv_on_host:  # a prefix of the path (tree.py)
                kv_node = node
                kv_pages.extend(node.pages)
            if node.checkpoint is not None and node.checkpoint.on_host:
                host = node
            elif node.checkpoint is not None:
                ckpt_node = node
                if node.checkpoint.committed:
                    committed = node
            if touch:
                node.last_access = now
        if self._config.hybrid:
            ckpt_node, committed, host = self._deepest_tails(path, toks, ckpt_node, committed, host)
            hit_node = committed if committed is not None else self._root
        else:
            tails = tails_along(kv_node, toks, len(toks) - 1, p)
            hit_node = next((t for t in tails if not t.kv_pending and not t.kv_on_host), kv_node)
        if touch and hit_node.is_tail:
            hit_node.last_access = now
        ckpt = ckpt_node.checkpoint if ckpt_node is not None else None
        pending = ckpt is not None and ckpt.pending
        producer_id = ckpt.producer_id if ckpt is not None and pending else None
        deepest = path[-1] if path else self._root
        full = hit_node.parent.depth if hit_node.is_tail else hit_node.depth  # type: ignore[union-attr]
        beaten = max(hit_node.depth, ckpt_node.depth if pending and ckpt_node is not None else 0)
        if not self._config.hybrid:  # the deepest host KV, when restoring it would give a deeper hit
            host = next((n for n in reversed(path) if n.kv_on_host and n.depth > hit_node.depth), None)
        host = host if host is not None and host.depth > beaten else None
        host_full = 0 if host is None else host.parent.depth if host.is_tail else host.depth  # type: ignore[union-attr]
        if host_full > reach:  # its KV is not all committed: nothing to restore onto
            host, host_full = None, 0
        host_kv: tuple[Node, ...] = ()
        if host is not None:  # the host KV on the way to it (none in the common case: no walk)
            host_kv = tuple(n for n in path if n.kv_on_host and n.depth <= host_full)
            host_kv += (host,) if host.is_tail and host.kv_on_host else ()
        return MatchResult(
            checkpoint_node=ckpt_node,
            checkpoint_depth=ckpt_node.depth if ckpt_node is not None else 0,
            checkpoint_pending=pending,
            producer_id=producer_id,
            hit_len=hit_node.depth,
            hit_pages=tuple(kv_pages[: full // p]),
            hit_node=hit_node,
            consumer_of=producer_id if self._config.hybrid else deepest.kv_producer,
            shared_len=self._shared_len(toks) if shared else deepest.depth,
            hit_tail_page=hit_node.pages[0] if hit_node.is_tail else None,
            host_node=host if self._config.hybrid else None,
            host_pages=tuple(kv_pages[: host_full // p]),
            host_tail_page=host.pages[0] if host is not None and host.is_tail and not host.kv_on_host else None,
            host_kv=host_kv,
        )

    def _deepest_tails(
        self, path: list[Node], toks: tuple[int, ...], ckpt_node: Node | None, committed: Node | None,
        host: Node | None,
    ) -> tuple[Node | None, Node | None, Node | None]:
        """Hybrid models: the deepest checkpoint, the deepest committed checkpoint and the deepest
        host checkpoint along ``toks`` once tails count too. Only tails of path nodes at or below
        the shallower of the deepest committed and host checkpoints can be deeper than those (a
        tail lies less than a page below its parent)."""
        floor = min(committed.depth if committed is not None else 0, host.depth if host is not None else 0)
        limit, p = len(toks) - 1, self._config.page_size
        for node in reversed([self._root, *path]):
            if node.depth < floor:
                break
            for tail in tails_along(node, toks, limit, p):
                ckpt = tail.checkpoint
                if ckpt is None:
                    continue
                if ckpt.on_host:
                    host = tail if host is None or tail.depth > host.depth else host
                    continue
                if ckpt_node is None or tail.depth > ckpt_node.depth:
                    ckpt_node = tail
                if ckpt.committed and (committed is None or tail.depth > committed.depth):
                    committed = tail
        return ckpt_node, committed, host

    # ------------------------------------------------------------------ insert / lock

    def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> InsertResult:
        """Insert the computed, committed prefix ``tokens[:align_down(len)]`` with its KV ``pages``.

        ``pages[i]`` holds tokens ``[i * page_size, (i + 1) * page_size)``; pages beyond the last
        full page are ignored. Pending KV on the path is replaced by the given (written) pages and
        becomes committed. Raises ``ValueError`` (changing nothing) on short, duplicate or free pages.
        """
        toks = tuple(tokens)
        n = len(toks) // self._config.page_size
        self._validate_pages(pages, n)
        self._tick()
        node, tree_pages, adopted, rejected = self._ensure_path(toks, n * self._config.page_size, pages, None)
        return InsertResult(node, tuple(tree_pages), tuple(adopted), tuple(rejected))

    def lock(self, node: Node) -> None:
        """Protect ``node`` and its path to the root from eviction and flush (counted)."""
        if not node.attached:
            raise ValueError(f"cannot lock a node that left the tree: {node!r}")
        if node.kv_producer is not None:
            raise ValueError(f"cannot lock pending KV: {node!r}")
        now = self._tick()
        node.own_locks += 1
        up: Node | None = node
        while up is not None:
            up.lock_count += 1
            up.last_access = now
            up = up.parent

    def unlock(self, node: Node) -> None:
        """Undo one ``lock(node)``. Raises ``ValueError`` without a matching lock."""
        if node.own_locks <= 0:
            raise ValueError(f"unlock without a matching lock: {node!r}")
        node.own_locks -= 1
        up: Node | None = node
        while up is not None:
            up.lock_count -= 1
            up = up.parent

    # ------------------------------------------------------------------ checkpoint lifecycle

    def plant_pending(
        self, tokens: Sequence[int], depth: int, slot: int | None, producer_id: int, pages: Sequence[int],
        *, wanted: bool = False,
    ) -> Node | None:
        """Mark a PENDING checkpoint of ``producer_id`` in ``slot`` at exactly ``depth`` tokens.

        Locates or creates the node ending at ``depth`` (splitting as needed); spans missing from
        the tree are created as pending KV holding the producer's ``pages`` (its page table, covering
        ``depth``). A ``depth`` off the page grid makes a pending *tail* (``tree.py``) sharing the
        producer's partial page ``pages[depth // page_size]``. With ``slot=None`` only that pending
        KV is published (attention-only models, or a producer whose state is not checkpointed
        there). Returns the node, or ``None`` (changing nothing) when that depth already holds a
        checkpoint or the path runs through another producer's pending KV; the caller then neither
        emits this checkpoint nor keeps the slot. ``ValueError`` on a depth that is not in ``[1,
        len(tokens)]``, on short pages, or on a slot the caller does not own. ``wanted``: waiting
        requests will read this checkpoint (a look-ahead branch point); eviction keeps it longer
        (``LRUPolicy``).
        """
        p = self._config.page_size
        toks = tuple(tokens)
        if depth <= 0 or depth > len(toks) or (depth % p and slot is None):
            raise ValueError(f"checkpoint depth {depth} must be in [1, {len(toks)}] (a page multiple without a slot)")
        if slot is not None and self._slots.refcount(slot) == 0:
            raise ValueError(f"slot {slot} is free; allocate it before planting")
        self._validate_pages(pages, self._config.pages_for(depth))
        base = depth - depth % p
        if not self._can_plant(toks, base, producer_id, with_checkpoint=slot is not None and not depth % p):
            return None
        if depth % p and self._tail_at(toks, depth) is not None:
            return None
        self._tick()
        node = self._ensure_path(toks, base, pages, producer_id)[0]
        if depth % p:
            node = self._new_tail(node, toks[base:depth], pages[base // p], producer_id)
        if slot is not None:
            self._slots.incref(slot)
            node.checkpoint = Checkpoint(slot, producer_id)
            node.checkpoint.wanted = wanted
            self._pending.setdefault(producer_id, set()).add(node)
        return node

    def keep_end(self, tokens: Sequence[int], depth: int, slot: int | None, pages: Sequence[int], owner: int,
                 *, generated: bool = False) -> bool:  # fmt: skip
        """A finished request's exact end (docs/design.md, "Exact depth"): inserts ``tokens[:depth]``
        (its full pages, as :meth:`insert`) and keeps the state its own ``slot`` holds, written and
        committed, as a committed checkpoint at exactly ``depth``: on the node ending there, or in a
        tail sharing its partial page ``pages[depth // page_size]`` when ``depth`` is off the page
        grid. Attention-only models (``slot=None``) keep such a tail for its KV. Whether the tree
        took a reference on ``slot`` (not when a checkpoint or tail is already there); the caller
        drops its own references as usual. ``owner``: the request; ``generated``: past its prompt."""
        p = self._config.page_size
        toks = tuple(tokens[:depth])
        if depth <= 0 or len(toks) < depth:
            return False
        node = self.insert(toks, pages).node  # ends at the last full page
        base = depth - depth % p
        if depth % p:  # a tail under the node insert ended at (a tail's key is shorter than any page's)
            if node.children.get(toks[base:depth]) is not None or (self._config.hybrid and slot is None):
                return False
            node = self._new_tail(node, toks[base:depth], pages[base // p], None)
        elif node.checkpoint is not None and not (node.checkpoint.on_host and slot is not None):
            return False
        if slot is None:
            return False
        self._drop_checkpoint(node)  # a host copy of the same state: the device one replaces it
        self._slots.incref(slot)
        node.checkpoint = Checkpoint(slot, owner, generated=generated)
        node.checkpoint.status = CheckpointStatus.COMMITTED
        return True

    def commit(self, producer_id: int, depth: int | None = None) -> int:
        """The commit fence: the producer's round has finished and its result has been processed.

        Commits the producer's pending checkpoints and pending KV ending at or before ``depth`` (all
        of them when ``None``); returns how many checkpoints became committed (readable). A producer
        id names one request (one token path); its planted depths are committed in depth order.
        """
        nodes = self._pending.get(producer_id)
        if not nodes:
            return 0
        now = self._tick()
        done = 0
        for node in sorted(nodes, key=lambda n: n.depth):
            if depth is not None and node.depth > depth:
                break
            if node.kv_producer == producer_id:
                node.kv_producer = None
            ckpt = node.checkpoint
            if ckpt is not None and ckpt.pending and ckpt.producer_id == producer_id:
                ckpt.status = CheckpointStatus.COMMITTED
                self._landed(node)  # a restore: its host slot goes back
                done += 1
            node.last_access = now
            nodes.discard(node)
        if not nodes:
            del self._pending[producer_id]
            self._paired.drop_producer(producer_id)  # its round is committed: partners now read written state
        return done

    def unpublish(self, producer_id: int) -> int:
        """Abort/preemption: drop the producer's pending checkpoints (freeing their slots) and the
        pending KV nodes it planted. Its consumers fall back to their committed checkpoints. Also
        the rollback of a tentative plan that was not admitted. Returns how many checkpoints were
        dropped. Committed data of the producer stays."""
        if self._paired.has(producer_id):
            raise InvariantError(
                f"unpublish of producer {producer_id} with paired consumers {self._paired.as_dict()[producer_id]}: "
                "take_paired (and roll them back) first"
            )
        nodes = self._pending.pop(producer_id, set())
        dropped = 0
        for node in sorted(nodes, key=lambda n: n.depth, reverse=True):  # children first
            ckpt = node.checkpoint
            if ckpt is not None and ckpt.restoring and ckpt.producer_id == producer_id:
                self._revert(node)  # a void restore: back to the host tier, nothing else planted
                continue
            if ckpt is not None and ckpt.pending and ckpt.producer_id == producer_id:
                node.checkpoint = None
                self._slots.decref(ckpt.held_slot)
                dropped += 1
            if node.kv_producer == producer_id:
                if node.children or node.lock_count:
                    raise InvariantError(f"pending KV node with children or locks: {node!r}")
                self._remove_leaf(node)
        return dropped

    def read_checkpoint(self, node: Node) -> int:
        """The slot of ``node``'s committed checkpoint, counted as a read (a request copies it now);
        ``PendingCheckpointError`` while pending, ``ValueError`` without a checkpoint."""
        if node.checkpoint is None:
            raise ValueError(f"no checkpoint at {node!r}")
        slot = node.checkpoint.slot
        node.checkpoint.reads += 1
        return slot

    # ------------------------------------------------------------------ paired references (policy pair)

    def pair(self, node: Node, consumer_id: int) -> int:
        """A *paired* reference: ``consumer_id`` runs in the round that writes ``node``'s pending
        checkpoint and starts from the producer's in-round state at ``node.depth`` (taken inside the
        same step, never read from the pool). Returns the pending checkpoint's slot (the runner uses
        it to find the producer's emit). The pairing lasts until the producer's :meth:`commit`; a
        producer that is aborted or preempted first must have its partners rolled back
        (:meth:`take_paired` before :meth:`unpublish`). ``ValueError`` unless the checkpoint is pending."""
        ckpt = node.checkpoint
        if ckpt is None or not ckpt.pending or not node.attached:
            raise ValueError(f"pair needs a pending checkpoint: {node!r}")
        self._paired.add(ckpt.producer_id, consumer_id)
        ckpt.reads += 1  # a sibling used it (in-round): eviction and evicted-before-use count it as read
        return ckpt.held_slot

    def take_paired(self, producer_id: int) -> tuple[int, ...]:
        """Removes and returns (ascending) the consumers paired with ``producer_id``'s uncommitted round."""
        return self._paired.take(producer_id)

    def unpair(self, consumer_id: int) -> None:
        """The consumer is gone (finished, aborted, rolled back): drop its paired reference."""
        self._paired.drop_partner(consumer_id)

    def paired(self) -> dict[int, tuple[int, ...]]:
        """Producer -> its paired consumers (ascending), for invariants and tests."""
        return self._paired.as_dict()

    def pending_producers(self) -> tuple[int, ...]:
        """Producers with pending KV or checkpoints, ascending."""
        return tuple(sorted(self._pending))
