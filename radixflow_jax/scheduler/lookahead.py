"""Where a span plants checkpoints, with a look-ahead at the waiting requests that share its start.

Plain Python (no JAX). :class:`WaitingIndex` groups this round's waiting requests by their first
``G`` tokens: only those can share a branch point deeper than 0 with a producer. Each round's
builder (``builder.RoundBuilder``) holds one over the queue as the round began and drops it with
the round, so it never outlives the queue it indexes. :func:`placements` reads the placement
settings from the ``SchedulerConfig``; the placement rules themselves live in ``cache/placement.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from radixflow_jax.cache import placement
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.request import Request, RequestStatus


class WaitingIndex:
    """This round's waiting requests keyed by their first ``grid`` tokens. Built on the first
    :meth:`siblings` call: rounds that plant no prefill span (all decode) never pay for it."""

    def __init__(self, grid: int, waiting: Iterable[Request] = ()):
        self.grid = grid
        self._waiting = waiting
        self._by_head: dict[tuple[int, ...], list[Request]] | None = None

    def _build(self) -> dict[tuple[int, ...], list[Request]]:
        by_head: dict[tuple[int, ...], list[Request]] = {}
        g = self.grid
        for req in self._waiting:
            if req.num_tokens > g:
                head = req.prompt[:g] if len(req.prompt) >= g else req.tokens[:g]  # no copy of the prompt
                by_head.setdefault(head, []).append(req)
        return by_head

    def siblings(self, req: Request) -> Iterator[Request]:
        """Requests still waiting (other than ``req``) that share ``req``'s first grid of tokens."""
        if self._by_head is None:
            self._by_head = self._build()
        for sib in self._by_head.get(req.tokens[: self.grid], ()):
            if sib is not req and sib.status is RequestStatus.WAITING:
                yield sib


def placements(
    cfg: SchedulerConfig, req: Request, start: int, end: int, branch_len: int | None, index: WaitingIndex
) -> list[placement.Placement]:
    """Where ``req``'s span ``[start, end)`` plants checkpoints (rules in ``cache/placement.py``)."""
    prompt_len = len(req.prompt)
    if not cfg.hybrid or (end - start == 1 and end % cfg.grid and end != prompt_len):
        return []  # most decode spans: nothing to place, no spacing or look-ahead to compute
    every = placement.spacing(prompt_len, cfg.grid, interval=cfg.checkpoint_interval, max_checkpoints=cfg.max_checkpoints)
    if not cfg.branch_checkpoints:
        return placement.place(start, end, grid=cfg.grid, every=every, prompt_len=prompt_len)
    ahead: set[int] = set()
    if end - start > 1:  # a prefill span: look ahead at waiting siblings
        siblings = (sib.tokens if sib.output else sib.prompt for sib in index.siblings(req))
        ahead = placement.lookahead_lengths(req.tokens, siblings, limit=prompt_len)
    return placement.place(
        start,
        end,
        grid=cfg.grid,
        every=every,
        prompt_len=prompt_len,
        branch_lens=(branch_len,) if branch_len else (),
        lookahead_lens=ahead,
    )
