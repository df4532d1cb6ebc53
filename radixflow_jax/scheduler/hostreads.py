"""Resuming a waiting request from the host tier (``cache/tiers.py``, ``cache/hostkv.py``): the
part of the admission scan that runs when a match reaches host-resident state.

Order: host KV on the way comes back first (``Allocator.promote``: device pages, ``kv_restore``
moves queued for the plan being built, committed at once); then a host checkpoint is read straight
into the request's slot when it can run now (``RoundBuilder.add_from_host``), or restored as
pending state for a later round (``Allocator.restore``), the request waiting as its consumer.

Invariant: a request never starts from a host checkpoint whose path still holds host KV (the
match's ``host_kv`` must be empty): it would attend to pages nobody restored.
"""

from __future__ import annotations

from typing import Any, Literal

from radixflow_jax.scheduler.allocator import Allocator
from radixflow_jax.scheduler.builder import RoundBuilder
from radixflow_jax.scheduler.request import Request

__all__ = ["from_host"]

Outcome = Literal["admit", "hold"] | None


def from_host(req: Request, match: Any, round_: RoundBuilder, memory: Allocator) -> tuple[Outcome, Any]:
    """What the host tier does for waiting ``req`` whose ``match`` reaches host-resident state:
    ``"admit"`` (it runs this round from a host checkpoint read into its slot), ``"hold"`` (it must
    wait: no checkpoint slot can be had while something is pending) or ``None`` (the scan goes on
    with the returned match: deeper after a promotion, a consumer of a restore it started, or as
    it was when nothing could be brought back)."""
    cache = memory.cache
    assert cache is not None
    if match.host_kv:
        wanted = req.num_tokens - match.hit_len
        if round_.span(match.hit_len, wanted) == 0 or not memory.promote(match.host_kv):
            return None, match  # the host KV stays there; the request recomputes past its hit
        round_.stats.host_kv_pages += sum(n.num_pages for n in match.host_kv)
        match = cache.match(req.tokens, shared=False)
    if match.host_node is None or match.host_kv:
        return None, match
    if round_.add_from_host(req, match):  # its hit is in the host tier: straight into its slot
        round_.stats.host_hits += 1
        return "admit", match
    if memory.restore(match.host_node):  # it cannot run now: restored for a later round
        round_.stats.host_hits += 1
        memory.hold_restore(req, match.host_node)  # a consumer of the restore
        return None, cache.match(req.tokens, shared=False)
    if cache.has_pending:  # no checkpoint slot now: one can be had once the pending ones commit
        return "hold", match
    return None, match
