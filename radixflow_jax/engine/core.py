"""The engine loop (docs/design.md, "One round"): plan -> launch -> collect -> commit.

:class:`EngineCore` is single-threaded and step-driven: ``add_request`` (``check`` + ``add``) /
``abort`` / ``step``. ``replicas/background.py`` runs it on a thread for servers and streaming
clients. It is built from one :class:`~radixflow_jax.engine.spec.EngineSpec` (``engine/build.py``)
and reads every setting from it. A request is checked once, by ``check`` (``engine/intake.py``),
and its engine-side state is one :class:`~radixflow_jax.engine.record.RequestRecord` (sampling
row, output, detokeniser, failures) in one table. The executor's capabilities
(``engine/protocol.py``) are read once, here. Every round leaves a :class:`RoundRecord` (slots,
padding, bubbles, consumers, timings: ``engine/timing.RoundTimer``) in ``records``.

Failure recovery (``docs/reliability.md``, ``engine/recovery.py``): a round whose step raises is not
committed. The step may have consumed the donated pools, so the executor rebuilds them, the radix
cache is flushed (its pages and checkpoints lived there) and every running request recomputes from
its tokens so far; a request in more than ``step_retries`` failed rounds in a row ends with
``finish_reason='error'`` and the error text. An ``AssertionError`` (a broken invariant) or an
exception whose class sets ``recoverable = False`` (the compile guard) is a bug, not a device error:
it propagates. When recovery itself fails, or ``max_failed_rounds`` rounds fail in a row,
:class:`EngineFailure` is raised: the engine cannot serve and its owner must fail what is in flight.
A request whose sampling row cannot be built (``RequestRecord.refused``) is no round's failure: it
ends with ``error`` when queued, never reaches the scheduler, and the next ``step`` returns it.

Overlap (``overlap=True`` and an executor whose capabilities offer it): ``step`` plans and launches
round r+1 while the device runs round r, then collects and commits r (the scheduler's ``launch`` /
``commit``, see ``scheduler/scheduler.py``). Each ``step`` still commits one round and returns its
outputs; one :class:`LaunchedRound` stays in flight between calls (``has_unfinished`` counts it).
Round r is committed before planning r+1 when r+1 could not be planned without r's tokens on the
host: a penalised request (its penalty context), a constrained one (structured outputs: its mask
for r+1 comes from its matcher after r's token, so it never has two rounds in flight), or a
checkpoint that would be planted on a path ending in one of r's samples. A failed round voids the
round launched after it (recovered as one failure). The shadow executor and the simulated one run
synchronously (the simulated one models overlap's decisions when built with ``overlap=True``, as
the mirror of an overlapped model engine is).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Callable, Sequence, cast

from radixflow_jax.engine.config import RoundRecord, ServingClock
from radixflow_jax.engine.grammar import GrammarCompiler, GrammarState, has_grammar
from radixflow_jax.engine.intake import CheckedRequest, RequestLimits
from radixflow_jax.engine.params import RequestOutput, SamplingParams
from radixflow_jax.engine.protocol import Executor, LaunchHandle, OverlapExecutor, PromptLogprob, StepResult
from radixflow_jax.engine.record import RequestRecord, SamplingRows, attach_logprobs, logprob_owners
from radixflow_jax.engine.recovery import FailedRounds, LaunchFailed, is_fatal
from radixflow_jax.engine.siblings import expand, is_group
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.engine.timing import RoundTimer, RoundTimes
from radixflow_jax.scheduler.drafts import offer_drafts
from radixflow_jax.scheduler.plan import RoundPlan
from radixflow_jax.scheduler.request import Request
from radixflow_jax.scheduler.scheduler import Scheduler


class EngineCore:
    """One engine: a scheduler over ``spec``'s pools and an ``executor`` built for ``spec.shapes()``
    (``engine/build.assemble_engine`` makes both). Every setting is read from ``spec`` (kept as
    ``self.spec``); ``clock``: the engine's time (a virtual clock for simulated executors)."""

    def __init__(self, executor: Executor, spec: EngineSpec, *, clock: Callable[[], float] = time.perf_counter):
        config = spec.config
        self.spec = spec
        self.failures = FailedRounds(step_retries=config.step_retries, max_failed_rounds=config.max_failed_rounds)
        self.vocab_size = spec.vocab_size
        # the default wall clock leaves compile pauses out; a clock given by the caller (a virtual
        # clock of the simulated executor, where nothing compiles) is used as it is
        self.clock: Callable[[], float] = ServingClock(clock) if clock is time.perf_counter else clock
        self.timer = RoundTimer(self.clock)
        self.executor = executor
        self.scheduler = Scheduler(spec.scheduler(), num_pages=spec.num_pages, num_slots=spec.num_slots,
                                   num_host_slots=spec.num_host_slots, num_host_pages=spec.num_host_pages)
        self.max_model_len = spec.max_model_len
        self.eos_token_ids = tuple(spec.eos_token_ids)
        self.tokenizer = spec.tokenizer
        self.seed = config.seed
        self.records: list[RoundRecord] = []  # a long-running owner may trim it; num_rounds keeps counting
        self._ids = itertools.count()
        self._records: dict[int, RequestRecord] = {}  # request id -> its engine-side state (engine/record.py)
        self._sampling = SamplingRows(self._records)  # the view executors read
        caps = executor.capabilities
        if spec.config.scheduler.speculative is not None and not caps.verify:
            raise ValueError(
                f"speculative decoding needs an executor that verifies drafted tokens; {type(executor).__name__} does not"
            )
        self.overlap = config.overlap and caps.overlap
        self._prompt_logprobs = caps.prompt_logprobs
        self.limits = RequestLimits(
            max_model_len=spec.max_model_len,
            pool_tokens=self.scheduler.max_request_tokens(),
            penalty_window=caps.penalty_window,
            logprobs=caps.logprobs,
            stop_strings=self.tokenizer is not None,
            vocab_size=self.vocab_size,
            bias_width=caps.logit_bias,
            prompt_logprobs=caps.prompt_logprobs is not None,
            max_n=config.max_n,
            stop_ids=self.eos_token_ids,
            structured=caps.grammar_mask and has_grammar(self.tokenizer, self.vocab_size),
        )
        self._grammars: GrammarCompiler | None = None
        if self.limits.structured:
            self._grammars = GrammarCompiler(self.tokenizer, self.vocab_size or 0, self.eos_token_ids)
        self._launched: LaunchedRound | None = None  # overlap: the round launched and not collected yet
        self._refused: list[RequestOutput] = []  # requests refused when queued, reported by the next step

    @property
    def step_retries(self) -> int:
        """Failed rounds a request is retried through before it ends with an error (settable)."""
        return self.failures.step_retries

    @step_retries.setter
    def step_retries(self, value: int) -> None:
        self.failures.step_retries = value

    @property
    def num_step_failures(self) -> int:
        """Rounds whose step raised (recovered)."""
        return self.failures.total

    @property
    def grammars(self) -> GrammarCompiler | None:
        """The engine's compiled-grammar cache (None: no structured outputs); thread-safe, so a
        server's preparation workers compile into it before a request reaches the engine thread."""
        return self._grammars

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
        req = Request(
            rid, prompt, params.max_tokens, frozenset(stops), arrival_time=arrival,
            speculate=self.scheduler.config.speculative is not None,
        )
        rec = RequestRecord.open(
            req,
            params,
            hash((self.seed, rid)) & 0xFFFFFFFF,
            banned=self.limits.banned(params),
            grammar=grammar,
            penalty_window=self.limits.penalty_window,
        )
        self._records[rid] = rec
        if rec.refused:  # its row cannot be built: it fails alone, in no round (the next step reports it)
            self._refused.append(rec.output)
        else:
            self.scheduler.add(req)
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
        if self._launched is not None and not self.scheduler.has_work():
            # overlap: nothing is left to run; commit the round in flight now, so its fence releases
            # what the aborted requests hold and the engine has nothing unfinished
            launched, self._launched = self._launched, None
            self._collect(launched)
        return rec.output

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self._launched is not None or bool(self._refused)

    # --------------------------------------------------------------------------------- the loop
    def step(self) -> list[RequestOutput]:
        """Runs one round: plan -> launch -> collect -> commit; returns the outputs that changed (new
        tokens or finished), after those of requests refused when queued (``RequestRecord.refused``).
        Without overlap, launch and collect are one ``execute``."""
        refused, self._refused = self._refused, []
        return refused + self._round()

    def _round(self) -> list[RequestOutput]:
        if self.overlap:
            return self._step_overlapped()
        self.timer.start()
        plan, plan_s = self.timer.plan(self.scheduler.schedule)
        if plan.is_empty:
            return []
        try:
            result = self.executor.execute(plan, self._sampling)
        except Exception as exc:  # a failed step: rebuild and retry (or fail its requests), keep serving
            if is_fatal(exc):
                raise  # a broken invariant or a guard (e.g. compile after warm-up): a bug, not a device error
            return self._recover(plan, exc)
        return self._commit(plan, result, self.timer.executed(plan_s, result))

    def _step_overlapped(self) -> list[RequestOutput]:
        """One round committed per call, as the synchronous step: with no round in flight it first
        plans and launches one (r); then it plans and launches r+1 while the device runs r, and
        collects and commits r. When r+1 needs r's tokens on the host, r is committed first."""
        self.timer.start()
        prev, self._launched = self._launched, None
        try:
            if prev is None:
                prev = self._launch(None)
                if prev is None:
                    return []  # nothing to run
            if self._needs_commit_first(prev.plan):
                return self._commit_first(prev)
            self._launched = self._launch(prev)
        except LaunchFailed as failure:  # nothing of that round runs; the one in flight may be fine
            outputs, failed = self._collect(prev) if prev is not None else ([], False)
            return outputs if failed else outputs + self._recover(failure.plan, failure.exc)
        return self._collect(prev)[0]  # a failure voids the round just launched too

    def _commit_first(self, prev: LaunchedRound) -> list[RequestOutput]:
        """Collects and commits ``prev``, then plans and launches the next round (nothing overlaps)."""
        outputs, failed = self._collect(prev)
        if not failed:
            self.timer.start()
            try:
                self._launched = self._launch(None)
            except LaunchFailed as failure:
                outputs += self._recover(failure.plan, failure.exc)
        return outputs

    def _launch(self, prev: LaunchedRound | None) -> LaunchedRound | None:
        """Plans and launches a round (``prev``: the round in flight, whose samples feed it); ``None``
        when there is nothing to run. Raises :class:`LaunchFailed` when the launch raised."""
        plan, plan_s = self.timer.plan(self.scheduler.schedule)
        if plan.is_empty:
            return None
        self.scheduler.launch(plan)
        try:
            executor = cast(OverlapExecutor, self.executor)  # self.overlap: its capabilities say so
            handle = executor.launch(plan, self._sampling, None if prev is None else prev.handle)
        except Exception as exc:
            if is_fatal(exc):
                raise
            raise LaunchFailed(plan, exc) from exc
        return LaunchedRound(plan, handle, self.timer.launched(plan_s, handle.compile_s, overlapped=prev is not None))

    def _needs_commit_first(self, plan: RoundPlan) -> bool:
        """The next round cannot be planned before ``plan``'s tokens are on the host (module docstring)."""
        requests = self.scheduler.requests
        for row in plan.rows:
            sampling = self._sampling.get(row.request_id)
            if row.sample and sampling is not None and (sampling.has_penalty or sampling.grammar is not None):
                return True  # its next row needs this round's token on the host (penalty context, grammar mask)
            if row.sample and row.request_id in requests and requests[row.request_id].speculate:
                return True  # speculative decoding: its next draft extends this round's tokens (scheduler/drafts.py)
        return self.scheduler.plants_on_unknown()

    def _collect(self, launched: LaunchedRound) -> tuple[list[RequestOutput], bool]:
        """Waits for a launched round and commits it; ``(outputs, failed)``. A failure voids the round
        launched after it (``_launched``) and recovers."""
        try:
            result = cast(OverlapExecutor, self.executor).collect(launched.handle)
        except Exception as exc:
            if is_fatal(exc):
                raise
            return self._recover(launched.plan, exc), True
        return self._commit(launched.plan, result, self.timer.collected(launched.times, result)), False

    def _commit(self, plan: RoundPlan, result: StepResult, times: RoundTimes) -> list[RequestOutput]:
        """Commits a round whose result came back (the scheduler's commit fence, then the outputs);
        returns the outputs that changed."""
        self.failures.committed(plan, self._records)
        owners = logprob_owners(plan, result, self.scheduler.requests)
        finished = self.scheduler.commit(plan, result.sampled, result.verified)
        offer_drafts(self.scheduler.drafter, self.scheduler.requests, result.drafts, plan.rows)  # method mtp
        attach_logprobs(owners, result, self._records)
        self.records.append(
            RoundRecord.of(
                self.num_rounds - 1, plan, result, plan_s=times.plan_s, host_s=times.host_s, overlapped=times.overlapped
            )
        )
        now = self.clock()
        changed = []
        for row in plan.rows:
            if row.sample and row.request_id in self.scheduler.requests:
                changed.append(self._update(row.request_id, now))
        for req in finished:
            if self._records[req.request_id].output.finish_reason is None:
                self._finalize(req, now)
        self.timer.committed()
        return changed

    def _recover(self, plan: RoundPlan, exc: Exception) -> list[RequestOutput]:
        """A failed round (``engine/recovery.py``); returns the outputs of requests that ended with an error."""
        self._launched = None  # a failure voids the round launched after the failed one
        self.timer.reset()
        failed = self.failures.recover(plan, exc, self.scheduler, self.executor, self._records)
        now = self.clock()
        outputs = []
        for req, error in failed:
            self._finalize(req, now)
            output = self._records[req.request_id].output
            output.error = error
            outputs.append(output)
        return outputs

    def _update(self, rid: int, now: float) -> RequestOutput:
        """The output of a request its round sampled; a stop string in its text, or its grammar
        (structured outputs: complete, or a token it did not allow), ends it."""
        req, rec = self.scheduler.requests[rid], self._records[rid]
        rec.progress(req, now, self.num_rounds)
        verdict = rec.follow_grammar(req)
        if rec.stop_at is not None:  # the grammar completed before the last token a verify row committed
            self.scheduler.truncate_output(rid, rec.stop_at)
        if self.tokenizer is not None and rec.update_text(self.tokenizer, req.is_finished):
            verdict = "stop"
            if rec.stop_at is not None:  # a verify row committed tokens past the stop string
                self.scheduler.truncate_output(rid, rec.stop_at)
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
class LaunchedRound:
    """A round launched with overlap and not collected yet: its plan, the executor's handle, and its
    host timings so far."""

    plan: RoundPlan
    handle: LaunchHandle
    times: RoundTimes
