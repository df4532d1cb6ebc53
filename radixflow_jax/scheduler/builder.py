"""One round under construction: the rows planned so far, the :class:`Budget` they left, the round's
statistics and look-ahead index, and the row builder that plants each row's checkpoints. Plain
Python (no JAX).

A :class:`RoundBuilder` lives for one ``Scheduler.schedule()`` call: the coordinator creates it,
passes it to the collaborators that add rows (the running set, the admission scan, pairing) and
turns it into a :class:`~radixflow_jax.scheduler.plan.RoundPlan` with :meth:`RoundBuilder.build`.
Its :class:`~radixflow_jax.scheduler.lookahead.WaitingIndex` indexes the queue as it was when the
round began and is dropped with the builder, so it never outlives the queue it indexes.

Invariants:
  * Every span starts at a multiple of the grid ``G`` except decode spans and the first span of a
    request that starts at an exact-depth checkpoint, and every span that does not end the known
    tokens ends on the grid (:func:`grid_span`), so a request's later spans start on the grid again
    and its checkpoints fall on chunk boundaries inside spans (``cache/placement.py``, emit depths).
  * A row added (:meth:`RoundBuilder.add`) spends exactly its span of tokens and one row place of
    the budget; nothing else spends it (a prefill-first round holds row places back and gives them
    back, :meth:`Budget.hold`).
  * A span that holds a token of a round in flight plants no checkpoint: no tree path can name that
    token yet (the engine commits that round first when a checkpoint falls there, see
    ``Scheduler.plants_on_unknown``).
  * The plan :meth:`RoundBuilder.build` returns holds no row of an older epoch than its request's
    (a request preempted or rolled back while the round was planned), and its one-token rows come
    first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from radixflow_jax.scheduler.allocator import Allocator
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.drafts import Drafter
from radixflow_jax.scheduler.lookahead import WaitingIndex, placements
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan
from radixflow_jax.scheduler.request import Request


@dataclasses.dataclass(frozen=True)
class Budget:
    """What the round being planned may still take: ``tokens`` to compute and ``rows`` (one per
    request). Spending returns a new budget; the counts are compared exactly as planned (a row place
    held back by a prefill-first round can leave ``rows`` below zero until it is given back)."""

    tokens: int
    rows: int

    def spend(self, tokens: int) -> Budget:
        """The budget after a row of ``tokens`` tokens."""
        return Budget(self.tokens - tokens, self.rows - 1)

    def hold(self, rows: int) -> Budget:
        """The budget with ``rows`` row places held back (negative: given back)."""
        return Budget(self.tokens, self.rows - rows)


def grid_span(start: int, remaining: int, tokens: int, grid: int) -> int:
    """Tokens to compute from ``start`` with ``remaining`` left and ``tokens`` of budget: all of
    them if they fit, else up to the last grid position within the budget (0 if none)."""
    if remaining <= tokens:
        return remaining
    return max(0, (start + tokens) // grid * grid - start)


class RoundBuilder:
    """The round being planned. ``rows`` in the order planned; ``num_computing``: running requests
    that still compute plus this round's admissions (admission stops at ``max_num_seqs``);
    ``starved``: a request that wants more than one token got no span this round
    (:meth:`note_starved`)."""

    def __init__(
        self, config: SchedulerConfig, memory: Allocator, waiting: Iterable[Request], drafter: Drafter | None = None
    ):
        self.config = config
        self.memory = memory
        self.drafter = drafter  # speculative decoding: a model's drafts (None: n-gram lookups)
        self.budget = Budget(config.max_num_batched_tokens, config.max_num_seqs)
        self.rows: list[RowPlan] = []
        self.stats = RoundStats()
        self.num_computing = 0
        self.starved = False
        looks_ahead = config.hybrid and config.branch_checkpoints and memory.cache is not None
        self.waiting_index = WaitingIndex(config.grid, tuple(waiting) if looks_ahead else ())
        self._owners: dict[int, Request] = {}  # request id -> request, for the rows planned
        self._twins: dict[int, list[Request]] | None = None  # prompt key -> requests with no output yet
        self._rider_parts: dict[int, tuple[int, tuple[int, int] | None, tuple[tuple[int, int], ...]]] = {}
        unused = memory.cache.evicted_unused if memory.cache is not None else 0
        self._evicted = (memory.evicted_pages, memory.evicted_slots, unused)

    def span(self, start: int, remaining: int) -> int:
        """:func:`grid_span` within the tokens left in the budget."""
        return grid_span(start, remaining, self.budget.tokens, self.config.grid)

    def note_starved(self, wanted: int) -> None:
        """A request that wants ``wanted`` tokens got no span this round (the token budget left holds
        no grid position past its start); only one that wants more than one token counts."""
        if wanted > 1:
            self.starved = True

    def add_from_host(self, req: Request, match: Any) -> bool:
        """Admits waiting ``req`` at the depth of ``match.host_node``, a host checkpoint: its own
        slot gets the host copy before this round's step (``RadixCache.read_host``) and its row
        starts there, as a running request's does. False, holding nothing, when the budget or
        memory cannot take it now."""
        memory, node = self.memory, match.host_node
        hit = node.depth
        span = self.span(hit, req.num_tokens - hit)
        if span == 0 or not memory.seat(req, computed=hit, end=hit + span, hit_node=node, hit_pages=match.host_pages,
                                        slot=True):  # fmt: skip
            return False
        memory.cache.read_host(node, req.slot)
        branch = memory.cache.shared_len(req.tokens) if self.config.branch_checkpoints else None
        self.add(req, span, None, branch, copy_page_from=match.host_tail_page)
        return True

    def count_bubble(self, queue: Iterable[Request]) -> None:
        """Counts what non-consumers behind a consumer stop could have brought (the bubble). Looks at
        no more than ``4 * max_num_seqs`` requests: an estimate, bounded so planning stays cheap."""
        tokens, rows, stats = self.budget.tokens, self.budget.rows, self.stats
        cache = self.memory.cache
        for seen, req in enumerate(queue):
            if rows == 0 or tokens == 0 or seen >= 4 * self.config.max_num_seqs:
                break
            match = cache.match(req.tokens, touch=False, shared=False) if cache is not None else None
            if match is not None and match.is_consumer:
                continue
            hit = match.hit_len if match is not None else 0
            span = grid_span(hit, req.num_tokens - hit, tokens, self.config.grid)
            if span:
                stats.shadow_tokens += span
                stats.shadow_rows += 1
                tokens -= span
                rows -= 1

    def row_of(self, request_id: int) -> RowPlan | None:
        """The first row planned this round for ``request_id``."""
        return next((r for r in self.rows if r.request_id == request_id), None)

    def add(
        self,
        req: Request,
        span: int,
        copy_from: int | None,
        branch_len: int | None = None,
        pair_slot: int | None = None,
        copy_page_from: int | None = None,
        draft: tuple[int, ...] = (),
    ) -> None:
        """Plans ``req``'s row of ``span`` tokens from ``req.num_computed``: plants its pending
        checkpoints (``copy_from``: a committed slot read first; ``branch_len``: where its path
        leaves an existing one; ``pair_slot``: policy pair's in-round producer state;
        ``copy_page_from``: a tail's partial page copied into its first page, ``RowPlan``) and
        spends the budget. ``draft``: tokens drafted after the span (a verify row, which plants
        nothing and reads its slot into its spare slot, ``scheduler/drafts.py``)."""
        start = req.num_computed
        if draft:
            self.rows.append(
                RowPlan(
                    request_id=req.request_id, tokens=req.token_span(start, start + span) + draft, start=start,
                    pages=tuple(req.pages), slot=req.spare_slot or 0, copy_from=req.slot, emits=(), sample=True,
                    epoch=req.epoch, num_draft=len(draft),
                )
            )
            self._owners[req.request_id] = req
            self.budget = self.budget.spend(span + len(draft))
            return
        wanted = placements(self.config, req, start, start + span, branch_len, self.waiting_index)
        if req.unknown_tokens and start + span > req.num_tokens - req.unknown_tokens:
            planted, skipped = [], len(wanted)  # a token of a round in flight: see the module docstring
        else:
            planted, skipped = self.memory.plant(req, wanted)
        self.stats.checkpoints_planted += len(planted)
        self.stats.checkpoints_skipped += skipped
        self.rows.append(
            RowPlan(
                request_id=req.request_id,
                tokens=req.token_span(start, start + span),
                start=start,
                pages=tuple(req.pages),
                slot=req.slot or 0,
                copy_from=copy_from,
                emits=tuple((depth - start, slot) for depth, slot in planted),
                sample=start + span == req.num_tokens,
                pair_slot=pair_slot,
                copy_page_from=copy_page_from,
                epoch=req.epoch,
                next_token=_next_token(req, start + span),
            )
        )
        self._owners[req.request_id] = req
        self.budget = self.budget.spend(span)

    def prompt_twins(self, req: Request, running: Iterable[Request]) -> list[Request]:
        """Running requests (admissions of this round included, :meth:`note_running`) with no output
        yet whose prompt equals ``req``'s. The index is built on the first call of the round."""
        if self._twins is None:
            self._twins = {}
            for r in running:
                self.note_running(r)
        return [r for r in self._twins.get(req.prompt_key, ()) if r.prompt == req.prompt and not r.output]

    def note_running(self, req: Request) -> None:
        """``req`` runs (admitted this round): a twin for the requests scanned after it."""
        if self._twins is not None and not req.output:
            self._twins.setdefault(req.prompt_key, []).append(req)

    def add_rider(self, req: Request, producer_row: RowPlan, page_copies: tuple[tuple[int, int], ...]) -> None:
        """Plans rider ``req`` (``scheduler/riders.py``; its slot and pages are allocated, its
        ``num_computed`` is the prompt length): a row of no tokens that samples from the producer
        row's last position; the producer row emits its end state into the rider's slot (hybrid
        models). Spends one row place and no tokens."""
        emit = None
        if req.slot is not None:
            i = next(k for k, r in enumerate(self.rows) if r is producer_row)
            emit = (len(producer_row.tokens), req.slot)
            self.rows[i] = dataclasses.replace(producer_row, emits=producer_row.emits + (emit,))
        self.rows.append(
            RowPlan(
                request_id=req.request_id,
                tokens=(),
                start=req.num_computed,
                pages=tuple(req.pages),
                slot=0,
                copy_from=None,
                emits=(),
                sample=True,
                epoch=req.epoch,
                twin_id=producer_row.request_id,
            )
        )
        self._rider_parts[req.request_id] = (producer_row.request_id, emit, page_copies)
        self._owners[req.request_id] = req
        self.budget = self.budget.spend(0)

    def build(self, admitted: int) -> RoundPlan:
        """The plan of the round, with ``admitted`` requests admitted (still in this epoch): rows of
        an older epoch dropped, one-token rows first (stable), eviction counts filled in."""
        stats, memory = self.stats, self.memory
        stats.evicted_pages = memory.evicted_pages - self._evicted[0]
        stats.evicted_slots = memory.evicted_slots - self._evicted[1]
        if memory.cache is not None:
            stats.checkpoints_evicted_unused = memory.cache.evicted_unused - self._evicted[2]
        rows = self.rows
        if stats.preempted:  # a victim, or a partner its roll-back took, may have had a row in this plan
            rows = [r for r in rows if r.epoch == self._owners[r.request_id].epoch]
            rows = self._drop_rider_parts(rows)
            stats.checkpoints_planted = sum(len(r.emits) for r in rows) - sum(
                1 for r in rows if r.twin_id is not None and self._rider_parts[r.request_id][1] is not None
            )  # a victim's were unpublished; a rider's emit is no checkpoint
        stats.admitted = admitted
        rows = sorted(rows, key=lambda r: 0 if r.is_decode else 2 if r.is_rider else 1)  # stable
        num_decode = sum(1 for r in rows if r.is_decode)
        copies = tuple(c for r in rows if r.twin_id is not None for c in self._rider_parts[r.request_id][2])
        # a plan of neither rows nor restores is not launched: its moves wait for the next one
        moves, restores = memory.take_state_moves() if rows or memory.restores_queued else ((), ())
        return RoundPlan(
            rows=tuple(rows), num_decode=num_decode, stats=stats, page_copies=copies, state_moves=moves,
            restores=restores,
        )

    def _drop_rider_parts(self, rows: list[RowPlan]) -> list[RowPlan]:
        """Riders whose row left the plan (preempted, or rolled back with their producer) take the
        producer's emit into their released slot with them (their page copies go with their row)."""
        live = {r.request_id for r in rows}
        stale: dict[int, set[tuple[int, int]]] = {}  # producer id -> emits into released rider slots
        for rid, (producer, emit, _) in self._rider_parts.items():
            if rid not in live and emit is not None:
                stale.setdefault(producer, set()).add(emit)
        if not stale:
            return rows
        return [_without_emits(r, stale[r.request_id]) if r.request_id in stale else r for r in rows]


def _without_emits(row: RowPlan, emits: set[tuple[int, int]]) -> RowPlan:
    """``row`` without the given emits."""
    return dataclasses.replace(row, emits=tuple(e for e in row.emits if e not in emits))


def _next_token(req: Request, end: int) -> int:
    """The known token at position ``end`` (``RowPlan.next_token``), -1 past the known tokens."""
    if end >= req.num_tokens - req.unknown_tokens:
        return -1
    return req.token_span(end, end + 1)[0]
