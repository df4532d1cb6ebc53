"""The engine loop (docs/design.md, "One round"): plan a round -> build arrays -> run the step -> commit.

:class:`EngineCore` is single-threaded and step-driven: ``add_request`` (``check`` + ``add``) /
``abort`` / ``step``. ``replicas/background.py`` runs it on a thread for servers and streaming
clients. A request is checked once, by ``check`` (``engine/intake.py``), and its engine-side state
is one :class:`~radixflow_jax.engine.record.RequestRecord` (sampling row, output, detokeniser,
failures) in one table. The executor's capabilities (``engine/protocol.py``) are read once, here.
Every round leaves a :class:`RoundRecord` (slots, padding, bubbles, consumers, timings) in ``records``.

Failure recovery (``docs/reliability.md``, ``engine/recovery.py``): a round whose step raises is not
committed. The step may have consumed the donated pools, so the executor rebuilds them, the radix
cache is flushed (its pages and checkpoints lived there) and every running request recomputes from
its tokens so far; a request in more than ``step_retries`` failed rounds in a row ends with
``finish_reason='error'`` and the error text. An ``AssertionError`` (a broken invariant) or an
exception whose class sets ``recoverable = False`` (the compile guard) is a bug, not a device error:
it propagates. When recovery itself fails, or ``max_failed_rounds`` rounds fail in a row,
:class:`EngineFailure` is raised: the engine cannot serve and its owner must fail what is in flight.

Overlap (``overlap=True`` and an executor whose capabilities offer it): ``step`` plans and launches
round r+1 while the device runs round r, then collects and commits r (the scheduler's ``launch`` /
``commit``, see ``scheduler/scheduler.py``). Each ``step`` still commits one round and returns its
outputs; one round stays in flight between calls (``has_unfinished`` counts it). Round
r is committed before planning r+1 when r+1 could not be planned without r's tokens on the host: a
penalised request (its penalty context), a constrained one (structured outputs: its mask for r+1
comes from its matcher after r's token, so it never has two rounds in flight), or a checkpoint
that would be planted on a path ending in one of r's samples. A failed round voids the round launched after it (recovered as one failure).
The shadow executor and the simulated one run synchronously (the simulated one models overlap's
decisions when built with ``overlap=True``, as the mirror of an overlapped model engine is).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Callable, Sequence, cast

from radixflow_jax.engine.config import EngineFailure, RoundRecord, ServingClock
from radixflow_jax.engine.grammar import GrammarCompiler, GrammarState, has_grammar
from radixflow_jax.engine.intake import CheckedRequest, RequestLimits
from radixflow_jax.engine.params import RequestOutput, SamplingParams
from radixflow_jax.engine.protocol import Executor, LaunchHandle, OverlapExecutor, PromptLogprob, StepResult
from radixflow_jax.engine.record import RequestRecord, SamplingRows
from radixflow_jax.engine.recovery import failure_text, is_fatal, rebuild
from radixflow_jax.engine.siblings import expand, is_group, sample_limit
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.plan import RoundPlan
from radixflow_jax.scheduler.request import Request
from radixflow_jax.scheduler.scheduler import Scheduler

log = logging.getLogger(__name__)


class EngineCore:
    def __init__(
        self,
        executor: Executor,
        sched_config: SchedulerConfig,
        *,
        num_pages: int,
        num_slots: int,
        max_model_len: int,
        eos_token_ids: Sequence[int] = (),
        tokenizer: object | None = None,
        seed: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        vocab_size: int | None = None,
        wiring: object | None = None,
        step_retries: int = 1,
        max_failed_rounds: int = 3,
        overlap: bool = True,
        max_n: int | None = None,
    ):
        if step_retries < 0 or max_failed_rounds < 1:
            raise ValueError(f"step_retries={step_retries} must be >= 0, max_failed_rounds={max_failed_rounds} >= 1")
        self.step_retries = step_retries
        self.max_failed_rounds = max_failed_rounds
        self.num_step_failures = 0  # rounds whose step raised (recovered)
        self._failed_in_a_row = 0
        self.wiring = wiring  # what engine/build.py built this engine from (None when built by hand)
        self.vocab_size = vocab_size
        # the default wall clock leaves compile pauses out; a clock given by the caller (a virtual
        # clock of the simulated executor, where nothing compiles) is used as it is
        self.clock: Callable[[], float] = ServingClock(clock) if clock is time.perf_counter else clock
        self.executor = executor
        self.scheduler = Scheduler(sched_config, num_pages=num_pages, num_slots=num_slots)
        self.max_model_len = max_model_len
        self.eos_token_ids = tuple(eos_token_ids)
        self.tokenizer = tokenizer
        self.seed = seed
        self.records: list[RoundRecord] = []  # a long-running owner may trim it; num_rounds keeps counting
        self._ids = itertools.count()
        self._records: dict[int, RequestRecord] = {}  # request id -> its engine-side state (engine/record.py)
        self._sampling = SamplingRows(self._records)  # the view executors read
        caps = executor.capabilities
        self.overlap = overlap and caps.overlap
        self._prompt_logprobs = caps.prompt_logprobs
        self.limits = RequestLimits(
            max_model_len, self.scheduler.max_request_tokens(), caps.penalty_window, caps.logprobs,
            tokenizer is not None, vocab_size, caps.logit_bias, caps.prompt_logprobs is not None,
            sample_limit(max_n, wiring), self.eos_token_ids, caps.grammar_mask and has_grammar(tokenizer, vocab_size),
        )  # fmt: skip
        self._grammars = GrammarCompiler(tokenizer, vocab_size or 0, self.eos_token_ids) if self.limits.structured else None
        self._in_flight: _Launched | None = None  # overlap: the round launched and not collected yet
        self._host_tail = 0.0  # host time after the latest result was fetched, inside step()

    @property
    def num_rounds(self) -> int:
        """Rounds committed so far (the scheduler's commit fence counts them)."""
        return self.scheduler.round_index

    # --------------------------------------------------------------------------------- requests
    def check(self, prompt: Sequence[int], params: SamplingParams) -> CheckedRequest:
        """The request's one validation (``engine/intake.py``); reads only fixed settings, so any
        thread may call it. Raises ``TypeError`` / ``ValueError``; nothing is queued."""
        return self.limits.check(prompt, params)

    def forget(self, request_id: int) -> None:
        """Drops a finished request's bookkeeping (long-running servers call this after delivery)."""
        self.scheduler.forget(request_id)
        self._records.pop(request_id, None)

    def add_request(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, arrival_time: float | None = None
    ) -> int:
        """Checks and queues a request; raises (nothing queued) on a prompt the engine cannot run."""
        return self.add(self.check(prompt_ids, params), arrival_time=arrival_time)

    def add(self, checked: CheckedRequest, *, arrival_time: float | None = None) -> int:
        """Queues a request :meth:`check` accepted (on this engine or an identical replica); one
        that asks for several samples goes through :meth:`add_group` instead."""
        if is_group(checked.params):
            raise ValueError("a request with n > 1 or best_of runs as sibling requests: use add_group")
        scores = self._score_prompt(checked)
        rid = self._queue(checked.prompt, checked.params, arrival_time, self._open_grammar(checked.params))
        self._records[rid].output.prompt_logprobs = scores
        return rid

    def add_group(self, checked: CheckedRequest, *, arrival_time: float | None = None) -> list[int]:
        """Queues the sibling requests of a checked request (``engine/siblings.py``: ``best_of`` or
        ``n`` of them, in index order, queued together so their prompt is computed once); each
        record's ``siblings`` holds the ids of all. ``n == 1`` without ``best_of`` is one request."""
        members = expand(checked.params).members if is_group(checked.params) else (checked.params,)
        scores = self._score_prompt(checked)  # before queueing: should it raise, nothing is queued
        grammars = [self._open_grammar(p) for p in members]  # one matcher per sample
        rids = [self._queue(checked.prompt, p, arrival_time, g) for p, g in zip(members, grammars)]
        for i, rid in enumerate(rids):
            rec = self._records[rid]
            rec.siblings = tuple(rids) if len(rids) > 1 else None
            rec.output.index, rec.output.prompt_logprobs = i, scores
        return rids

    def _open_grammar(self, params: SamplingParams) -> GrammarState | None:
        """A fresh matcher for a constrained request (``check`` made sure the engine can run it)."""
        spec = params.structured_outputs
        return None if spec is None or self._grammars is None else self._grammars.open(spec)

    def _queue(
        self, prompt: tuple[int, ...], params: SamplingParams, arrival_time: float | None, grammar: GrammarState | None
    ) -> int:
        rid = next(self._ids)
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        arrival = self.clock() if arrival_time is None else arrival_time
        req = Request(rid, prompt, params.max_tokens, frozenset(stops), arrival_time=arrival)
        self.scheduler.add(req)
        rec = RequestRecord.open(req, params, hash((self.seed, rid)) & 0xFFFFFFFF, self.limits.banned(params), grammar)
        self._records[rid] = rec
        return rid

    def _score_prompt(self, checked: CheckedRequest) -> list[PromptLogprob | None] | None:
        """The prompt logprobs a request asked for (once for all its siblings; computed cold by the
        executor, since cached prompt tokens have no logits), else None."""
        k = checked.params.prompt_logprobs
        if k is None or self._prompt_logprobs is None:
            return None
        return self._prompt_logprobs(checked.prompt, k)

    def abort(self, request_id: int) -> RequestOutput | None:
        req = self.scheduler.abort(request_id)
        if req is None:
            return None
        rec = self._records[request_id]
        rec.output.finish_reason, rec.output.finish_time = "abort", self.clock()
        rec.close()
        if self._in_flight is not None and not self.scheduler.has_work():
            # overlap: nothing is left to run; commit the round in flight now, so its fence releases
            # what the aborted requests hold and the engine has nothing unfinished
            launched, self._in_flight = self._in_flight, None
            self._collect(launched)
        return rec.output

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self._in_flight is not None

    # --------------------------------------------------------------------------------- the loop
    def step(self) -> list[RequestOutput]:
        """Runs one round; returns the outputs that changed (new tokens or finished). With overlap,
        launches a round and completes the one launched before it."""
        if self.overlap:
            return self._step_overlapped()
        t0 = time.perf_counter()
        plan = self.scheduler.schedule()
        t1 = time.perf_counter()
        if plan.is_empty:
            return []
        try:
            result = self.executor.execute(plan, self._sampling)
        except Exception as exc:  # a failed step: rebuild and retry (or fail its requests), keep serving
            if is_fatal(exc):
                raise  # a broken invariant or a guard (e.g. compile after warm-up): a bug, not a device error
            return self._recover(plan, exc)
        host_s = self._host_tail + (t1 - t0) + result.build_s
        return self._complete(plan, result, t1 - t0, host_s, False, launched=False)

    def _step_overlapped(self) -> list[RequestOutput]:
        """Commits one round per call, as the synchronous step does: with no round in flight it first
        launches one; then it plans and launches the next round and collects and commits the one in
        flight (or commits that one first, when the next plan needs its tokens on the host)."""
        start = time.perf_counter()
        prev, self._in_flight = self._in_flight, None
        if prev is None:
            try:
                prev = self._launch_next(None, start)
            except _LaunchFailed as failure:
                return self._recover(failure.plan, failure.exc)
            if prev is None:
                return []  # nothing to run
        if self._needs_commit_first(prev.plan):
            changed, failed = self._collect(prev)
            if not failed:
                try:
                    self._in_flight = self._launch_next(None, time.perf_counter())
                except _LaunchFailed as failure:
                    changed += self._recover(failure.plan, failure.exc)
            return changed
        try:
            self._in_flight = self._launch_next(prev, start)
        except _LaunchFailed as failure:  # nothing of that round runs; the one in flight may be fine
            changed, failed = self._collect(prev)
            return changed if failed else changed + self._recover(failure.plan, failure.exc)
        changed, _ = self._collect(prev)  # a failure voids the round just launched too
        return changed

    def _launch_next(self, prev: _Launched | None, start: float) -> _Launched | None:
        """Plans and launches a round (``prev``: the round in flight, whose samples feed it); ``None``
        when there is nothing to run. Raises :class:`_LaunchFailed` when the launch raised."""
        t0 = time.perf_counter()
        plan = self.scheduler.schedule()
        t1 = time.perf_counter()
        if plan.is_empty:
            return None
        self.scheduler.launch(plan)
        try:
            executor = cast(OverlapExecutor, self.executor)  # self.overlap: its capabilities say so
            handle = executor.launch(plan, self._sampling, None if prev is None else prev.handle)
        except Exception as exc:
            if is_fatal(exc):
                raise
            raise _LaunchFailed(plan, exc) from exc
        compile_s = handle.compile_s
        if compile_s and isinstance(self.clock, ServingClock):
            self.clock.paused_s += compile_s  # now: the round in flight commits after this
        host_s = 0.0 if prev is not None else self._host_tail + (time.perf_counter() - start)
        return _Launched(plan, handle, t1 - t0, host_s, prev is not None)

    def _needs_commit_first(self, plan: RoundPlan) -> bool:
        """The next round cannot be planned before ``plan``'s tokens are on the host (module docstring)."""
        for row in plan.rows:
            sampling = self._sampling.get(row.request_id)
            if row.sample and sampling is not None and (sampling.has_penalty or sampling.grammar is not None):
                return True  # its next row needs this round's token on the host (penalty context, grammar mask)
        return self.scheduler.plants_on_unknown()

    def _collect(self, launched: _Launched) -> tuple[list[RequestOutput], bool]:
        """Waits for a launched round and commits it; ``(outputs, failed)``. A failure voids the round
        launched after it (``_in_flight``) and recovers."""
        try:
            result = cast(OverlapExecutor, self.executor).collect(launched.handle)
        except Exception as exc:
            if is_fatal(exc):
                raise
            self._in_flight = None
            return self._recover(launched.plan, exc), True
        host_s = launched.host_s if launched.overlapped else max(0.0, launched.host_s - result.compile_s)
        return self._complete(launched.plan, result, launched.plan_s, host_s, launched.overlapped, launched=True), False

    def _complete(
        self, plan: RoundPlan, result: StepResult, plan_s: float, host_s: float, overlapped: bool, *, launched: bool
    ) -> list[RequestOutput]:
        """Commits a round whose result came back; returns the outputs that changed. ``launched``: it
        went through ``_launch_next`` (overlap), which took its compile time off the clock already."""
        fetched = time.perf_counter()
        self._failed_in_a_row = 0
        if self.num_step_failures:  # these requests ran a round successfully: their retry count starts over
            for row in plan.rows:
                rec = self._records.get(row.request_id)
                if rec is not None:
                    rec.failures = 0
        if result.logprobs:
            reqs = self.scheduler.requests
            live = {r.request_id for r in plan.rows if r.request_id in reqs and reqs[r.request_id].epoch == r.epoch}
            for rid, lp in result.logprobs.items():
                rec = self._records.get(rid)
                if rid in live and rec is not None:  # not for a stale row (preempted after planning, overlap)
                    rec.add_logprobs(lp)
        if result.compile_s and isinstance(self.clock, ServingClock) and not launched:
            self.clock.paused_s += result.compile_s  # (a launched round's was taken off at its launch)
        finished = self.scheduler.commit(plan, result.sampled)
        self.records.append(
            RoundRecord.of(self.num_rounds - 1, plan, result, plan_s=plan_s, host_s=host_s, overlapped=overlapped)
        )
        now = self.clock()
        changed = []
        for row in plan.rows:
            if row.sample and row.request_id in self.scheduler.requests:
                changed.append(self._update(row.request_id, now))
        for req in finished:
            if self._records[req.request_id].output.finish_reason is None:
                self._finalize(req, now)
        self._host_tail = time.perf_counter() - fetched
        return changed

    def _recover(self, plan, exc: Exception) -> list[RequestOutput]:
        """See the module docstring. Returns the outputs of requests that ended with an error."""
        self.num_step_failures += 1
        self._failed_in_a_row += 1
        log.error("round %d: the step raised %r; rebuilding the pools and flushing the cache", self.num_rounds, exc)
        if self._failed_in_a_row > self.max_failed_rounds:
            n = self._failed_in_a_row
            raise EngineFailure(f"{n} rounds failed in a row; the last step raised {exc!r}") from exc
        sched = self.scheduler
        self._in_flight = None
        self._host_tail = 0.0
        rebuild(sched, self.executor, exc)
        now = self.clock()
        failed = []
        for row in plan.rows:
            req = sched.requests.get(row.request_id)
            if req is None or req.is_finished:
                continue  # aborted while the round ran
            rec = self._records[req.request_id]
            n = rec.failures = rec.failures + 1
            if n > self.step_retries:
                rec.failures = 0
                sched.finish(req.request_id, "error")
                self._finalize(req, now)
                rec.output.error = failure_text(n, exc)
                failed.append(rec.output)
        return failed

    def _update(self, rid: int, now: float) -> RequestOutput:
        """The output of a request its round sampled; a stop string in its text, or its grammar
        (structured outputs: complete, or a token it did not allow), ends it."""
        req, rec = self.scheduler.requests[rid], self._records[rid]
        rec.progress(req, now, self.num_rounds)
        verdict = rec.follow_grammar(req)
        if self.tokenizer is not None and rec.update_text(self.tokenizer, req.is_finished):
            verdict = "stop"
        if verdict is not None and req.is_finished:
            self.scheduler.amend_finish_reason(rid, verdict)  # the completing token was also the last allowed one
        elif verdict is not None:
            self.scheduler.finish(rid, verdict)
        if req.is_finished:
            self._finalize(req, now)
        return rec.output

    def _finalize(self, req: Request, now: float) -> None:
        self._records[req.request_id].finalize(req, now, self.num_rounds)

    def output(self, request_id: int) -> RequestOutput:
        return self._records[request_id].output

    def run_until_done(self) -> None:
        while self.has_unfinished():
            self.step()


@dataclasses.dataclass(frozen=True)
class _Launched:
    """A round launched with overlap: its plan, the executor's handle, and its host timings."""

    plan: RoundPlan
    handle: LaunchHandle
    plan_s: float
    host_s: float
    overlapped: bool


class _LaunchFailed(Exception):
    """A round's launch raised a recoverable error (nothing of it runs)."""

    def __init__(self, plan: RoundPlan, exc: Exception):
        super().__init__(repr(exc))
        self.plan, self.exc = plan, exc
