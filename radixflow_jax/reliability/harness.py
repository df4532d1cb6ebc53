"""The reliability harness: drives an :class:`EngineCore` round by round through a scenario
(arrivals, aborts between rounds or while a round runs, probes), audits the engine before and after
every round, checks that every checkpoint a round reads is committed, and accounts for every
accepted request (it ends stop / length / abort / error-with-a-message). A check that fails inside a
step (the shadow executor's, or the committed-read check) fails the run even though the engine
would recover from the exception.

Used by ``tests/reliability`` and ``tests/heavy/soak.py``. A scenario is plain data plus callbacks:
``submit(prompt, params, at_round=, abort_at=, mid_round=)``, ``follow_up(prompt, params)`` for a
request decided while it runs (a conversation's next turn, from an ``on_finished`` callback), and
``between_rounds`` callbacks that may inspect the core and call :meth:`Harness.abort`. The executor is wrapped in a
:class:`FaultyExecutor` (if it is not one already), whose ``on_execute`` hook the harness uses for
aborts between planning and commit. :func:`shadow_engine` builds an engine over the
:class:`ShadowExecutor` from an :class:`EngineConfig`, the policy being just one of its fields.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from radixflow_jax.cache.pools import InvariantError
from radixflow_jax.cache.tree import Node
from radixflow_jax.reliability.audit import assert_drained, audit_engine, committed_slots
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.reliability.faults import Fault, FaultyExecutor
from radixflow_jax.engine.params import RequestOutput, SamplingParams
from radixflow_jax.engine.protocol import Executor
from radixflow_jax.reliability.shadow import ShadowExecutor
from radixflow_jax.sim.executor import VirtualClock
from radixflow_jax.engine.build import assemble_engine
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.scheduler.plan import RoundPlan

ENDINGS = ("stop", "length", "abort", "error")  # a request ends in exactly one of these


@dataclasses.dataclass
class _Submission:
    prompt: list[int]
    params: SamplingParams
    at_round: int
    abort_at: int | None
    mid_round: bool
    request_id: int | None = None
    follow_up: bool = False  # added while running (Harness.follow_up), outside the at_round order


@dataclasses.dataclass
class HarnessReport:
    """What a run did: ``outputs`` by submission index (None: refused at submission, see
    ``refused``), counts of rounds, aborts and audits, and the executor's failures and resets."""

    outputs: dict[int, RequestOutput]
    refused: dict[int, str]
    ticks: int
    rounds: int
    aborts: int
    audits: int
    step_failures: int
    resets: int
    preemptions: int

    def by_reason(self) -> dict[str, int]:
        counts = dict.fromkeys(ENDINGS, 0)
        for out in self.outputs.values():
            counts[out.finish_reason] += 1  # type: ignore[index]
        return counts

    def completed(self) -> dict[int, list[int]]:
        """Greedy outputs of the requests that ran to the end (stop or length)."""
        return {k: o.token_ids for k, o in self.outputs.items() if o.finish_reason in ("stop", "length")}


class Harness:
    """See the module docstring. ``audit``: run :func:`audit_engine` after every round, and before
    it too with ``audit_before``."""

    def __init__(self, core: EngineCore, *, audit: bool = True, audit_before: bool = True, keep_outputs: bool = True):
        self.core = core
        if not isinstance(core.executor, FaultyExecutor):
            core.executor = FaultyExecutor(core.executor)
        self.executor: FaultyExecutor = core.executor
        self.executor.on_execute = self._during_round
        self.audit = audit
        self.audit_before = audit_before  # also audit before each round (after arrivals, aborts, probes)
        self.keep_outputs = keep_outputs
        self.subs: list[_Submission] = []
        self.between_rounds: list[Callable[[Harness, int], None]] = []
        self.on_finished: list[Callable[[int, RequestOutput], None]] = []
        self.tick = 0
        self.aborts = 0
        self.audits = 0
        self._key_of: dict[int, int] = {}  # request id -> submission index
        self._live: set[int] = set()  # submission indices accepted and not finished
        self._next = 0  # submissions are added in at_round order
        self._follow_ups: list[int] = []  # follow-ups not arrived yet
        self._last_at_round = 0  # of the last submission in at_round order
        self._outputs: dict[int, RequestOutput] = {}
        self._refused: dict[int, str] = {}
        self._in_round = False
        self.violations: list[str] = []  # found inside a step (where the engine would recover from them)
        self.pinned: list[Node] = []  # nodes a scenario locked itself (the audit allows for them)
        self.checkpoint_reads = 0  # rows that copied a checkpoint, each checked to be committed
        self._forget_after_round: list[int] = []  # the running round still names them

    def submit(
        self, prompt: Sequence[int], params: SamplingParams, *, at_round: int = 0, abort_at: int | None = None,
        mid_round: bool = False,
    ) -> int:
        """Adds a request to the scenario (arriving before round ``at_round``); returns its index.
        ``abort_at``: abort it before that round, or while that round runs (``mid_round``)."""
        if at_round < self._last_at_round:
            raise ValueError("submissions must come in at_round order")
        self._last_at_round = at_round
        self.subs.append(_Submission(list(prompt), params, at_round, abort_at, mid_round))
        return len(self.subs) - 1

    def follow_up(self, prompt: Sequence[int], params: SamplingParams) -> int:
        """Adds a request decided while the scenario runs, arriving before the next round (a
        conversation's next turn, sent once the turn before it finished); returns its index."""
        self.subs.append(_Submission(list(prompt), params, self.tick + 1, None, False, follow_up=True))
        self._follow_ups.append(len(self.subs) - 1)
        return len(self.subs) - 1

    def request_id(self, key: int) -> int | None:
        return self.subs[key].request_id

    def abort(self, key: int) -> bool:
        """Aborts submission ``key`` now if it is still open; True if it was."""
        rid = self.subs[key].request_id
        if rid is None or key not in self._live:
            return False
        out = self.core.abort(rid)
        if out is None:
            return False
        self.aborts += 1
        self._finish(key, out)
        return True

    def _finish(self, key: int, out: RequestOutput) -> None:
        self._live.discard(key)
        if out.finish_reason not in ENDINGS:
            raise AssertionError(f"request {out.request_id} ended with an unknown reason {out.finish_reason!r}")
        if out.finish_reason == "error" and not out.error:
            raise AssertionError(f"request {out.request_id} ended with an error and no message")
        for fn in self.on_finished:
            fn(key, out)
        if self.keep_outputs:
            self._outputs[key] = out
        if self._in_round:
            self._forget_after_round.append(out.request_id)
        else:
            self.core.forget(out.request_id)

    def _during_round(self, plan: RoundPlan) -> None:
        if self.audit and any(row.copy_from is not None for row in plan.rows):
            readable = committed_slots(self.core)
            requests = self.core.scheduler.requests
            for row in plan.rows:
                own = requests[row.request_id].slot if row.num_draft and row.request_id in requests else None
                if row.copy_from is not None and row.copy_from != own:  # a verify row reads its own slot
                    if row.copy_from not in readable:
                        what = f"request {row.request_id} reads slot {row.copy_from}: not a committed checkpoint"
                        self.violations.append(what)
                        raise InvariantError(self.violations[-1])
                    self.checkpoint_reads += 1
        for row in plan.rows:
            key = self._key_of.get(row.request_id)
            if key is not None:
                sub = self.subs[key]
                if sub.mid_round and sub.abort_at is not None and sub.abort_at <= self.tick:
                    self.abort(key)

    def _arrivals(self) -> None:
        due = [k for k in self._follow_ups if self.subs[k].at_round <= self.tick]
        self._follow_ups = [k for k in self._follow_ups if self.subs[k].at_round > self.tick]
        for key in due:
            self._accept(key)
        while self._next < len(self.subs) and (
            self.subs[self._next].follow_up or self.subs[self._next].at_round <= self.tick
        ):
            key = self._next
            self._next += 1
            if not self.subs[key].follow_up:
                self._accept(key)

    def _accept(self, key: int) -> None:
        """Submission ``key`` arrives: added to the engine, or refused with a clear reason."""
        sub = self.subs[key]
        try:
            sub.request_id = self.core.add_request(sub.prompt, sub.params)
        except ValueError as exc:  # refused with a clear reason: nothing was queued
            self._refused[key] = str(exc)
            return
        self._key_of[sub.request_id] = key
        self._live.add(key)

    def _check(self) -> None:
        if self.audit:
            audit_engine(self.core, self.pinned)
            self.audits += 1

    def run(self, max_ticks: int = 100_000) -> HarnessReport:
        """Runs until every submission arrived and finished; raises on a livelock (``max_ticks``)."""
        core = self.core
        while self._next < len(self.subs) or self._live or self._follow_ups:
            if self.tick >= max_ticks:
                raise AssertionError(f"livelock: {len(self._live)} requests open after {max_ticks} ticks")
            self._arrivals()
            for key in list(self._live):
                sub = self.subs[key]
                if sub.abort_at is not None and not sub.mid_round and sub.abort_at <= self.tick:
                    self.abort(key)
            for fn in self.between_rounds:
                fn(self, self.tick)
            if self.audit_before:
                self._check()
            self._in_round = True
            try:
                changed = core.step()
            finally:
                self._in_round = False
            inner = _unwrapped(self.executor)
            found = self.violations + (inner.violations if isinstance(inner, ShadowExecutor) else [])
            if found:  # a check failed inside the step: the engine recovered, the scenario must not pass
                raise InvariantError(f"round {core.num_rounds}: {found[0]}")
            for rid in self._forget_after_round:
                core.forget(rid)
            self._forget_after_round.clear()
            for out in changed:
                key = self._key_of.get(out.request_id)
                if out.finished and key is not None and key in self._live:
                    self._finish(key, out)
            self._check()
            self.tick += 1
        assert_drained(core)
        preempted = sum(r.preempted for r in core.records)
        return HarnessReport(
            outputs=dict(self._outputs),
            refused=dict(self._refused),
            ticks=self.tick,
            rounds=core.num_rounds,
            aborts=self.aborts,
            audits=self.audits,
            step_failures=core.num_step_failures,
            resets=self.executor.resets,
            preemptions=preempted,
        )


def shadow_engine(
    config: EngineConfig,
    *,
    num_pages: int,
    num_slots: int,
    max_model_len: int,
    chunk: int = 16,
    hybrid: bool = True,
    vocab: int = 1000,
    faults: tuple[Fault, ...] = (),
    fail_reset: bool = False,
    num_host_slots: int = 0,
    num_host_pages: int = 0,
) -> EngineCore:
    """An engine assembled like the model engine (``assemble_engine``) over a :class:`ShadowExecutor`
    that checks every context against the request's real tokens; wrapped in a :class:`FaultyExecutor`.
    ``num_host_slots`` / ``num_host_pages``: a host tier of that many checkpoints and KV pages (its
    spills and restores replayed by the shadow executor)."""
    clock = VirtualClock()
    spec = EngineSpec(
        config=config,
        hybrid=hybrid,
        chunk_sizes=(chunk,) if hybrid else (),
        num_pages=num_pages,
        num_slots=num_slots,
        num_host_slots=num_host_slots,
        num_host_pages=num_host_pages,
        max_model_len=max_model_len,
    )
    verify = config.scheduler.speculative is not None
    shadow = ShadowExecutor(spec.cache_config.page_size, hybrid=hybrid, vocab=vocab, clock=clock, verify=verify)
    core = assemble_engine(spec, lambda shapes: FaultyExecutor(shadow, faults, fail_reset=fail_reset), clock=clock)
    shadow.truth = lambda rid: core.scheduler.requests[rid].tokens
    return core


def _unwrapped(executor: Executor) -> Executor:
    """The executor under any fault wrappers."""
    while isinstance(executor, FaultyExecutor):
        executor = executor.inner
    return executor


def shadow_of(core: EngineCore) -> ShadowExecutor:
    ex = _unwrapped(core.executor)
    if not isinstance(ex, ShadowExecutor):
        raise TypeError(f"the engine runs {type(ex).__name__}, not the shadow executor")
    return ex
