"""The engine loop's host-time bookkeeping: what a ``RoundRecord``'s ``plan_s`` / ``host_s`` /
``overlapped`` say, and first-use compiles taken off the serving clock. No JAX here.

``host_s`` is the host time on a round's critical path: from the previous round's result to this
round's dispatch, the host work done while no round was in flight (the tail of the previous
commit, this round's plan and build). It is 0 for a round launched while the previous one still
ran (overlap). A variant compiled on first use is never part of it: the compile seconds come off
the engine's :class:`~radixflow_jax.engine.config.ServingClock` (when the engine runs on one) once,
at the launch that compiled (overlap) or when the result of ``execute`` came back.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from radixflow_jax.engine.config import ServingClock
from radixflow_jax.engine.protocol import StepResult
from radixflow_jax.scheduler.plan import RoundPlan


@dataclasses.dataclass(frozen=True)
class RoundTimes:
    """One round's host timings, as its ``RoundRecord`` keeps them."""

    plan_s: float
    host_s: float
    overlapped: bool  # launched while the previous round was in flight


class RoundTimer:
    """Times the rounds of one engine. Call order per round: :meth:`start` (a ``step`` begins, or a
    launch after a commit), :meth:`plan`, then :meth:`launched` + :meth:`collected` (overlap) or
    :meth:`executed` (synchronous), and :meth:`committed` at the end of the commit. :meth:`reset`
    after a failed round (no commit tail carries over)."""

    def __init__(self, clock: Callable[[], float]):
        self._serving = clock if isinstance(clock, ServingClock) else None
        self._start = 0.0  # perf_counter when the current host work began
        self._fetched = 0.0  # perf_counter when the latest result came back
        self._tail = 0.0  # host time after the latest result was fetched, inside step()

    def start(self) -> None:
        self._start = time.perf_counter()

    def plan(self, schedule: Callable[[], RoundPlan]) -> tuple[RoundPlan, float]:
        """``schedule()``'s plan and the seconds it took."""
        t0 = time.perf_counter()
        plan = schedule()
        return plan, time.perf_counter() - t0

    def launched(self, plan_s: float, compile_s: float, *, overlapped: bool) -> RoundTimes:
        """A launch returned: its compile comes off the clock now (the round in flight commits after
        this); a launch while nothing ran has the host time since :meth:`start` on the critical path."""
        self._pause(compile_s)
        host_s = 0.0 if overlapped else self._tail + (time.perf_counter() - self._start)
        return RoundTimes(plan_s, host_s, overlapped)

    def collected(self, times: RoundTimes, result: StepResult) -> RoundTimes:
        """A launched round's result came back: a launch that did not overlap loses its compile time."""
        self._fetched = time.perf_counter()
        if times.overlapped:
            return times
        return dataclasses.replace(times, host_s=max(0.0, times.host_s - result.compile_s))

    def executed(self, plan_s: float, result: StepResult) -> RoundTimes:
        """A synchronous round's result came back (launch and collect in one ``execute``)."""
        self._fetched = time.perf_counter()
        self._pause(result.compile_s)
        return RoundTimes(plan_s, self._tail + plan_s + result.build_s, False)

    def committed(self) -> None:
        self._tail = time.perf_counter() - self._fetched

    def reset(self) -> None:
        self._tail = 0.0

    def _pause(self, compile_s: float) -> None:
        if compile_s and self._serving is not None:
            self._serving.paused_s += compile_s
