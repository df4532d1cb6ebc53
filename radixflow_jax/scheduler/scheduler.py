"""The scheduler: plans a round (running work first, then admissions) and commits its result.

``schedule()`` needs no device sync: it reads only host state. The admission scan asks, for each
waiting request in queue order, for a :class:`Decision`; the policy changes only the answer for a
consumer of a pending checkpoint. ``commit()`` is the commit fence: it marks the round's
checkpoints committed, appends sampled tokens, finishes and releases requests.

Overlap (the engine plans round r+1 while the device runs round r): ``launch(plan)`` applies the
host side of a round before its result exists (``num_computed`` advances, a sampling row appends
``UNKNOWN_TOKEN``), so the next ``schedule()`` plans from there; ``commit`` then fills in the sampled
tokens, in launch order. Round r's checkpoints stay pending for the plan of r+1 (they commit at r's
fence, depth by depth). A request that finishes or is aborted while a launched round still holds a
row of it is released at that round's commit fence, never before. A preempted or rolled-back request
is released at once: its rows in flight are stale (skipped at commit by their epoch), and a page or
slot given to another row can only be written by a later round, which the device runs after the
rounds in flight (the pools are threaded from one step into the next).

Invariants:
  * Every span starts at a multiple of the grid ``G`` except decode spans, and every span that does
    not end the known tokens ends on the grid, so checkpoint depths (multiples of ``G``) are chunk
    boundaries inside spans.
  * A request never reads a pending checkpoint: ``copy_from`` is always a committed slot of a node
    the request locked.
  * Liveness: with nothing running, the head of the queue is admitted from its committed hit or a
    cold prefill, or failed with a clear reason if it can never fit. A round that gives a prompt
    (running or waiting) no tokens while every row of it computes one token is followed by a
    prefill-first round: prompts are planned before the decode rows, which keep their rows and take
    the tokens left (a decode row skips that round if none are). So a budget of one grid cannot
    starve prompts behind decode rows. Under page pressure a request whose last token is in flight
    is never preempted (it frees its pages at that commit), and a request with no victim waits for
    a commit in flight that can free pages for it rather than restart (``running.py``); no
    admission takes those pages meanwhile, so a stream of arrivals cannot starve it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence

from radixflow_jax.cache import CacheConfig, PagePool, RadixCache, SlotPool
from radixflow_jax.scheduler.admission import Decision, get_policy
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.lookahead import LookaheadConfig, WaitingIndex, placements
from radixflow_jax.scheduler.memory import Memory
from radixflow_jax.scheduler.overlap import OverlapMixin
from radixflow_jax.scheduler.pairing import PairingMixin
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan
from radixflow_jax.scheduler.request import Request, RequestStatus, drop_in_flight
from radixflow_jax.scheduler.running import RunningMixin


class Scheduler(RunningMixin, PairingMixin, OverlapMixin):
    def __init__(self, config: SchedulerConfig, num_pages: int, num_slots: int):
        self.config = config
        self.policy = get_policy(config.policy)
        cache_cfg = CacheConfig(page_size=config.page_size, grid=config.grid, hybrid=config.hybrid)
        pages = PagePool(num_pages)
        slots = SlotPool(num_slots) if config.hybrid else None
        caching = config.enable_prefix_cache and self.policy.use_cache
        cache = RadixCache(cache_cfg, pages, slots) if caching else None
        self.memory = Memory(cache_cfg, pages, slots, cache)
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.requests: dict[int, Request] = {}
        self.round_index = 0  # rounds committed
        self._in_flight: collections.deque[RoundPlan] = collections.deque()  # launched, not committed
        self._fenced: list[tuple[Request, bool]] = []  # finished requests released at a later fence
        self._waiting_index = WaitingIndex(config.grid)  # this round's waiting, by first grid (empty between rounds)
        self._starved = False  # the last round left a prefill without tokens behind decode rows only
        self._active = 0  # while planning: running requests that still compute, capped at max_num_seqs
        self._lookahead = LookaheadConfig(
            config.grid, config.hybrid, config.branch_checkpoints, config.checkpoint_interval, config.max_checkpoints
        )
        # policy pair's fill rule: seconds a round of these rows takes (the executor's round cost
        # model); None: no cost model wired, pair fills like radixflow
        self.round_cost: Callable[[Sequence[RowPlan]], float] | None = None

    # ----------------------------------------------------------------- queue management
    def max_request_tokens(self) -> int:
        """The longest request (prompt + max_tokens) the pools can hold with nothing else running."""
        return self.memory.pages.capacity * self.config.page_size

    def add(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id} is already in use")
        if not req.prompt:
            raise ValueError("the prompt is empty")
        if len(req.prompt) + req.max_tokens > self.max_request_tokens():
            raise ValueError(
                f"prompt ({len(req.prompt)} tokens) + max_tokens ({req.max_tokens}) exceeds the KV pool's "
                f"{self.max_request_tokens()} tokens"
            )
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def abort(self, request_id: int) -> Request | None:
        req = self.requests.get(request_id)
        if req is None or req.is_finished:
            return None
        self._finish(req, "abort", keep_prefix=False)
        return req

    def requeue_running(self) -> list[Request]:
        """The device state of every running request was lost (a failed step): each goes back to the
        front of the waiting queue, in admission order, holding nothing, and recomputes its tokens
        (prompt and output so far) like a preempted request. Returns them."""
        reqs = list(self.running)
        for req in reversed(reqs):
            if req.status is RequestStatus.RUNNING:  # a paired consumer may have gone back with its producer
                self._preempt(req)
        return reqs

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ----------------------------------------------------------------- planning
    def _span(self, start: int, remaining: int, budget: int) -> int:
        """Tokens to compute from ``start``: all of them if they fit, else up to the last grid
        position within the budget (0 if none)."""
        if remaining <= budget:
            return remaining
        g = self.config.grid
        return max(0, (start + budget) // g * g - start)

    def _row(
        self, req: Request, span: int, copy_from: int | None, stats: RoundStats, branch_len: int | None = None,
        pair_slot: int | None = None,
    ) -> RowPlan:  # fmt: skip
        start = req.num_computed
        wanted = placements(self._lookahead, req, start, start + span, branch_len, self._waiting_index)
        if req.unresolved and start + span > req.num_tokens - req.unresolved:
            # the span holds a token of a round in flight: no tree path can name it yet (the engine
            # commits that round first when a checkpoint falls here, see plants_on_unknown)
            planted, skipped = [], len(wanted)
        else:
            planted, skipped = self.memory.plant(req, wanted)
        stats.checkpoints_planted += len(planted)
        stats.checkpoints_skipped += skipped
        return RowPlan(
            request_id=req.request_id,
            tokens=req.token_span(start, start + span),
            start=start,
            pages=tuple(req.pages),
            slot=req.slot or 0,
            copy_from=copy_from,
            emits=tuple((depth - start, slot) for depth, slot in planted),
            sample=start + span == req.num_tokens,
            pair_slot=pair_slot,
            epoch=req.epoch,
        )

    def _order(self) -> list[Request]:
        queue = list(self.waiting)
        cache = self.memory.cache
        if self.config.queue_order == "lpm" and cache is not None:
            hits = {r.request_id: cache.match(r.tokens, touch=False, shared=False).hit_len for r in queue}
            queue.sort(key=lambda r: -hits[r.request_id])  # stable: FCFS among equals
        return queue

    def _decide(self, req: Request, budget: list[int], rows: list[RowPlan], stats: RoundStats) -> Decision:
        cache, memory = self.memory.cache, self.memory
        if budget[1] == 0 or self._active >= self.config.max_num_seqs:
            return Decision.STOP_ROUND  # a running request that got no row this round still holds its place
        match = cache.match(req.tokens, shared=False) if cache is not None else None
        # attention-only models see pending KV only from rounds in flight (overlap), see _publish_in_flight_kv
        if match is not None and match.is_consumer:
            if self.policy.pair:
                decision = self._pair(req, match, budget, rows, stats)
                if decision is not None:
                    return decision
            if req.consumer_waits < self.config.max_consumer_wait:
                req.consumer_waits += 1
                if self.policy.consumer is Decision.STOP_ROUND:
                    stats.consumers_blocked += 1
                    stats.stopped_by_consumer = True
                else:
                    stats.consumers_waiting += 1
                return self.policy.consumer
        hit = match.hit_len if match is not None else 0
        span = self._span(hit, req.num_tokens - hit, budget[0])
        if span == 0:
            self._note_starved(req.num_tokens - hit)
            return Decision.STOP_ROUND
        if match is not None and hit > 0:
            cache.lock(match.hit_node)
            req.hit_node = match.hit_node
            req.pages = list(match.hit_pages)
        slot = memory.alloc_slot() if self.config.hybrid else None
        if (self.config.hybrid and slot is None) or not memory.ensure_pages(req, hit + span):
            if slot is not None:
                memory.slots.decref(slot)
            memory.release(req, keep_prefix=False)
            return Decision.STOP_UNTIL_FREE
        req.slot = slot
        req.num_computed = req.cached_tokens = hit
        copy_from = None
        branch_len = None
        if match is not None and self.config.hybrid:
            if hit > 0:
                copy_from = cache.read_checkpoint(match.hit_node)
            if self.config.branch_checkpoints:  # where this path leaves an existing or pending one
                branch_len = cache.shared_len(req.tokens)
        rows.append(self._row(req, span, copy_from, stats, branch_len))
        budget[0] -= span
        budget[1] -= 1
        return Decision.ADMIT

    def _shadow(self, queue: Iterable[Request], budget: list[int], stats: RoundStats) -> None:
        """Counts what non-consumers behind a consumer stop could have brought (the bubble). Looks at
        no more than ``4 * max_num_seqs`` requests: an estimate, bounded so planning stays cheap."""
        tokens, rows = budget[0], budget[1]
        cache = self.memory.cache
        for seen, req in enumerate(queue):
            if rows == 0 or tokens == 0 or seen >= 4 * self.config.max_num_seqs:
                break
            match = cache.match(req.tokens, touch=False, shared=False) if cache is not None else None
            if match is not None and match.is_consumer:
                continue
            hit = match.hit_len if match is not None else 0
            span = self._span(hit, req.num_tokens - hit, tokens)
            if span:
                stats.shadow_tokens += span
                stats.shadow_rows += 1
                tokens -= span
                rows -= 1

    def schedule(self) -> RoundPlan:
        """Plans one round: running requests, then admissions in queue order."""
        cfg = self.config
        stats = RoundStats()
        rows: list[RowPlan] = []
        budget = [cfg.max_num_batched_tokens, cfg.max_num_seqs]
        evicted = (self.memory.evicted_pages, self.memory.evicted_slots)
        unused = self.memory.cache.evicted_unused if self.memory.cache is not None else 0
        looks_ahead = cfg.hybrid and cfg.branch_checkpoints and self.memory.cache is not None
        self._waiting_index = WaitingIndex(cfg.grid, tuple(self.waiting) if looks_ahead else ())  # this round's queue
        reserved = self._running_before_admission(rows, budget, stats)
        # a running request waits for pages a commit in flight frees: admissions must not take them
        stats.stopped_by_memory = stats.waited_for_pages > 0
        queue = self._order() if not stats.stopped_by_memory else []
        admitted: list[tuple[Request, int]] = []  # with the epoch each was admitted in
        skipped_consumer = False
        for i, req in enumerate(queue):
            if skipped_consumer and self.policy.pair:
                following = queue[i + 1 : i + 1 + 4 * cfg.max_num_seqs]  # what a fill's group may take
                if not self._fill_pays(req, rows, budget, following):
                    stats.fill_declined += 1
                    continue
            paired = stats.consumers_paired
            decision = self._decide(req, budget, rows, stats)
            if decision is Decision.WAIT_LOCAL or stats.consumers_paired > paired:
                skipped_consumer = True  # native would have stopped the scan here: what follows is fill
            if decision is Decision.ADMIT:
                self._active += 1
                self.waiting.remove(req)
                self.running.append(req)
                req.status = RequestStatus.RUNNING
                admitted.append((req, req.epoch))
            elif decision is Decision.WAIT_LOCAL:
                continue
            elif decision is Decision.STOP_ROUND:
                if stats.stopped_by_consumer:
                    self._shadow(queue[i + 1 :], budget, stats)
                break
            else:
                stats.stopped_by_memory = True
                if not rows and not self.running:
                    self._unblock(req)
                break
        self._running_after_admission(rows, budget, stats, reserved)
        stats.evicted_pages = self.memory.evicted_pages - evicted[0]
        stats.evicted_slots = self.memory.evicted_slots - evicted[1]
        if self.memory.cache is not None:
            stats.checkpoints_evicted_unused = self.memory.cache.evicted_unused - unused
        self._waiting_index = WaitingIndex(self.config.grid)
        if stats.preempted:  # a victim, or a partner its roll-back took, may have had a row in this plan
            rows = [r for r in rows if r.epoch == self.requests[r.request_id].epoch]
            stats.checkpoints_planted = sum(len(r.emits) for r in rows)  # a victim's were unpublished
        stats.admitted = sum(1 for req, epoch in admitted if req.epoch == epoch)
        rows.sort(key=lambda r: not r.is_decode)  # one-token rows first (stable)
        num_decode = sum(1 for r in rows if r.is_decode)
        return RoundPlan(rows=tuple(rows), num_decode=num_decode, stats=stats)

    def _unblock(self, req: Request) -> None:
        """Nothing runs and the head cannot get memory: flush the cache so the next round admits it
        (``add`` refused requests that could never fit, so this always makes progress)."""
        self.memory.flush()

    # ----------------------------------------------------------------- commit fence
    def commit(self, plan: RoundPlan, sampled: dict[int, int]) -> list[Request]:
        """Applies a finished round: advance, append samples, commit checkpoints, finish requests.
        Returns the requests that finished in this round. A launched plan (``launch``) commits in
        launch order; its samples replace the ``UNKNOWN_TOKEN`` entries."""
        launched = bool(self._in_flight) and self._in_flight[0] is plan
        if launched:
            self._in_flight.popleft()
        elif self._in_flight:
            raise ValueError("commit of a plan that is not the oldest round in flight")
        self.round_index += 1
        finished = []
        cache = self.memory.cache
        for row in plan.rows:
            req = self.requests.get(row.request_id)
            if req is None or req.status is not RequestStatus.RUNNING or row.epoch != req.epoch:
                continue  # aborted, preempted, or rolled back with its aborted producer, while the round ran
            end = row.start + len(row.tokens)
            if launched:
                req.in_flight -= len(row.tokens)
            else:
                req.num_computed = end
            if cache is not None:
                cache.commit(req.request_id, end)  # later rounds' checkpoints (deeper) stay pending
                if not self.config.hybrid:
                    cache.insert(req.tokens[:end], req.pages)
            if not row.sample:
                continue
            token = sampled[row.request_id]
            if launched:
                req.output[end - len(req.prompt)] = token
                req.unresolved -= 1
            else:
                req.output.append(token)
            if req.first_token_round is None:
                req.first_token_round = self.round_index
            if token in req.stop_token_ids:
                self._finish(req, "stop", keep_prefix=True)
            elif len(req.output) - req.unresolved >= req.max_tokens:
                self._finish(req, "length", keep_prefix=True)
            if req.is_finished:
                finished.append(req)
        if self._fenced:
            fenced, self._fenced = self._fenced, []
            for req, keep_prefix in fenced:
                if req.fence < self.round_index:
                    self.memory.release(req, keep_prefix=keep_prefix)
                else:
                    self._fenced.append((req, keep_prefix))
        return finished

    def finish(self, request_id: int, reason: str) -> None:
        """Ends a request for a reason the engine found (e.g. a stop string)."""
        req = self.requests[request_id]
        if not req.is_finished:
            self._finish(req, reason, keep_prefix=True)

    def _finish(self, req: Request, reason: str, *, keep_prefix: bool) -> None:
        self._roll_back_partners(req)
        drop_in_flight(req)  # what rounds in flight compute for it is discarded at their commit
        if req.fence >= self.round_index:
            self._fenced.append((req, keep_prefix))  # a launched round still uses its pages and slot
        else:
            self.memory.release(req, keep_prefix=keep_prefix)
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status, req.finish_reason = RequestStatus.FINISHED, reason
