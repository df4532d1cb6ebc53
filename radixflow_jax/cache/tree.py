"""Radix-tree nodes, checkpoints, and the structural primitives (split, attach, detach, walks).

Node invariants (``invariants.check_tree`` verifies them):
  * a non-root node's ``key`` is a non-empty multiple of ``page_size`` tokens and it holds exactly
    ``len(key) // page_size`` page ids; ``depth == parent.depth + len(key)`` (its *end* depth);
    except a *tail* (``is_tail``): a leaf whose parent ends on a page boundary, with ``1 ..
    page_size - 1`` tokens and exactly one page, the partial page that holds their KV at its first
    ``len(key)`` positions. A tail is an exact-depth checkpoint off the page grid (docs/design.md,
    "Exact depth"): hybrid models keep one only with its checkpoint. Its page may be shared (with the
    request that wrote it, with other tails, with the full-page node of the same tokens); nobody
    writes the positions a tail covers, and whoever extends a tail copies its page first
    (``RowPlan.copy_page_from``);
  * a parent indexes each child under the child's first page of tokens (siblings differ there), a
    tail under its whole key (shorter than a page, so it never meets a full-page child);
  * a node object's end depth never changes: a split inserts a *new* upper node above it, so a
    handle a caller holds (a lock, a checkpoint) keeps meaning the same prefix;
  * ``lock_count == own_locks + sum(child.lock_count)``: locking a node locks its path to the root;
  * KV is *pending* (``kv_producer`` set) while the producer's round that writes it has not been
    committed. A pending-KV node's parent is the root, a committed node, or a pending-KV node of the
    same producer; it is never locked and its checkpoint, if any, is pending by the same producer.
    Hence a committed-KV node has only committed-KV ancestors and every committed checkpoint sits on
    committed KV;
  * *host KV* (``kv_on_host``, the host tier, ``cache/tiers.py``): a node whose pages were demoted
    holds no device pages (``pages == []``) and one host page per page of its span in
    ``host_pages``. Its KV is committed (``kv_producer`` is None) but not readable until it comes
    back to the device; its children are host KV too (the host part of the tree hangs below the
    device part), and its checkpoint, if any, is a host checkpoint.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence

__all__ = ["Checkpoint", "CheckpointStatus", "Node", "PendingCheckpointError", "common_prefix_len", "tails_along"]


class CheckpointStatus(enum.Enum):
    PENDING = "pending"
    COMMITTED = "committed"
    HOST = "host"  # demoted to the host tier: written, not on the device, restored before a read


class PendingCheckpointError(RuntimeError):
    """Someone asked for the slot of a checkpoint that is not committed (it may not be written)."""


class Checkpoint:
    """A recurrent-state snapshot held in a state slot, valid exactly at its node's end depth.

    ``slot`` is readable only once committed (the commit fence); reading a pending checkpoint's slot
    raises ``PendingCheckpointError``. ``held_slot`` is the slot it occupies, pending or not: for
    bookkeeping (ownership checks, freeing it) and for matching a paired consumer to its producer's
    in-round emit, never to read a state. ``producer_id`` names the request whose round writes it.
    ``generated``: its state has consumed tokens the model generated (a request's exact end past its
    prompt, ``RadixCache.keep_end``); clients often resend such tokens altered, so it never counts as
    superseding a checkpoint above it (``cache/eviction.is_shadowed``).

    The host tier (``cache/tiers.py``): a *host* checkpoint (``on_host``) holds no device slot
    (``held_slot`` is 0) and one host slot, ``host_slot``; it is neither pending nor committed, so
    nothing reads it until a restore makes it pending again (by a restore id, a negative producer
    id) in a device slot, still holding its host slot until the restore commits.
    """

    __slots__ = ("_slot", "status", "producer_id", "reads", "wanted", "generated", "host_slot")

    def __init__(self, slot: int, producer_id: int, *, generated: bool = False) -> None:
        self._slot = slot
        self.status = CheckpointStatus.PENDING
        self.producer_id = producer_id
        self.reads = 0  # requests that copied this state (RadixCache.read_checkpoint)
        self.wanted = False  # planted because waiting requests will need it (look-ahead)
        self.generated = generated  # the state has consumed model-generated tokens (keep_end past a prompt)
        self.host_slot: int | None = None  # the host tier's copy (on_host, or a restore in flight)

    @property
    def pending(self) -> bool:
        return self.status is CheckpointStatus.PENDING

    @property
    def committed(self) -> bool:
        return self.status is CheckpointStatus.COMMITTED

    @property
    def on_host(self) -> bool:
        """Demoted to the host tier: not readable until restored (``cache/tiers.py``)."""
        return self.status is CheckpointStatus.HOST

    @property
    def restoring(self) -> bool:
        """Pending by a restore from the host tier (its producer id is a restore id, negative)."""
        return self.status is CheckpointStatus.PENDING and self.host_slot is not None

    @property
    def slot(self) -> int:
        if self.status is not CheckpointStatus.COMMITTED:
            raise PendingCheckpointError(f"checkpoint of producer {self.producer_id} is pending, not readable")
        return self._slot

    @property
    def held_slot(self) -> int:
        """The slot this checkpoint occupies, pending or committed (see the class docstring)."""
        return self._slot

    def move(self, slot: int) -> None:
        """Now held in ``slot`` (``TreeStore.move_checkpoint``, which keeps the references right)."""
        self._slot = slot

    def __repr__(self) -> str:
        slot = self._slot if self.committed else "?"
        host = f", host={self.host_slot}" if self.host_slot is not None else ""
        return f"Checkpoint({self.status.value}, slot={slot}{host}, producer={self.producer_id})"


class Node:
    """One radix node; fields are managed by ``RadixCache`` (callers only read them and lock them)."""

    __slots__ = (
        "parent",
        "children",
        "key",
        "pages",
        "depth",
        "kv_producer",
        "checkpoint",
        "lock_count",
        "own_locks",
        "last_access",
        "attached",
        "is_tail",
        "host_pages",
    )

    def __init__(
        self,
        key: tuple[int, ...],
        pages: list[int],
        parent: Node | None,
        *,
        kv_producer: int | None = None,
        last_access: int = 0,
        is_tail: bool = False,
    ) -> None:
        self.parent = parent
        self.children: dict[tuple[int, ...], Node] = {}
        self.key = key
        self.pages = pages
        self.depth = (parent.depth if parent is not None else 0) + len(key)
        self.kv_producer = kv_producer
        self.checkpoint: Checkpoint | None = None
        self.lock_count = 0
        self.own_locks = 0
        self.last_access = last_access
        self.attached = parent is None  # the root is always attached; children once linked
        self.is_tail = is_tail
        self.host_pages: list[int] | None = None  # the host tier's copy of the KV (kv_on_host)

    @property
    def is_root(self) -> bool:
        return self.parent is None and not self.key

    @property
    def start_depth(self) -> int:
        return self.depth - len(self.key)

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def kv_pending(self) -> bool:
        return self.kv_producer is not None

    @property
    def kv_on_host(self) -> bool:
        """The KV was demoted to the host tier: not readable until it comes back (``tree.py``)."""
        return self.host_pages is not None

    @property
    def num_pages(self) -> int:
        """Pages of the span, wherever they are (device or host tier)."""
        return len(self.host_pages) if self.host_pages is not None else len(self.pages)

    @property
    def readable_slot(self) -> int | None:
        """The committed checkpoint's slot, or None (never a pending slot)."""
        ckpt = self.checkpoint
        return ckpt.slot if ckpt is not None and ckpt.committed else None

    def path_tokens(self) -> tuple[int, ...]:
        """All tokens from the root to this node's end (``len == depth``)."""
        parts: list[tuple[int, ...]] = []
        node: Node | None = self
        while node is not None:
            parts.append(node.key)
            node = node.parent
        return tuple(t for part in reversed(parts) for t in part)

    def __repr__(self) -> str:
        kv = "pending" if self.kv_pending else "host" if self.kv_on_host else "committed"
        kind = "Tail" if self.is_tail else "Node"
        return (
            f"{kind}(depth={self.start_depth}..{self.depth}, pages={self.pages}, kv={kv}, "
            f"ckpt={self.checkpoint}, locks={self.lock_count})"
        )


def common_prefix_len(key: Sequence[int], tokens: Sequence[int], start: int) -> int:
    """Length of the common prefix of ``key`` and ``tokens[start:]``."""
    n = min(len(key), len(tokens) - start)
    i = 0
    while i < n and key[i] == tokens[start + i]:
        i += 1
    return i


def attach(parent: Node, child: Node, page_size: int) -> None:
    """Link ``child`` under ``parent`` (indexed by its first page; a tail by its whole key)."""
    child.parent = parent
    child.attached = True
    parent.children[child.key[:page_size]] = child


def detach_leaf(node: Node, page_size: int) -> None:
    """Unlink a leaf from its parent; the node stays a valid (detached) object for stale handles."""
    if node.children:
        raise ValueError("only a leaf can be detached")
    parent = node.parent
    if parent is None:
        raise ValueError("the root cannot be detached")
    del parent.children[node.key[:page_size]]
    node.attached = False


def split(node: Node, num_pages: int, page_size: int) -> Node:
    """Insert a new node above ``node`` holding its first ``num_pages`` pages; return the new node.

    ``node`` keeps its end depth, children, checkpoint and own locks; the new upper node inherits the
    KV status (host pages too), the lock count (every lock below it passes through it) and the
    access time.
    """
    cut = num_pages * page_size
    if not 0 < cut < len(node.key):
        raise ValueError(f"split at {num_pages} pages outside node of {len(node.key)} tokens")
    parent = node.parent
    assert parent is not None
    upper = Node(
        node.key[:cut],
        node.pages[:num_pages],
        parent,
        kv_producer=node.kv_producer,
        last_access=node.last_access,
    )
    upper.lock_count = node.lock_count
    if node.host_pages is not None:  # host KV splits its host pages the same way
        upper.host_pages, node.host_pages = node.host_pages[:num_pages], node.host_pages[num_pages:]
    attach(parent, upper, page_size)  # replaces node under the same first-page key
    node.key = node.key[cut:]
    node.pages = node.pages[num_pages:]
    attach(upper, node, page_size)
    return upper


def iter_nodes(root: Node) -> Iterator[Node]:
    """Every non-root node, parents before children (deterministic: children in insertion order)."""
    stack = list(reversed(list(root.children.values())))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(list(node.children.values())))


def iter_postorder(root: Node) -> list[Node]:
    """Every non-root node, children before parents."""
    return list(reversed(list(iter_nodes(root))))


def tails_along(node: Node, toks: Sequence[int], limit: int, page_size: int) -> list[Node]:
    """The tails of ``node`` whose tokens continue ``toks`` at ``node.depth`` and end at most at
    ``limit``, deepest first (at most ``page_size - 1`` dictionary lookups)."""
    d = node.depth
    found = []
    for r in range(min(page_size - 1, limit - d), 0, -1):
        tail = node.children.get(tuple(toks[d : d + r]))
        if tail is not None and tail.is_tail:
            found.append(tail)
    return found
