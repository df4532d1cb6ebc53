"""Whole-cache invariant checks (used by tests and debug builds; O(tree + pools)).

Checked: the node invariants listed in ``tree.py``; the producer index equals the set of nodes that
hold pending KV or a pending checkpoint of that producer; the tree references each slot at most once
and each page at most once outside tails (a tail shares its partial page), never the reserved id 0,
and never a free id (pool refcount >= tree references); host KV (``Node.kv_on_host``) holds host
pages only, each referenced once, has host KV below it and no device checkpoint; and the pools' own
invariants (every id free xor owned, counts consistent).
"""

from __future__ import annotations

from collections import Counter

from radixflow_jax.cache.config import CacheConfig
from radixflow_jax.cache.pools import HostPool, InvariantError, PagePool, SlotPool
from radixflow_jax.cache.tree import Node, iter_nodes

__all__ = ["check_tree", "host_page_references", "host_references", "tree_references"]


def tree_references(root: Node) -> tuple[Counter[int], Counter[int]]:
    """How many references the tree holds on each page and each device slot."""
    pages: Counter[int] = Counter()
    slots: Counter[int] = Counter()
    for node in iter_nodes(root):
        pages.update(node.pages)
        if node.checkpoint is not None and not node.checkpoint.on_host:
            slots[node.checkpoint.held_slot] += 1
    return pages, slots


def host_page_references(root: Node) -> Counter[int]:
    """How many references the tree holds on each host page (``cache/hostkv.py``)."""
    return Counter(page for node in iter_nodes(root) if node.host_pages is not None for page in node.host_pages)


def host_references(root: Node) -> Counter[int]:
    """How many references the tree holds on each host slot (``cache/tiers.py``)."""
    return Counter(
        node.checkpoint.host_slot for node in iter_nodes(root)
        if node.checkpoint is not None and node.checkpoint.host_slot is not None
    )  # fmt: skip


def _fail(node: Node, msg: str) -> None:
    raise InvariantError(f"{msg}: {node!r}")


def _check_node(node: Node, parent: Node, config: CacheConfig) -> None:
    p = config.page_size
    if not node.attached or node.parent is not parent:
        _fail(node, "child not attached to its parent")
    if node.is_tail:
        if parent.depth % p or not 0 < len(node.key) < p or node.num_pages != 1 or node.children:
            _fail(node, "a tail is a leaf of 1 .. page_size - 1 tokens and one page below a page boundary")
        if config.hybrid and node.checkpoint is None:
            _fail(node, "a hybrid model's tail without its checkpoint")
    elif not node.key or len(node.key) % p:
        _fail(node, "span is not a non-empty multiple of page_size")
    elif node.num_pages != len(node.key) // p:
        _fail(node, "page count does not match span")
    if node.kv_on_host:
        _check_host_kv(node)
    elif parent.kv_on_host:
        _fail(node, "device KV below host KV")
    if node.depth != parent.depth + len(node.key):
        _fail(node, "depth inconsistent with parent")
    if parent.children.get(node.key[:p]) is not node:
        _fail(node, "parent indexes the child under another key")
    locks = node.own_locks + sum(c.lock_count for c in node.children.values())
    if node.own_locks < 0 or node.lock_count != locks:
        _fail(node, f"lock_count {node.lock_count} != own {node.own_locks} + children")
    ckpt = node.checkpoint
    if ckpt is not None and ckpt.on_host and (ckpt.host_slot is None or ckpt.held_slot != 0):
        _fail(node, "a host checkpoint holds a host slot and no device slot")
    if ckpt is not None and ckpt.restoring and ckpt.producer_id >= 0:
        _fail(node, "a restoring checkpoint's producer is not a restore id")
    if node.kv_producer is not None:
        if parent.kv_producer not in (None, node.kv_producer):
            _fail(node, "pending KV under another producer's pending KV")
        if node.lock_count:
            _fail(node, "pending KV is locked")
        if ckpt is not None and not (ckpt.pending and ckpt.producer_id == node.kv_producer):
            _fail(node, "pending KV holds a checkpoint not pending by its producer")
    elif parent.kv_producer is not None:
        _fail(node, "committed KV below pending KV")


def _check_host_kv(node: Node) -> None:
    ckpt = node.checkpoint
    if node.pages or node.kv_producer is not None:
        _fail(node, "host KV holds device pages or is pending")
    if ckpt is not None and not ckpt.on_host:
        _fail(node, "host KV holds a checkpoint that is not a host one")


def check_tree(
    root: Node,
    config: CacheConfig,
    page_pool: PagePool,
    slot_pool: SlotPool,
    pending: dict[int, set[Node]],
    host_pool: HostPool | None = None,
    host_page_pool: HostPool | None = None,
) -> None:
    """Raise ``InvariantError`` on the first violated invariant."""
    if not root.is_root or root.pages or root.checkpoint is not None or root.kv_producer is not None:
        raise InvariantError("root must hold no span, pages, KV status or checkpoint")
    expected: dict[int, set[Node]] = {}
    for node in iter_nodes(root):
        assert node.parent is not None
        _check_node(node, node.parent, config)
        owners = {node.kv_producer} if node.kv_producer is not None else set()
        if node.checkpoint is not None and node.checkpoint.pending:
            owners.add(node.checkpoint.producer_id)
        for pid in owners:
            expected.setdefault(pid, set()).add(node)
    actual = {pid: nodes for pid, nodes in pending.items() if nodes}
    if actual != expected:
        raise InvariantError(f"producer index {actual} != nodes with pending data {expected}")
    page_refs, slot_refs = tree_references(root)
    full_pages = Counter(page for node in iter_nodes(root) if not node.is_tail for page in node.pages)
    for page, n in full_pages.items():
        if n > 1:
            raise InvariantError(f"tree references page {page} {n} times outside tails")
    for pool, refs, what in ((page_pool, page_refs, "page"), (slot_pool, slot_refs, "slot")):
        pool.check_invariants()
        for i, n in refs.items():
            if n > 1 and what == "slot":
                raise InvariantError(f"tree references {what} {i} {n} times")
            if not 0 < i < pool.size:
                raise InvariantError(f"tree references invalid {what} {i}")
            if pool.refcount(i) < n:
                raise InvariantError(f"{what} {i} has refcount {pool.refcount(i)} < tree references {n}")
    _check_host_refs(host_references(root), host_pool, "host slot")
    _check_host_refs(host_page_references(root), host_page_pool, "host page")


def _check_host_refs(refs: Counter[int], pool: HostPool | None, what: str) -> None:
    """Each host id the tree names is named once and owned by ``pool``, which must exist."""
    if refs and pool is None:
        raise InvariantError(f"{what}s {sorted(refs)} named without a host tier for them")
    if pool is not None:
        pool.check_invariants()
        for i, n in refs.items():
            if n > 1 or not 0 < i < pool.size or pool.refcount(i) < n:
                raise InvariantError(f"{what} {i}: {n} tree references, refcount {pool.refcount(i)}")
