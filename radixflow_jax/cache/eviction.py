"""Eviction policies: which evictable node goes first.

``RadixCache.evict_kv`` and ``evict_states`` decide *what may* be evicted (never a locked node, never
pending KV, never a pending checkpoint); a policy only orders the candidates. A policy is any object
with ``score(node, now, target) -> float``: lower scores are evicted first. ``target`` is ``"kv"``
(the node's pages, and its committed checkpoint with them) or ``"state"`` (its checkpoint only).

Policies must be pure functions of the node, the clock and their own frozen parameters, so eviction
is deterministic. Ties are broken by the deeper node first, then by tree order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from radixflow_jax.cache.tree import Node

__all__ = [
    "EvictTarget",
    "EvictionPolicy",
    "FlopAwarePolicy",
    "LRUPolicy",
    "is_shadowed",
    "kv_evictable",
    "state_evictable",
]

EvictTarget = Literal["kv", "state"]


class EvictionPolicy(Protocol):
    def score(self, node: Node, now: int, target: EvictTarget) -> float:
        """Lower is evicted first."""
        ...


@dataclass(frozen=True)
class LRUPolicy:
    """Least recently used first (``node.last_access`` is the cache's logical clock).

    ``keep_branches`` (checkpoints only): a checkpoint known to be shared goes after every
    speculative one: one at a *branch* (a node where two or more cached paths part), or one planted
    for waiting requests (``wanted``) that none has read yet. Grid and request-end checkpoints on a
    plain chain are guesses about future requests, so under slot pressure they are dropped first.
    ``keep_deepest`` (checkpoints only): before any of those, a checkpoint *shadowed* on its chain
    (:func:`is_shadowed`): a request that reaches it and goes on along the chain reads the deeper
    one, so it serves only a request that leaves the chain between the two. A prompt's exact end
    outlives the grid checkpoints above it; a request's end past its prompt shadows nothing.
    """

    keep_branches: bool = True
    keep_deepest: bool = True

    def score(self, node: Node, now: int, target: EvictTarget) -> float:
        if target == "state" and self.keep_branches and is_shared_checkpoint(node):
            return float(node.last_access + now)
        if target == "state" and self.keep_deepest and is_shadowed(node):
            return float(node.last_access - now)
        return float(node.last_access)


def is_shadowed(node: Node) -> bool:
    """Whether the plain chain that continues ``node``'s path (no branch: :func:`_continuations`)
    reaches a committed checkpoint before it branches or ends, not counting ``generated`` ones (a
    request's end past its prompt): a client resends the model's answer re-tokenised, with its
    reasoning stripped by a chat template or its tool calls reformatted often enough that the
    prompt's end, where the client's own tokens stop, is the likeliest place for its next turn to
    leave the chain. For a tail the chain is the one its tokens start (a full-page sibling, longer
    tails). O(length of that chain)."""
    below = _continuations(node)
    while below is not None:
        if any(c.checkpoint is not None and c.checkpoint.committed and not c.checkpoint.generated for c in below):
            return True
        page = next((c for c in below if not c.is_tail), None)
        below = _continuations(page) if page is not None else None
    return False


def _continuations(node: Node) -> list[Node] | None:
    """The nodes that continue ``node``'s path when they form one chain: at most one full-page node
    and tails that are prefixes of it (or of the longest tail); ``None`` at a branch or an end."""
    if node.is_tail:
        n = len(node.key)
        assert node.parent is not None
        kids = [c for c in node.parent.children.values() if len(c.key) > n and c.key[:n] == node.key]
    else:
        kids = list(node.children.values())
    if not kids:
        return None
    longest = max(kids, key=lambda c: len(c.key))
    if any(c is not longest and (not c.is_tail or longest.key[: len(c.key)] != c.key) for c in kids):
        return None
    return kids


def is_shared_checkpoint(node: Node) -> bool:
    """A branch node's checkpoint (children that do not form one chain: a tail on the path of its
    full-page sibling is no branch), or a look-ahead checkpoint no waiting sibling has read yet."""
    ckpt = node.checkpoint
    if ckpt is None:
        return False
    return (len(node.children) >= 2 and _continuations(node) is None) or (ckpt.wanted and not ckpt.reads)


@dataclass(frozen=True)
class FlopAwarePolicy:
    """Marconi-style: ``score = recency + alpha * (flops_saved / bytes) / efficiency_scale``.

    ``recency = last_access / now`` lies in [0, 1]. ``flops(start, end)`` is the caller's estimate of
    the FLOPs needed to recompute tokens ``[start, end)`` given the prefix before ``start``. For
    ``"kv"`` the node saves its own span and frees ``pages * page_bytes`` (+ ``state_bytes`` when it
    holds a committed checkpoint); for ``"state"`` the checkpoint saves recomputing from the nearest
    checkpoint above it (or the root) and frees ``state_bytes``. ``efficiency_scale`` (FLOPs per byte
    of a typical entry) normalises the second term to about [0, 1]; ``alpha`` weighs it (Marconi tunes
    alpha online; here it is fixed per policy object).
    """

    flops: Callable[[int, int], float]
    page_bytes: float
    state_bytes: float
    alpha: float = 1.0
    efficiency_scale: float = 1.0

    def score(self, node: Node, now: int, target: EvictTarget) -> float:
        recency = node.last_access / max(now, 1)
        if target == "kv":
            saved = self.flops(node.start_depth, node.depth)
            size = len(node.pages) * self.page_bytes
            if node.checkpoint is not None:
                size += self.state_bytes
        else:
            saved = self.flops(_checkpoint_above(node), node.depth)
            size = self.state_bytes
        efficiency = saved / max(size, 1e-30) / self.efficiency_scale
        return recency + self.alpha * efficiency


def _checkpoint_above(node: Node) -> int:
    """Depth of the nearest committed checkpoint strictly above ``node`` (0 at the root)."""
    up = node.parent
    while up is not None and not up.is_root:
        if up.checkpoint is not None and up.checkpoint.committed:
            return up.depth
        up = up.parent
    return 0


def kv_evictable(node: Node) -> bool:
    """An attached, unlocked node with committed device KV, no pending checkpoint (a committed or a
    host one goes with it) and no child holding device KV: a leaf, or (with a host tier for KV) a
    node whose children all hold host KV (``tree.py``)."""
    ckpt = node.checkpoint
    return (
        node.attached
        and not node.is_root
        and node.lock_count == 0
        and node.kv_producer is None
        and not node.kv_on_host
        and (ckpt is None or not ckpt.pending)
        and all(c.kv_on_host for c in node.children.values())
    )


def state_evictable(node: Node) -> bool:
    """An attached, unlocked node holding a committed checkpoint."""
    ckpt = node.checkpoint
    return node.attached and node.lock_count == 0 and ckpt is not None and ckpt.committed
