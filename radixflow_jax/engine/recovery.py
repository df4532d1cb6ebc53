"""Failure handling of the engine loop (``docs/reliability.md``), apart from the loop itself.

A round whose step raised is not committed. :func:`is_fatal` says which errors are bugs rather
than device errors (they propagate); :class:`FailedRounds` counts failed rounds and recovers from
one: :func:`rebuild` puts the scheduler and the executor back into a state every running request
can recompute from, and a request in more than ``step_retries`` failed rounds in a row ends with
``finish_reason='error'`` and :func:`failure_text`. A launch that raised a recoverable error is
reported to the loop as :class:`LaunchFailed` (nothing of that round runs).

Invariants after :func:`rebuild` returns: no round is in flight, every running request is back in
the waiting queue holding nothing, the radix cache is empty and no page or state slot is in use.
If any of that cannot be reached, or more than ``max_failed_rounds`` rounds fail in a row,
:class:`EngineFailure` is raised: the engine cannot serve. No JAX here.
"""

from __future__ import annotations

import logging
from typing import Mapping

from radixflow_jax.engine.config import EngineFailure
from radixflow_jax.engine.protocol import Executor
from radixflow_jax.engine.record import RequestRecord
from radixflow_jax.scheduler.plan import RoundPlan
from radixflow_jax.scheduler.request import Request
from radixflow_jax.scheduler.scheduler import Scheduler

log = logging.getLogger(__name__)


def is_fatal(exc: Exception) -> bool:
    """A broken invariant (``AssertionError``) or a guard (an exception class that sets
    ``recoverable = False``, e.g. the compile guard's): a bug, not a device error."""
    return isinstance(exc, AssertionError) or not getattr(exc, "recoverable", True)


class LaunchFailed(Exception):
    """A round's launch raised a recoverable error (nothing of it runs): its plan and the error."""

    def __init__(self, plan: RoundPlan, exc: Exception):
        super().__init__(repr(exc))
        self.plan, self.exc = plan, exc


class FailedRounds:
    """The engine's failure counts and its recovery from a failed round.

    Invariants: ``total`` counts every failed round; ``in_a_row`` the failed rounds since the last
    committed one (:meth:`committed` sets it back to 0, and each request's ``failures`` of a round
    it ran in, once any round has failed)."""

    def __init__(self, *, step_retries: int, max_failed_rounds: int):
        if step_retries < 0 or max_failed_rounds < 1:
            raise ValueError(f"step_retries={step_retries} must be >= 0, max_failed_rounds={max_failed_rounds} >= 1")
        self.step_retries = step_retries
        self.max_failed_rounds = max_failed_rounds
        self.total = 0
        self.in_a_row = 0

    def committed(self, plan: RoundPlan, records: Mapping[int, RequestRecord]) -> None:
        """``plan``'s round committed: its requests' retry counts start over."""
        self.in_a_row = 0
        if self.total:
            for row in plan.rows:
                rec = records.get(row.request_id)
                if rec is not None:
                    rec.failures = 0

    def recover(
        self,
        plan: RoundPlan,
        exc: Exception,
        scheduler: Scheduler,
        executor: Executor,
        records: Mapping[int, RequestRecord],
    ) -> list[tuple[Request, str]]:
        """After ``plan``'s step raised ``exc``: counts it (:class:`EngineFailure` past
        ``max_failed_rounds`` in a row), rebuilds, and finishes with ``'error'`` every request of the
        round that ran out of retries; returns those requests with their error text (the engine
        finalizes their outputs)."""
        self.total += 1
        self.in_a_row += 1
        restored = sum(m.kind == "restore" for m in plan.state_moves)  # host tier -> device, before the step
        pages = sum(m.kind == "kv_restore" for m in plan.state_moves)
        restores = ""
        if restored:
            restores = f"; its {restored} restore(s) from the host tier are void: their requests recompute"
        if pages:
            restores += f"; its {pages} KV page(s) brought back from the host tier are void (flushed with the cache)"
        log.error(
            "round %d: the step raised %r; rebuilding the pools and flushing the cache%s",
            scheduler.round_index, exc, restores,
        )  # fmt: skip
        if self.in_a_row > self.max_failed_rounds:
            raise EngineFailure(f"{self.in_a_row} rounds failed in a row; the last step raised {exc!r}") from exc
        rebuild(scheduler, executor, exc)
        failed = []
        for row in plan.rows:
            req = scheduler.requests.get(row.request_id)
            if req is None or req.is_finished:
                continue  # aborted while the round ran
            rec = records[req.request_id]
            n = rec.failures = rec.failures + 1
            if n > self.step_retries:
                rec.failures = 0
                scheduler.finish(req.request_id, "error")
                failed.append((req, failure_text(n, exc)))
        return failed


def rebuild(scheduler: Scheduler, executor: Executor, exc: Exception) -> None:
    """After the step raised ``exc``: voids the rounds in flight, requeues the running requests,
    flushes the cache and rebuilds the executor's pools (the module docstring's invariants)."""
    try:
        scheduler.drop_in_flight()  # overlap: the rounds launched after the failed one are void too
        scheduler.requeue_running()  # their device state is gone: recompute from the tokens so far
        scheduler.memory.flush()
        executor.reset()
        memory = scheduler.memory
        used = memory.pages.num_used, memory.slots.num_used if memory.slots else 0
        if any(used):
            raise RuntimeError(f"{used[0]} pages and {used[1]} state slots still in use after the flush")
    except Exception as err:
        raise EngineFailure(f"recovery from a failed step ({exc!r}) failed: {err!r}") from err


def failure_text(num_failed: int, exc: Exception) -> str:
    """The error of a request that ran in ``num_failed`` failed rounds in a row, the last raising ``exc``."""
    return f"the step failed in {num_failed} rounds in a row that this request ran in; last error: {exc!r}"
