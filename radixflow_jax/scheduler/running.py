"""Rows of the running requests, a mixin of :class:`~radixflow_jax.scheduler.scheduler.Scheduler` (it
uses the scheduler's config, memory, running list and row builder): preemption under page pressure,
and the prefill-first rule that keeps a budget close to the grid from starving prompts behind decode
rows (the scheduler's module docstring, "Liveness"). No JAX here.

A round normally plans the running requests first, in admission order, the decode rows (one token to
compute) before the prompts, then admits from the queue. After a round that gave a prompt (running
or waiting) no tokens while every one of its rows computed one token, the next round is *prefill
first*: running prompts, then admissions, then the decode rows with the tokens left. The decode
rows' row places are reserved meanwhile, so they keep their rows; one that gets no token waits that
round. Admission stops at ``max_num_seqs`` running requests that still compute (``_active``), so a
running prompt without a row this round keeps its place.

Preemption under page pressure takes the latest-admitted running request that was admitted after
the one short of pages, has no row in the round and still computes: one whose last token is in
flight (overlap) frees its pages at that round's commit, so preempting it would only throw its work
away, and an older request is never a victim of a newer one (first come, first served, as vLLM
preempts). With no such victim a request
preempts itself, unless a commit in flight can free pages for it (:meth:`_pages_come_back`): then
it gets no row and waits for that commit, and the round admits nothing (``Scheduler.schedule``:
new arrivals would take the freed pages first, one by one, and starve it). Both cases livelocked
before (two requests preempting each other forever; a lone request restarting while its own
pending checkpoint pinned the pages it needed; ``tests/scheduler/test_overlap_liveness.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixflow_jax.scheduler.plan import RoundStats, RowPlan
from radixflow_jax.scheduler.request import Request, RequestStatus, drop_in_flight

if TYPE_CHECKING:
    from radixflow_jax.scheduler.scheduler import Scheduler

    _Base = Scheduler
else:
    _Base = object


class RunningMixin(_Base):
    def _running_before_admission(self, rows: list[RowPlan], budget: list[int], stats: RoundStats) -> int:
        """Plans the running rows that come before admission and returns the row places reserved for
        the decode rows that come after it (0 unless the round is prefill first)."""
        prefill_first, self._starved = self._starved, False
        stats.prefill_first = prefill_first
        reserved = 0
        if prefill_first:  # decode rows last this round: their rows are kept, their tokens are not
            reserved = sum(1 for r in self.running if r.remaining == 1 and _computes(r))
            budget[1] -= reserved
            self._schedule_running(rows, budget, stats, decode=False)
        else:  # decode rows first: a running prompt earlier in the list must not take their tokens
            self._schedule_running(rows, budget, stats, decode=True)
            self._schedule_running(rows, budget, stats, decode=False)
        # running requests that still compute (overlap: one whose last token is in flight does not)
        self._active = sum(1 for r in self.running if _computes(r))
        return reserved

    def _running_after_admission(
        self, rows: list[RowPlan], budget: list[int], stats: RoundStats, reserved: int
    ) -> None:
        """The decode rows of a prefill-first round; then whether the next round is prefill first (a
        prompt got no tokens and no row of this round computes more than one)."""
        if stats.prefill_first:
            budget[1] += reserved
            self._schedule_running(rows, budget, stats, decode=True)
        self._starved = self._starved and all(len(r.tokens) <= 1 for r in rows)

    def _note_starved(self, wanted: int) -> None:
        """A request that wants more than one token got no span this round (the token budget left
        holds no grid position past its start). If no row of the round computes more than one token,
        the scheduler plans the next round prefill first, so a budget close to the grid cannot
        starve prompts behind decode rows (each decode row costs one token of it)."""
        if wanted > 1:
            self._starved = True

    def _preempt_one(self, keep: Request, scheduled: set[int]) -> bool:
        """Preempts the latest-admitted running request that was admitted after ``keep`` and still
        computes (one whose last token is in flight frees its pages at that round's commit),
        preferring one without a row in this round (``scheduled``); a victim's row leaves the plan
        at its end (``Scheduler.schedule`` drops rows of an older epoch). An earlier-admitted
        request is never a victim, so newer requests cannot keep restarting an older one (decode
        rows are planned before prompts, so a newer decode row often has its row already when an
        older prompt runs short)."""
        newer = [v for v in reversed(self.running[self.running.index(keep) + 1 :]) if _computes(v)]
        victim = next((v for v in newer if v.request_id not in scheduled), newer[0] if newer else None)
        if victim is None:
            return False
        self._preempt(victim)
        return True

    def _preempt(self, req: Request) -> None:
        self._roll_back_partners(req)
        self._back_to_waiting(req)
        req.num_preemptions += 1

    def _back_to_waiting(self, req: Request) -> None:
        """A running request goes back to the head of the queue and will recompute from scratch: its
        pages and slot are released, and its rows in flight go stale (a new epoch)."""
        self.memory.release(req, keep_prefix=False)
        self.running.remove(req)
        drop_in_flight(req)
        req.epoch += 1
        req.status, req.num_computed, req.cached_tokens = RequestStatus.WAITING, 0, 0
        self.waiting.appendleft(req)

    def _pages_come_back(self, req: Request) -> bool:
        """Whether a commit in flight can free pages for ``req``: a round of its own is in flight (its
        pending KV and checkpoint can pin pages of the tree that a restart would need), or a running
        request finishes there (its last token is in flight)."""
        return bool(req.in_flight) or any(not _computes(r) for r in self.running)

    def _schedule_running(
        self, rows: list[RowPlan], budget: list[int], stats: RoundStats, decode: bool
    ) -> None:
        """Rows for running requests in admission order, those with one token to compute (``decode``
        True) or more (False). A prefill that gets no span for lack of tokens marks the round
        (:meth:`_note_starved`)."""
        scheduled = {r.request_id for r in rows}
        for req in list(self.running):
            if req not in self.running:
                continue  # preempted while making room for an earlier one
            if not _computes(req):
                continue
            if req.request_id in scheduled or (req.remaining == 1) is not decode:
                continue
            span = self._span(req.num_computed, req.remaining, budget[0]) if budget[1] > 0 else 0
            if span == 0:
                self._note_starved(req.remaining)
                continue
            while not self.memory.ensure_pages(req, req.num_computed + span):
                if not self._preempt_one(req, scheduled):
                    if self._pages_come_back(req):  # wait for the commit in flight instead of a restart
                        stats.waited_for_pages += 1
                        break
                    self._preempt(req)
                    stats.preempted += 1
                    break
                stats.preempted += 1
                if req not in self.running:  # a victim's roll-back (pair) took it back to the queue too
                    break
            else:
                rows.append(self._row(req, span, None, stats))
                scheduled.add(req.request_id)
                budget[0] -= span
                budget[1] -= 1


def _computes(req: Request) -> bool:
    """False for a running request whose last token a round in flight samples (overlap): it needs
    no row and holds no place; it finishes at that round's commit."""
    return len(req.output) < req.max_tokens
