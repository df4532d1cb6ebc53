"""The scheduler: a coordinator that plans a round (running work first, then admissions) and commits
its result, over explicit collaborators that each own their state. No JAX here.

  * :class:`~radixflow_jax.scheduler.running.RunningSet` (``running.py``): the running requests,
    their rows, preemption under page pressure and the prefill-first rule;
  * :class:`~radixflow_jax.scheduler.pairing.Pairing` (``pairing.py``): policy ``pair``'s paired
    admission and cost-aware fill rule, with the executor's round cost model;
  * :class:`~radixflow_jax.scheduler.overlap.LaunchedRounds` (``overlap.py``): the rounds launched and not
    committed and the requests fenced until their commit (the overlap rules);
  * :class:`~radixflow_jax.scheduler.builder.RoundBuilder` (``builder.py``): one round being planned
    against its :class:`~radixflow_jax.scheduler.builder.Budget`, created by each ``schedule()``.

The coordinator owns the configuration, the pools and cache (:class:`Allocator`), the waiting queue,
the table of requests and the count of rounds committed, and runs the admission scan and the commit
fence. ``schedule()`` needs no device sync: it reads only host state. The admission scan asks, for
each waiting request in queue order, for a :class:`Decision`; the policy changes only the answer
for a consumer of a pending checkpoint. ``commit()`` is the commit fence: it marks the round's
checkpoints committed, appends sampled tokens (or fills in those a launched round left unknown, in
launch order), finishes and releases requests.

Invariants (the admission scan's; the others are stated by the collaborator that enforces them):
  * A request never reads a pending checkpoint: ``copy_from`` is always a committed slot of a node
    the request locked, or (a verify row, ``scheduler/drafts.py``) the request's own slot, which its
    row does not write (it writes the spare slot).
  * Liveness: with nothing running, the head of the queue is admitted from its committed hit or a
    cold prefill, or failed with a clear reason if it can never fit (``add`` refuses what cannot;
    a head that cannot get memory flushes the cache). No admission takes the pages a running
    request waits for (``RoundStats.waited_for_pages``), so a stream of arrivals cannot starve it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence

from radixflow_jax.cache import HostPool, PagePool, RadixCache, SlotPool
from radixflow_jax.scheduler.admission import Decision, get_policy
from radixflow_jax.scheduler.allocator import Allocator
from radixflow_jax.scheduler.builder import RoundBuilder
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.drafts import Drafter, accepted_length, kept_tokens, next_draft_len, verified_tokens
from radixflow_jax.scheduler.overlap import LaunchedRounds
from radixflow_jax.scheduler.pairing import Pairing
from radixflow_jax.scheduler.plan import RoundPlan, RowPlan
from radixflow_jax.scheduler.hostreads import from_host
from radixflow_jax.scheduler.request import Request, RequestStatus
from radixflow_jax.scheduler.riders import Riders
from radixflow_jax.scheduler.running import RunningSet


class Scheduler:
    """``num_host_slots`` / ``num_host_pages``: the host tier's capacity in checkpoints and in KV
    pages (``cache/tiers.py``, ``cache/hostkv.py``; 0: none)."""

    def __init__(
        self, config: SchedulerConfig, num_pages: int, num_slots: int, *, num_host_slots: int = 0,
        num_host_pages: int = 0,
    ):
        self.config = config
        self.policy = get_policy(config.policy)
        cache_cfg = config.cache_config  # the model's geometry (derived once, EngineSpec.cache_config)
        pages = PagePool(num_pages)
        slots = SlotPool(num_slots, request_slots=config.max_num_seqs) if config.hybrid else None
        caching = self.policy.use_cache  # policy no-cache: no radix cache
        host = HostPool(num_host_slots + 1) if num_host_slots > 0 and config.hybrid else None
        host_pages = HostPool(num_host_pages + 1) if num_host_pages > 0 else None
        cache = RadixCache(cache_cfg, pages, slots, host_pool=host, host_page_pool=host_pages) if caching else None
        self.memory = Allocator(cache_cfg, pages, slots, cache)
        self.waiting: collections.deque[Request] = collections.deque()
        self.requests: dict[int, Request] = {}
        self.round_index = 0  # rounds committed
        self._riders = Riders(config, self.memory)
        self._running = RunningSet(self.memory, self.waiting, self._riders)
        self._pairing = Pairing(config, self.memory)
        self._launched = LaunchedRounds(config, self.memory)
        # speculative decoding (engine/build.py sets them): the token slots of the variant a plan runs in,
        # whose padding drafts fill (RunningSet.fill_drafts; None: none), and a model drafter (None: n-grams)
        self.pad_tokens: Callable[[RoundPlan], int] | None = None
        self.drafter: Drafter | None = None

    # ----------------------------------------------------------------- views
    @property
    def running(self) -> list[Request]:
        """The running requests in admission order (read-only: the running set owns the list)."""
        return self._running.members

    @property
    def round_cost(self) -> Callable[[Sequence[RowPlan]], float] | None:
        """Policy pair's fill rule: seconds a round of these rows takes (the executor's round cost
        model); ``None``: no cost model wired, pair fills like radixflow. Settable."""
        return self._pairing.round_cost

    @round_cost.setter
    def round_cost(self, cost: Callable[[Sequence[RowPlan]], float] | None) -> None:
        self._pairing.round_cost = cost

    @property
    def num_in_flight(self) -> int:
        """Rounds launched and not committed."""
        return len(self._launched)

    @property
    def restores_in_flight(self) -> tuple[int, ...]:
        """Restores (``cache/tiers.py``) that launched rounds carry and whose commit is to come."""
        return self._launched.restores

    @property
    def fenced(self) -> tuple[Request, ...]:
        """Finished requests whose pages and slot wait for the commit fence of a round in flight."""
        return self._launched.fenced

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
        return self._running.requeue_all()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ----------------------------------------------------------------- planning
    def schedule(self) -> RoundPlan:
        """Plans one round: running requests, then admissions in queue order."""
        round_ = RoundBuilder(self.config, self.memory, self.waiting, self.drafter)
        reserved = self._running.plan_before_admission(round_)
        # a running request waits for pages a commit in flight frees: admissions must not take them
        round_.stats.stopped_by_memory = round_.stats.waited_for_pages > 0
        admitted = self._admit(round_) if not round_.stats.stopped_by_memory else []
        self._running.plan_after_admission(round_, reserved)
        plan = round_.build(admitted=sum(1 for req, epoch in admitted if req.epoch == epoch))
        spec, pad = self.config.speculative, self.pad_tokens
        if spec is not None and pad is not None and plan.num_drafted:
            plan = self._running.fill_drafts(plan, pad(plan) - plan.num_tokens, spec, self.drafter)
        return plan

    def _order(self) -> list[Request]:
        queue = list(self.waiting)
        cache = self.memory.cache
        if self.config.queue_order == "lpm" and cache is not None:
            hits = {r.request_id: cache.match(r.tokens, touch=False, shared=False).hit_len for r in queue}
            queue.sort(key=lambda r: -hits[r.request_id])  # stable: FCFS among equals
        return queue

    def _admit(self, round_: RoundBuilder) -> list[tuple[Request, int]]:
        """The admission scan; returns the requests admitted, with the epoch each was admitted in."""
        stats, queue = round_.stats, self._order()
        admitted: list[tuple[Request, int]] = []
        skipped_consumer = False
        for i, req in enumerate(queue):
            if skipped_consumer and self.policy.fill:
                following = queue[i + 1 : i + 1 + 4 * self.config.max_num_seqs]  # what a fill's group may take
                if not self._pairing.fill_pays(req, round_, following):
                    stats.fill_declined += 1
                    continue
            paired = stats.consumers_paired
            decision = self._decide(req, round_)
            if decision is Decision.WAIT or stats.consumers_paired > paired:
                skipped_consumer = True  # native would have stopped the scan here: what follows is fill
            if decision is Decision.ADMIT:
                round_.num_computing += 1
                self.waiting.remove(req)
                self._running.admit(req)
                round_.note_running(req)
                admitted.append((req, req.epoch))
            elif decision is Decision.WAIT:
                continue
            elif decision is Decision.STOP_ROUND:
                if stats.stopped_by_consumer:
                    round_.count_bubble(queue[i + 1 :])
                break
            else:
                stats.stopped_by_memory = True
                if not round_.rows and not self.running:
                    self.memory.flush()  # nothing runs, the head gets no memory: admit it next
                break
        return admitted

    def _decide(self, req: Request, round_: RoundBuilder) -> Decision:
        cache, memory, cfg = self.memory.cache, self.memory, self.config
        if round_.budget.rows == 0 or round_.num_computing >= self.config.max_num_seqs:
            return Decision.STOP_ROUND  # a running request that got no row this round still holds its place
        ride = self._riders.decide(req, round_, self.running, wait=self.policy.consumer is not Decision.STOP_ROUND)
        if ride is not None:
            return ride
        match = cache.match(req.tokens, shared=False) if cache is not None else None
        if match is not None and (match.host_node is not None or match.host_kv):  # scheduler/hostreads.py
            outcome, match = from_host(req, match, round_, memory)
            if outcome is not None:
                return Decision.ADMIT if outcome == "admit" else self._hold(round_)
        # attention-only models see pending KV only from rounds in flight (overlap, see overlap.py)
        if match is not None and match.is_consumer:
            decision = self._consumer(req, match, round_)
            if decision is not None:
                return decision
        hit = match.hit_len if match is not None else 0
        span = round_.span(hit, req.num_tokens - hit)
        if span == 0:
            round_.note_starved(req.num_tokens - hit)
            return Decision.STOP_ROUND
        hit_node = match.hit_node if match is not None and hit > 0 else None
        hit_pages = match.hit_pages if hit_node is not None else ()
        tail_page = match.hit_tail_page if hit_node is not None else None
        if not memory.seat(req, computed=hit, end=hit + span, hit_node=hit_node, hit_pages=hit_pages, slot=cfg.hybrid):
            return Decision.STOP_UNTIL_FREE
        copy_from = None
        branch_len = None
        if match is not None and cfg.hybrid:
            if hit > 0:
                copy_from = cache.read_checkpoint(match.hit_node)
            if cfg.branch_checkpoints:  # where this path leaves an existing or pending one
                branch_len = cache.shared_len(req.tokens)
        round_.add(req, span, copy_from, branch_len, copy_page_from=tail_page)
        return Decision.ADMIT

    def _consumer(self, req: Request, match, round_: RoundBuilder) -> Decision | None:
        """The policy's answer for consumer ``req`` (pair first tries to pair it); ``None``: it
        waited long enough (``max_consumer_wait``) and is admitted like any other request."""
        round_.stats.restore_waits += req.restore_node is not None
        if self.policy.pair:
            decision = self._pairing.pair(req, match, self.requests.get(match.producer_id), round_)
            if decision is not None:
                return decision
        return self._wait(req, round_)

    def _wait(self, req: Request, round_: RoundBuilder) -> Decision | None:
        """``req`` waits for state another round is producing or restoring (:meth:`_hold`); ``None``
        once it waited ``max_consumer_wait`` rounds (it is then admitted like any other request)."""
        if req.consumer_waits >= self.config.max_consumer_wait:
            return None
        req.count_consumer_wait()
        return self._hold(round_)

    def _hold(self, round_: RoundBuilder) -> Decision:
        """A request waits as the policy says (``native`` stops, ``radixflow`` and ``pair`` skip it).
        Unbounded for a slot to restore into (queue order; it ends once something pending commits):
        a bound would make a burst of returning conversations wait it out and recompute it all."""
        if self.policy.consumer is Decision.STOP_ROUND:
            round_.stats.consumers_blocked += 1
            round_.stats.stopped_by_consumer = True
        else:
            round_.stats.consumers_waiting += 1
        return self.policy.consumer

    # ----------------------------------------------------------------- overlap
    def launch(self, plan: RoundPlan) -> None:
        """The host side of a round whose result is not known yet (overlap, ``overlap.py``): each
        row's request advances past its span and a sampling row appends ``UNKNOWN_TOKEN``.
        ``commit(plan, ...)`` must follow, in launch order."""
        self._launched.launch(plan, self.requests, self.round_index)

    def plants_on_unknown(self) -> bool:
        """Whether some running request's next decode row would plant a checkpoint on a path that ends
        in a token a round in flight samples (the engine then commits that round before planning)."""
        return self._launched.plants_on_unknown(self.running)

    def drop_in_flight(self) -> None:
        """A launched round failed: every round in flight is void. Releases the fenced requests; the
        caller requeues the running ones (``requeue_running``), which drops their uncommitted work."""
        self._launched.drop()

    # ----------------------------------------------------------------- commit fence
    def commit(
        self, plan: RoundPlan, sampled: dict[int, int], verified: Mapping[int, tuple[int, ...]] | None = None
    ) -> list[Request]:
        """Applies a finished round: advance, append samples, commit checkpoints, finish requests.
        Returns the requests that finished in this round. A launched plan (``launch``) commits in
        launch order; its samples replace the ``UNKNOWN_TOKEN`` entries. ``verified``: the greedy
        tokens of its verify rows (``StepResult.verified``, speculative decoding)."""
        launched = self._launched.retire(plan)
        self._riders.committed(plan.rows)
        self.round_index += 1
        for restore in plan.restores:  # the round copied them before its step: readable now
            if self.memory.cache is not None:
                self.memory.cache.commit(restore)
        finished = []
        for row in plan.rows:
            req = self.requests.get(row.request_id)
            if req is None or req.status is not RequestStatus.RUNNING or row.epoch != req.epoch:
                continue  # aborted, preempted, or rolled back with its aborted producer, while the round ran
            if row.num_draft:
                if self._commit_verify(req, row, sampled[row.request_id], (verified or {})[row.request_id], launched):
                    finished.append(req)
            elif self._commit_row(req, row, sampled, launched):
                finished.append(req)
        self._launched.release_due(self.round_index)
        return finished

    def _commit_row(self, req: Request, row: RowPlan, sampled: dict[int, int], launched: bool) -> bool:
        """Commits ``req``'s row; whether the request finished with it."""
        cache = self.memory.cache
        end = row.start + len(row.tokens)
        req.commit_span(row.start, end, launched=launched)
        if cache is not None:
            cache.commit(req.request_id, end)  # later rounds' checkpoints (deeper) stay pending
            if not self.config.hybrid:
                cache.insert(req.tokens[:end], req.pages)
        if not row.sample:
            return False
        token = sampled[row.request_id]
        req.commit_token(token, end, launched=launched, round_index=self.round_index)
        if token in req.stop_token_ids:
            self._finish(req, "stop", keep_prefix=True)
        elif len(req.output) - req.unknown_tokens >= req.max_tokens:
            self._finish(req, "length", keep_prefix=True)
        return req.is_finished

    def _commit_verify(self, req: Request, row: RowPlan, bonus: int, verified: tuple[int, ...], launched: bool) -> bool:
        """Commits ``req``'s verify row (``scheduler/drafts.py``): the accepted drafted tokens and
        the model's next token, cut at a stop token or ``max_tokens``; whether it finished. A
        hybrid request's spare slot holds the state after its last accepted token
        (``runner/rollback.py``): it becomes the request's slot unless a cut dropped accepted
        tokens (the request then finishes with its state from before the row); an attention-only
        request keeps the KV of every kept token it fed."""
        draft = row.tokens[len(row.tokens) - row.num_draft :]
        accepted = accepted_length(draft, verified)
        new = verified_tokens(draft, verified, bonus)
        kept = kept_tokens(new, req.max_tokens - (len(req.output) - req.unknown_tokens), req.stop_token_ids)
        whole = len(kept) == len(new)
        if self.config.hybrid:
            if len(row.tokens) != row.num_draft + 1:
                raise RuntimeError(f"request {req.request_id}: a hybrid verify row feeds one known token and a draft")
            computed = row.known_end + accepted if whole else row.start
        else:
            computed = row.known_end + min(accepted, len(kept) - 1)
        spec = self.config.speculative
        limit = spec.num_draft if spec is not None else row.num_draft
        req.commit_verify(
            start=row.start, end=row.start + len(row.tokens), tokens=kept, computed=computed,
            swap=whole and req.spare_slot is not None, drafted=row.num_draft, accepted=accepted,
            draft_len=next_draft_len(row.num_draft, accepted, limit), launched=launched, round_index=self.round_index,
        )
        if self.memory.cache is not None:
            self.memory.cache.commit(req.request_id, computed)
            if not self.config.hybrid:
                self.memory.cache.insert(req.tokens[:computed], req.pages)
        if kept[-1] in req.stop_token_ids:
            self._finish(req, "stop", keep_prefix=True)
        elif len(req.output) >= req.max_tokens:
            self._finish(req, "length", keep_prefix=True)
        return req.is_finished

    def finish(self, request_id: int, reason: str) -> None:
        """Ends a request for a reason the engine found (e.g. a stop string)."""
        req = self.requests[request_id]
        if not req.is_finished:
            self._finish(req, reason, keep_prefix=True)

    def truncate_output(self, request_id: int, num_output: int) -> None:
        """Keeps the first ``num_output`` output tokens of a request whose verify row committed
        tokens past a stop string the engine found (``Request.truncate_output``)."""
        self.requests[request_id].truncate_output(num_output)

    def amend_finish_reason(self, request_id: int, reason: str) -> None:
        """A request that finished in its last round (e.g. by length) ended another way too (the
        engine found a stop string or the grammar completed): ``reason`` replaces its reason."""
        self.requests[request_id].amend_finish_reason(reason)

    def forget(self, request_id: int) -> None:
        """Drops a finished request from the table (``ValueError`` while it still runs)."""
        req = self.requests.get(request_id)
        if req is not None and not req.is_finished:
            raise ValueError(f"request {request_id} is still running")
        self.requests.pop(request_id, None)

    def _finish(self, req: Request, reason: str, *, keep_prefix: bool) -> None:
        """Finishes ``req``: its partners roll back (policy pair, riders), what rounds in flight compute
        for it is discarded at their commit, and it is released (at once, or at the commit fence of
        its last launched round)."""
        self._running.roll_back_partners(req)
        self._riders.by_producer.drop_partner(req.request_id)
        req.finish(reason)
        self._launched.release(req, self.round_index, keep_prefix=keep_prefix)
        if not self._running.discard(req) and req in self.waiting:
            self.waiting.remove(req)
