"""Immutable results returned by ``RadixCache``: a match, an insert, and the cache statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from radixflow_jax.cache.tree import Node

__all__ = ["CacheStats", "InsertResult", "MatchResult", "StateMove"]


class StateMove(NamedTuple):
    """One copy of a recurrent state that a round makes before its step, in the order the cache
    recorded them (each is right only after the ones before it): ``copy`` device slot ``src`` ->
    device slot ``dst`` (a kept end leaving the request band, ``TreeStore.move_checkpoint_out``);
    ``spill`` device slot -> host slot ``dst`` (a demotion, ``cache/tiers.py``); ``restore`` host
    slot ``src`` -> device slot ``dst``. KV pages have the same two moves between the device page
    pool and the host tier's pages: ``kv_spill`` device page ``src`` -> host page ``dst``,
    ``kv_restore`` host page ``src`` -> device page ``dst`` (every attention layer's K and V, the
    MTP layers' too)."""

    kind: Literal["copy", "spill", "restore", "kv_spill", "kv_restore"]
    src: int
    dst: int

    @property
    def of_pages(self) -> bool:
        """A KV page move (``kv_spill``, ``kv_restore``); else a recurrent state's."""
        return self.kind.startswith("kv_")

    @property
    def to_host(self) -> bool:
        """A spill (device -> host) of either kind."""
        return self.kind in ("spill", "kv_spill")


@dataclass(frozen=True)
class MatchResult:
    """What the cache holds for a token sequence, as the scheduler uses it (tests read the rest of
    the path from the tree: ``tests/cache/helpers.matched``).

    Invariants:
      * every depth here is ``<= len(tokens) - 1`` (at least one token is always left to compute,
        to get logits) and a multiple of ``page_size`` unless it is a tail's (an exact-depth
        checkpoint off the page grid, ``tree.py``); ``shared_len`` is token-granular and uncapped
        (it only feeds ``branch_point``);
      * ``checkpoint_*``: the deepest checkpoint on the path, pending or committed, and the producer
        of a pending one. Nothing here exposes a pending checkpoint's slot;
      * ``hit_len``/``hit_pages``/``hit_node``: the usable hit. Hybrid models: the deepest committed
        checkpoint's depth (never deeper than the committed KV); attention-only: the committed KV
        prefix. Pending KV (a producer's uncommitted round is writing it) is never part of it. Lock
        ``hit_node`` before using it. A tail hit: ``hit_pages`` are the full pages above it and
        ``hit_tail_page`` its partial page, which the request copies into a page of its own before
        its first row (``RowPlan.copy_page_from``) and never writes; ``None`` for any other hit;
      * ``consumer_of``: the producer whose commit would extend the usable hit, i.e. the request is a
        *consumer*. Hybrid: the deepest checkpoint is pending (``producer_id``); attention-only: the
        path continues into pending KV. ``None`` otherwise. A restore from the host tier is a
        producer too (its id is negative, ``cache/tiers.py``);
      * ``host_node``: the deepest host checkpoint on the path (``cache/tiers.py``) when it is deeper
        than the usable hit and than a pending checkpoint: restoring it would give a deeper hit.
        Host checkpoints are never ``checkpoint_node``. ``host_pages`` / ``host_tail_page``: the
        committed KV above it, as ``hit_pages`` / ``hit_tail_page`` are for the hit (empty / None
        without a host node). ``host_kv``: the host-KV nodes (``tree.py``) on the path down to
        the host node, or (attention-only models) down to the deepest host-KV node deeper than the
        committed KV, in path order: they come back first (``RadixCache.promote``), then the host
        node's checkpoint. Empty when nothing host-resident would give a deeper hit.
    """

    checkpoint_node: Node | None
    checkpoint_depth: int
    checkpoint_pending: bool
    producer_id: int | None
    hit_len: int
    hit_pages: tuple[int, ...]
    hit_node: Node
    consumer_of: int | None
    shared_len: int
    hit_tail_page: int | None
    host_node: Node | None
    host_pages: tuple[int, ...]
    host_tail_page: int | None
    host_kv: tuple[Node, ...]

    @property
    def is_consumer(self) -> bool:
        """A pending producer's commit would give this request a deeper usable hit."""
        return self.consumer_of is not None


@dataclass(frozen=True)
class InsertResult:
    """Outcome of ``RadixCache.insert``.

    ``node`` ends at the inserted (page-aligned) depth; ``pages`` are the tree's pages for that whole
    prefix (the caller should use these in its page table). ``adopted`` pages got one reference held
    by the tree. ``rejected`` are given pages that duplicate a span the tree already held with other
    pages: the tree took no reference on them, so the caller should switch to ``pages`` and ``decref``
    them. Given pages equal to the tree's own are neither adopted nor rejected.
    """

    node: Node
    pages: tuple[int, ...]
    adopted: tuple[int, ...]
    rejected: tuple[int, ...]


@dataclass(frozen=True)
class CacheStats:
    """A snapshot: ``cached_tokens``/``pages_held`` count committed KV; ``pending_tokens`` counts KV
    of pending nodes (pages the tree references but nobody may read yet)."""

    nodes: int
    cached_tokens: int
    pending_tokens: int
    pages_held: int
    checkpoints_pending: int
    checkpoints_committed: int
    locked_nodes: int
    producers: int
    checkpoints_host: int = 0
    host_tokens: int = 0  # tokens whose KV is in the host tier
