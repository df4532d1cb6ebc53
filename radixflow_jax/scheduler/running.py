"""The running set: the admitted requests in admission order, their rows in each round, preemption
under page pressure, and the prefill-first rule that keeps a budget close to the grid from starving
prompts behind decode rows. No JAX here.

:class:`RunningSet` owns the running list and the prefill-first flag (the only state it keeps from
one round to the next). It moves requests between the running list and the head of the waiting
queue, which the coordinator owns and passes to it; a request is RUNNING exactly while it is in the
list. Rows go into the round's :class:`~radixflow_jax.scheduler.builder.RoundBuilder`.

A round normally plans the running requests first, in admission order, the decode rows (one token to
compute) before the prompts, then admits from the queue. After a round that gave a prompt (running
or waiting) no tokens while every one of its rows computed one token, the next round is *prefill
first*: running prompts, then admissions, then the decode rows with the tokens left. The decode
rows' row places are held back meanwhile, so they keep their rows; one that gets no token waits that
round. So a budget of one grid cannot starve prompts behind decode rows. Admission stops at
``max_num_seqs`` running requests that still compute (``RoundBuilder.num_computing``), so a running prompt
without a row this round keeps its place.

Preemption under page pressure takes the latest-admitted running request that was admitted after
the one short of pages, has no row in the round and still computes: one whose last token is in
flight (overlap) frees its pages at that round's commit, so preempting it would only throw its work
away, and an older request is never a victim of a newer one (first come, first served, as vLLM
preempts). With no such victim a request preempts itself, unless a commit in flight can free pages
for it (:meth:`RunningSet.pages_come_back`): then it gets no row and waits for that commit, and the
round admits nothing (``RoundStats.waited_for_pages``; ``Scheduler.schedule``: new arrivals would
take the freed pages first, one by one, and starve it). Both cases livelocked before (two requests
preempting each other forever; a lone request restarting while its own pending checkpoint pinned
the pages it needed; ``tests/scheduler/test_overlap_liveness.py``).

Policy ``pair``: a producer that leaves before its round commits sends every paired partner back to
the head of the queue with nothing computed (:meth:`RunningSet.roll_back_partners`), since their
rows would start from a state nobody is going to commit. Riders (``riders.py``, every policy) go back
with a leaving producer the same way until its round commits.
"""

from __future__ import annotations

import collections
import dataclasses

from radixflow_jax.scheduler.allocator import Allocator
from radixflow_jax.scheduler.builder import RoundBuilder
from radixflow_jax.scheduler.drafts import Drafter, SpeculativeConfig, ngram_draft
from radixflow_jax.scheduler.plan import RoundPlan
from radixflow_jax.scheduler.request import Request, RequestStatus
from radixflow_jax.scheduler.riders import Riders


class RunningSet:
    """``members``: the running requests in admission order (read-only outside this class)."""

    def __init__(self, memory: Allocator, waiting: collections.deque[Request], riders: Riders | None = None):
        self.members: list[Request] = []
        self._memory = memory
        self._riders = riders  # whose riders go back with a leaving producer, as paired partners do
        self._waiting = waiting  # the coordinator's queue: preempted requests go back to its head
        self._prefill_first = False  # the last round left a prefill without tokens behind decode rows only

    # ----------------------------------------------------------------- membership
    def admit(self, req: Request) -> None:
        """``req`` (taken off the queue by the caller) runs from now on."""
        self.members.append(req)
        req.start_running()

    def discard(self, req: Request) -> bool:
        """Removes a finishing ``req``; whether it was running."""
        if req in self.members:
            self.members.remove(req)
            return True
        return False

    def preempt(self, req: Request) -> None:
        """``req`` goes back to the head of the queue (its partners first, policy pair) and will
        recompute from scratch."""
        self.roll_back_partners(req)
        self._back_to_waiting(req, preempted=True)

    def requeue_all(self) -> list[Request]:
        """Every running request goes back to the front of the queue, in admission order; returns them."""
        reqs = list(self.members)
        for req in reversed(reqs):
            if req.status is RequestStatus.RUNNING:  # a paired consumer may have gone back with its producer
                self.preempt(req)
        return reqs

    def roll_back_partners(self, producer: Request) -> None:
        """The producer leaves before its round committed: its running paired consumers go back to the
        head of the queue with nothing computed (their rows in the uncommitted plan are skipped at
        commit), and so do its riders (``riders.py``)."""
        cache = self._memory.cache
        if cache is None:
            return
        riders = self._riders.by_producer.take(producer.request_id) if self._riders is not None else ()
        for rid in (*cache.take_paired(producer.request_id), *riders):
            partner = next((r for r in self.members if r.request_id == rid), None)
            if partner is None:  # finished (a running request is always in the list)
                continue
            self.roll_back_partners(partner)  # a paired partner may have riders of its own
            self._back_to_waiting(partner, preempted=False)

    def _back_to_waiting(self, req: Request, *, preempted: bool) -> None:
        """Releases ``req``'s pages and slot, makes its rows in flight stale (a new epoch) and puts
        it at the head of the queue (``Request.requeue``: counted as a preemption or a roll-back)."""
        self._memory.release(req, keep_prefix=False)
        self.members.remove(req)
        if self._riders is not None:
            self._riders.by_producer.drop_partner(req.request_id)
        req.requeue(preempted=preempted)
        self._waiting.appendleft(req)

    def pages_come_back(self, req: Request) -> bool:
        """Whether a commit in flight can free pages for ``req``: a round of its own is in flight (its
        pending KV and checkpoint can pin pages of the tree that a restart would need), or a running
        request finishes there (its last token is in flight)."""
        return bool(req.uncommitted_tokens) or any(not computes(r) for r in self.members)

    # ----------------------------------------------------------------- rows of a round
    def plan_before_admission(self, round_: RoundBuilder) -> int:
        """Plans the running rows that come before admission, sets ``round_.num_computing`` and returns the
        row places held back for the decode rows that come after it (0 unless prefill first)."""
        prefill_first = round_.stats.prefill_first = self._prefill_first
        reserved = 0
        prefetch = getattr(round_.drafter, "prefetch", None)  # a model drafter drafts the round at once
        if prefetch is not None and round_.config.speculative is not None:
            prefetch([r.tokens for r in self.members if r.speculate and r.remaining == 1 and not r.unknown_tokens])
        if prefill_first:  # decode rows last this round: their rows are kept, their tokens are not
            reserved = sum(1 for r in self.members if r.remaining == 1 and computes(r))
            round_.budget = round_.budget.hold(reserved)
            self._plan(round_, decode=False)
        else:  # decode rows first: a running prompt earlier in the list must not take their tokens
            self._plan(round_, decode=True)
            self._plan(round_, decode=False)
        round_.num_computing = sum(1 for r in self.members if computes(r))
        return reserved

    def plan_after_admission(self, round_: RoundBuilder, reserved: int) -> None:
        """The decode rows of a prefill-first round; then whether the next round is prefill first (a
        prompt got no tokens and no row of this round computes more than one)."""
        if round_.stats.prefill_first:
            round_.budget = round_.budget.hold(-reserved)
            self._plan(round_, decode=True)
        self._prefill_first = round_.starved and all(len(r.tokens) <= 1 for r in round_.rows)

    def _plan(self, round_: RoundBuilder, decode: bool) -> None:
        """Rows for running requests in admission order, those with one token to compute (``decode``
        True) or more (False), preempting under page pressure (module docstring)."""
        stats = round_.stats
        scheduled = {r.request_id for r in round_.rows}
        for req in list(self.members):
            if req not in self.members:
                continue  # preempted while making room for an earlier one
            if not computes(req):
                continue
            if req.request_id in scheduled or (req.remaining == 1) is not decode:
                continue
            span = round_.span(req.num_computed, req.remaining) if round_.budget.rows > 0 else 0
            if span == 0:
                round_.note_starved(req.remaining)
                continue
            while not self._memory.ensure_pages(req, req.num_computed + span):
                if not self._preempt_one(req, scheduled):
                    if self.pages_come_back(req):  # wait for the commit in flight instead of a restart
                        stats.waited_for_pages += 1
                        break
                    self.preempt(req)
                    stats.preempted += 1
                    break
                stats.preempted += 1
                if req not in self.members:  # a victim's roll-back (pair) took it back to the queue too
                    break
            else:
                round_.add(req, span, None, draft=self._draft(req, span, round_))
                scheduled.add(req.request_id)

    def fill_drafts(self, plan: RoundPlan, slack: int, spec: SpeculativeConfig, drafter: Drafter | None) -> RoundPlan:
        """``plan`` with its verify rows' drafts lengthened, in row order, into ``slack`` padding
        token slots of the variant it runs in (computed anyway): each up to ``num_draft`` and its
        request's remaining tokens, where the same lookup offers more (a request's adapted draft
        length is the share it gets of a round's paid slots; padding slots cost nothing more). The
        token bucket, rows and verify points of the variant stay as they were."""
        rows, members = list(plan.rows), {r.request_id: r for r in self.members}
        for i, row in enumerate(rows):
            req = members.get(row.request_id)
            if slack <= 0 or not row.num_draft or req is None:
                continue
            k = min(spec.num_draft, row.num_draft + slack, req.max_tokens - len(req.output) - 1)
            longer = _lookup(req.tokens, k, spec, drafter)
            extra = longer[row.num_draft :] if longer[: row.num_draft] == row.tokens[-row.num_draft :] else ()
            end = row.start + len(row.tokens) + len(extra)
            need = self._memory.config.pages_for(end) - len(req.pages)
            if not extra or need > self._memory.pages.num_free or not self._memory.ensure_pages(req, end):
                continue
            rows[i] = dataclasses.replace(row, tokens=row.tokens + extra, pages=tuple(req.pages),
                                          num_draft=row.num_draft + len(extra))  # fmt: skip
            slack -= len(extra)
        return dataclasses.replace(plan, rows=tuple(rows))

    def _draft(self, req: Request, span: int, round_: RoundBuilder) -> tuple[int, ...]:
        """Speculative decoding: the tokens drafted after ``req``'s sampling span of ``span``
        tokens (``scheduler/drafts.py``), within its draft length, the tokens it may still sample
        after the span's own and the round's token budget; empty where it does not speculate, no
        draft was found, or its spare slot or the draft's pages could not be had (never preempting
        or evicting KV for a draft). No draft behind a token a round in flight samples, and on a
        hybrid model none behind a span of more than one token (the step keeps a verify row's state
        at its last accepted token only within its first drafted positions, ``runner/rollback.py``)."""
        spec = round_.config.speculative
        if spec is None or not req.speculate or span != req.remaining or req.unknown_tokens:
            return ()
        if round_.config.hybrid and span != 1:
            return ()
        k = min(req.draft_len or spec.num_draft, req.max_tokens - len(req.output) - 1, round_.budget.tokens - span)
        draft = _lookup(req.tokens, k, spec, round_.drafter) if k > 0 else ()
        if not draft or not self._memory.ensure_spare(req):
            return ()
        end = req.num_computed + span + len(draft)
        if self._memory.config.pages_for(end) > len(req.pages) and self._memory.pages.num_free < (
            self._memory.config.pages_for(end) - len(req.pages)
        ):
            return ()  # the draft's pages only from free ones: evicting cached KV for a guess does not pay
        return draft if self._memory.ensure_pages(req, end) else ()

    def _preempt_one(self, keep: Request, scheduled: set[int]) -> bool:
        """Preempts the latest-admitted running request that was admitted after ``keep`` and still
        computes, preferring one without a row in this round (``scheduled``); a victim's row leaves
        the plan at its end (``RoundBuilder.build`` drops rows of an older epoch). Decode rows are
        planned before prompts, so a newer decode row often has its row already when an older prompt
        runs short."""
        newer = [v for v in reversed(self.members[self.members.index(keep) + 1 :]) if computes(v)]
        victim = next((v for v in newer if v.request_id not in scheduled), newer[0] if newer else None)
        if victim is None:
            return False
        self.preempt(victim)
        return True


def _lookup(tokens: list[int], k: int, spec: SpeculativeConfig, drafter: Drafter | None) -> tuple[int, ...]:
    """Up to ``k`` drafted tokens after ``tokens``: the model drafter's, else the n-gram lookup's."""
    if drafter is not None:
        return drafter(tokens, k)[:k]
    return ngram_draft(tokens, k, max_n=spec.ngram_max, min_n=spec.ngram_min)


def computes(req: Request) -> bool:
    """False for a running request whose last token a round in flight samples (overlap): it needs
    no row and holds no place; it finishes at that round's commit."""
    return len(req.output) < req.max_tokens
