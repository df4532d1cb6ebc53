"""The engine loop (docs/design.md, "One round"): plan a round -> build arrays -> run the step -> commit.

:class:`EngineCore` is single-threaded and step-driven: ``add_request`` / ``abort`` / ``step``.
``replicas/background.py`` runs it on a thread for servers and streaming clients. Every round leaves
a :class:`RoundRecord` (slots, padding, bubbles, consumers, timings) in ``records``.

Failure recovery (``docs/reliability.md``): a round whose step raises is not committed. The step may
have consumed the donated pools, so the executor rebuilds them, the radix cache is flushed (its pages
and checkpoints lived there) and every running request recomputes from its tokens so far; a request
in more than ``step_retries`` failed rounds in a row ends with ``finish_reason='error'`` and the
error text. An ``AssertionError`` (a broken invariant) or an exception whose class sets
``recoverable = False`` (the compile guard) is a bug, not a device error: it propagates. When
recovery itself fails, or ``max_failed_rounds`` rounds fail in a row, :class:`EngineFailure` is
raised: the engine cannot serve and its owner must fail what is in flight.

Overlap (``overlap=True`` and an executor with ``supports_overlap``): ``step`` plans and launches
round r+1 while the device runs round r, then collects and commits r (the scheduler's ``launch`` /
``commit``, see ``scheduler/scheduler.py``). Each ``step`` still commits one round and returns its
outputs; one round stays in flight between calls (``has_unfinished`` counts it). Round
r is committed before planning r+1 when r+1 could not be planned without r's tokens on the host: a
penalised request (its penalty context) or a checkpoint that would be planted on a path ending in
one of r's samples. A failed round voids the round launched after it (recovered as one failure).
The shadow executor and the simulated one run synchronously (the simulated one models overlap's
decisions when built with ``overlap=True``, as the mirror of an overlapped model engine is).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Callable, Sequence

from radixflow_jax.engine.detok import IncrementalText
from radixflow_jax.engine.protocol import Executor, StepResult
from radixflow_jax.scheduler.plan import RoundPlan
from radixflow_jax.engine.params import RequestOutput, SamplingParams
from radixflow_jax.runner.inputs import SamplingRow
from radixflow_jax.scheduler.request import Request
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.scheduler import Scheduler

log = logging.getLogger(__name__)


from radixflow_jax.engine.config import EngineConfig, EngineFailure, RoundRecord, ServingClock, model_grid  # noqa: F401 (re-exported)


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
    ):
        if step_retries < 0 or max_failed_rounds < 1:
            raise ValueError(f"step_retries={step_retries} must be >= 0, max_failed_rounds={max_failed_rounds} >= 1")
        self.step_retries = step_retries
        self.max_failed_rounds = max_failed_rounds
        self.num_step_failures = 0  # rounds whose step raised (recovered)
        self._failed_in_a_row = 0
        self._failing: dict[int, int] = {}  # request id -> failed rounds in a row it ran in
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
        self._params: dict[int, SamplingParams] = {}
        self._sampling: dict[int, SamplingRow] = {}
        self._outputs: dict[int, RequestOutput] = {}
        self._detok: dict[int, IncrementalText] = {}  # incremental text of running requests
        self.penalty_window = int(getattr(executor, "penalty_window", 0))  # 0: the executor cannot penalise
        self.supports_logprobs = bool(getattr(executor, "supports_logprobs", False))
        self.overlap = overlap and bool(getattr(executor, "supports_overlap", False))
        self._in_flight: _Launched | None = None  # overlap: the round launched and not collected yet
        self._host_tail = 0.0  # host time after the latest result was fetched, inside step()

    @property
    def num_rounds(self) -> int:
        """Rounds committed so far (the scheduler's commit fence counts them)."""
        return self.scheduler.round_index

    # --------------------------------------------------------------------------------- requests
    def validate(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Raises ``ValueError`` for a request this engine cannot run (nothing is queued)."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len={self.max_model_len}"
            )
        if params.has_penalty and len(prompt_ids) + params.max_tokens > self.penalty_window:
            raise ValueError(
                f"penalties need the whole context in the penalty window ({self.penalty_window} tokens, engine option "
                f"penalty_window); this request has {len(prompt_ids)} prompt tokens + max_tokens {params.max_tokens}"
            )
        if params.logprobs is not None and not self.supports_logprobs:
            raise ValueError("logprobs are not available with this executor")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model has none (use stop_token_ids)")
        if self.vocab_size is not None:
            bad = next((t for t in prompt_ids if not 0 <= int(t) < self.vocab_size), None)
            if bad is not None:
                raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")

    def forget(self, request_id: int) -> None:
        """Drops a finished request's bookkeeping (long-running servers call this after delivery)."""
        req = self.scheduler.requests.get(request_id)
        if req is not None and not req.is_finished:
            raise ValueError(f"request {request_id} is still running")
        self.scheduler.requests.pop(request_id, None)
        for table in (self._params, self._sampling, self._outputs, self._detok, self._failing):
            table.pop(request_id, None)

    def add_request(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, arrival_time: float | None = None
    ) -> int:
        """Queues a request; raises ``ValueError`` (nothing queued) on a prompt the engine cannot run."""
        self.validate(prompt_ids, params)
        rid = next(self._ids)
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        req = Request(rid, tuple(int(t) for t in prompt_ids), params.max_tokens, frozenset(stops))
        req.arrival_time = self.clock() if arrival_time is None else arrival_time
        self.scheduler.add(req)
        self._params[rid] = params
        seed = params.seed if params.seed is not None else hash((self.seed, rid)) & 0xFFFFFFFF
        self._sampling[rid] = SamplingRow(
            params.temperature, params.top_k, params.top_p, params.min_p, seed, params.presence_penalty,
            params.frequency_penalty, params.repetition_penalty, -1 if params.logprobs is None else params.logprobs,
            req.prompt if params.has_penalty else (), req.output if params.has_penalty else (),
        )  # fmt: skip
        self._outputs[rid] = RequestOutput(
            rid, req.prompt, [], None, None, len(req.prompt), 0, req.arrival_time,
            logprobs=[] if params.logprobs is not None else None,
        )  # fmt: skip
        return rid

    def abort(self, request_id: int) -> RequestOutput | None:
        req = self.scheduler.abort(request_id)
        if req is None:
            return None
        out = self._outputs[request_id]
        out.finish_reason, out.finish_time = "abort", self.clock()
        self._sampling.pop(request_id, None)
        self._detok.pop(request_id, None)
        if self._in_flight is not None and not self.scheduler.has_work():
            # overlap: nothing is left to run; commit the round in flight now, so its fence releases
            # what the aborted requests hold and the engine has nothing unfinished
            launched, self._in_flight = self._in_flight, None
            self._collect(launched)
        return out

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
            if _fatal(exc):
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
            handle = self.executor.launch(plan, self._sampling, None if prev is None else prev.handle)
        except Exception as exc:
            if _fatal(exc):
                raise
            raise _LaunchFailed(plan, exc) from exc
        compile_s = getattr(handle, "compile_s", 0.0)
        if compile_s and isinstance(self.clock, ServingClock):
            self.clock.paused_s += compile_s  # now: the round in flight commits after this
        host_s = 0.0 if prev is not None else self._host_tail + (time.perf_counter() - start)
        return _Launched(plan, handle, t1 - t0, host_s, prev is not None)

    def _needs_commit_first(self, plan: RoundPlan) -> bool:
        """The next round cannot be planned before ``plan``'s tokens are on the host (module docstring)."""
        for row in plan.rows:
            params = self._sampling.get(row.request_id)
            if row.sample and params is not None and params.has_penalty:
                return True
        return self.scheduler.plants_on_unknown()

    def _collect(self, launched: _Launched) -> tuple[list[RequestOutput], bool]:
        """Waits for a launched round and commits it; ``(outputs, failed)``. A failure voids the round
        launched after it (``_in_flight``) and recovers."""
        try:
            result = self.executor.collect(launched.handle)
        except Exception as exc:
            if _fatal(exc):
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
        if self._failing:  # these requests ran a round successfully: their retry count starts over
            for row in plan.rows:
                self._failing.pop(row.request_id, None)
        if result.logprobs:
            reqs = self.scheduler.requests
            live = {r.request_id for r in plan.rows if r.request_id in reqs and reqs[r.request_id].epoch == r.epoch}
            for rid, lp in result.logprobs.items():
                out = self._outputs.get(rid)
                if rid in live and out is not None and out.logprobs is not None and out.finish_reason is None:
                    out.logprobs.append(lp)  # not for a stale row (preempted after planning, overlap)
        if result.compile_s and isinstance(self.clock, ServingClock) and not launched:
            self.clock.paused_s += result.compile_s  # (a launched round's was taken off at its launch)
        finished = self.scheduler.commit(plan, result.sampled)
        self._record(plan, result, plan_s, host_s, overlapped)
        now = self.clock()
        changed = []
        for row in plan.rows:
            if row.sample and row.request_id in self.scheduler.requests:
                changed.append(self._update(row.request_id, now))
        for req in finished:
            out = self._outputs[req.request_id]
            if out.finish_reason is None:
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
        try:
            sched.drop_in_flight()  # overlap: the rounds launched after the failed one are void too
            sched.requeue_running()  # their device state is gone: recompute from the tokens so far
            sched.memory.flush()
            self.executor.reset()
            used = sched.memory.pages.num_used, sched.memory.slots.num_used if sched.memory.slots else 0
            if any(used):
                raise RuntimeError(f"{used[0]} pages and {used[1]} state slots still in use after the flush")
        except Exception as err:
            raise EngineFailure(f"recovery from a failed step ({exc!r}) failed: {err!r}") from err
        now = self.clock()
        failed = []
        for row in plan.rows:
            req = sched.requests.get(row.request_id)
            if req is None or req.is_finished:
                continue  # aborted while the round ran
            n = self._failing[req.request_id] = self._failing.get(req.request_id, 0) + 1
            if n > self.step_retries:
                del self._failing[req.request_id]
                sched.finish(req.request_id, "error")
                self._finalize(req, now)
                out = self._outputs[req.request_id]
                out.error = f"the step failed in {n} rounds in a row that this request ran in; last error: {exc!r}"
                failed.append(out)
        return failed

    def _update(self, rid: int, now: float) -> RequestOutput:
        req = self.scheduler.requests[rid]
        out = self._outputs[rid]
        out.token_ids = req.committed_output
        out.cached_tokens = req.cached_tokens
        if out.first_token_time is None:
            out.first_token_time, out.first_token_round = now, self.num_rounds
        params = self._params[rid]
        if self.tokenizer is not None:
            detok = self._detok.setdefault(rid, IncrementalText(self.tokenizer))
            seen = len(detok.text)  # no stop string was complete in this much text
            out.text = detok.finish(out.token_ids) if req.is_finished else detok.update(out.token_ids)
            starts = [0 if req.is_finished else max(0, seen - len(s) + 1) for s in params.stop]
            hit = min((h for h in (out.text.find(s, a) for s, a in zip(params.stop, starts)) if h >= 0), default=-1)
            if hit >= 0:
                out.text = out.text[:hit]
                if req.is_finished:
                    req.finish_reason = "stop"  # the completing token was also the last allowed one
                else:
                    self.scheduler.finish(rid, "stop")
        if req.is_finished:
            self._finalize(req, now)
        return out

    def _finalize(self, req: Request, now: float) -> None:
        out = self._outputs[req.request_id]
        out.token_ids = list(req.output)
        out.finish_reason = req.finish_reason
        out.finish_time, out.finish_round = now, self.num_rounds
        self._sampling.pop(req.request_id, None)
        self._detok.pop(req.request_id, None)

    def _record(self, plan, result: StepResult, plan_s: float, host_s: float, overlapped: bool) -> None:
        # Bubble: budget left idle while requests behind a consumer stop were admissible; the
        # scheduler's shadow scan measured what they would have brought within the budget left.
        st = plan.stats
        self.records.append(
            RoundRecord(
                index=self.num_rounds - 1,
                num_tokens=plan.num_tokens,
                num_rows=len(plan.rows),
                token_slots=result.token_slots,
                row_slots=result.row_slots,
                padding_tokens=result.token_slots - plan.num_tokens,
                bubble_tokens=st.shadow_tokens,
                bubble_rows=st.shadow_rows,
                admitted=st.admitted,
                consumers_blocked=st.consumers_blocked,
                consumers_waiting=st.consumers_waiting,
                preempted=st.preempted,
                checkpoints_planted=st.checkpoints_planted,
                checkpoints_skipped=st.checkpoints_skipped,
                checkpoints_evicted_unused=st.checkpoints_evicted_unused,
                plan_s=plan_s,
                build_s=result.build_s,
                step_s=result.step_s,
                num_decode=plan.num_decode,
                decode_slots=result.decode_slots,
                consumers_paired=st.consumers_paired,
                fill_declined=st.fill_declined,
                pairs_declined=st.pairs_declined,
                prefill_first=st.prefill_first,
                host_s=host_s,
                overlapped=overlapped,
            )
        )

    def output(self, request_id: int) -> RequestOutput:
        return self._outputs[request_id]

    def run_until_done(self) -> None:
        while self.has_unfinished():
            self.step()


@dataclasses.dataclass(frozen=True)
class _Launched:
    """A round launched with overlap: its plan, the executor's handle, and its host timings."""

    plan: RoundPlan
    handle: object
    plan_s: float
    host_s: float
    overlapped: bool


class _LaunchFailed(Exception):
    """A round's launch raised a recoverable error (nothing of it runs)."""

    def __init__(self, plan: RoundPlan, exc: Exception):
        super().__init__(repr(exc))
        self.plan, self.exc = plan, exc


def _fatal(exc: Exception) -> bool:
    """A broken invariant or a guard (``recoverable = False``): a bug, not a device error."""
    return isinstance(exc, AssertionError) or not getattr(exc, "recoverable", True)
