"""Fault injection at the executor boundary: a wrapper that makes chosen rounds fail, runs a hook
between planning and commit, and can make recovery itself fail.

``FaultyExecutor(inner, faults=(Fault(round=3),))`` raises :class:`InjectedFault` in the fourth call
of ``execute`` (0-based ``round`` counts calls, failed ones included). ``Fault.when`` says what the
failed step did first: ``before`` (nothing ran: a launch or shape error), ``after`` (the step ran
and its result is lost: a host-side error after the device finished) or ``donated`` (the step ran,
its result is lost and the donated pools are gone: a device error). ``on_execute(plan)`` runs before
every step, after planning and before commit: the place to abort requests whose round is running.
``fail_reset`` makes every later ``reset`` raise (recovery fails: the engine must stop, loudly).
With overlap (an inner executor whose capabilities say so) the faults hit ``launch`` calls.
No JAX here.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Protocol, cast

from radixflow_jax.engine.protocol import Executor, ExecutorCapabilities, LaunchHandle, OverlapExecutor, StepResult
from radixflow_jax.runner.inputs import SamplingRow
from radixflow_jax.scheduler.plan import RoundPlan

FAULT_KINDS = ("before", "after", "donated")


class InjectedFault(RuntimeError):
    """A simulated device or step error (raised by :class:`FaultyExecutor`)."""


@dataclasses.dataclass(frozen=True)
class Fault:
    """Fail ``times`` consecutive ``execute`` calls from call index ``round`` on, ``when`` as in the
    module docstring."""

    round: int
    when: str = "donated"
    times: int = 1

    def __post_init__(self) -> None:
        if self.when not in FAULT_KINDS:
            raise ValueError(f"fault kind {self.when!r}: expected one of {', '.join(FAULT_KINDS)}")
        if self.round < 0 or self.times < 1:
            raise ValueError(f"fault round {self.round} must be >= 0 and times {self.times} >= 1")

    def hits(self, call: int) -> bool:
        return self.round <= call < self.round + self.times


class FaultTarget(Executor, Protocol):
    """An executor faults can hit (with ``capabilities.overlap``, an :class:`OverlapExecutor`):
    ``lose_device_state`` destroys what a failed step with donated pools destroys (the model
    executor deletes its pool buffers, the shadow scrambles its memory, the simulated executor
    holds nothing)."""

    def lose_device_state(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class _FaultyLaunch:
    """A launched round: the inner executor's handle, the fault that hits it (or None), its call index."""

    inner: LaunchHandle
    fault: Fault | None
    call: int

    @property
    def compile_s(self) -> float:
        return self.inner.compile_s


class FaultyExecutor:
    """Wraps an executor; see the module docstring. Counts ``calls``, ``faults_raised``, ``resets``.
    Its capabilities are the inner executor's."""

    def __init__(
        self,
        inner: FaultTarget,
        faults: tuple[Fault, ...] = (),
        *,
        on_execute: Callable[[RoundPlan], None] | None = None,
        fail_reset: bool = False,
    ):
        self.inner = inner
        self.capabilities: ExecutorCapabilities = inner.capabilities
        self.faults = tuple(faults)
        self._by_call = {call: f for f in reversed(self.faults) for call in range(f.round, f.round + f.times)}
        self.on_execute = on_execute
        self.fail_reset = fail_reset
        self.calls = 0
        self.faults_raised = 0
        self.resets = 0

    def execute(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow]) -> StepResult:
        call = self.calls
        self.calls += 1
        if self.on_execute is not None:
            self.on_execute(plan)
        fault = self._by_call.get(call)  # the first listed fault wins where two overlap
        if fault is None:
            return self.inner.execute(plan, sampling)
        self.faults_raised += 1
        if fault.when != "before":
            self.inner.execute(plan, sampling)
        if fault.when == "donated":
            self.inner.lose_device_state()
        raise InjectedFault(f"injected {fault.when} fault in step call {call}")

    def launch(
        self, plan: RoundPlan, sampling: Mapping[int, SamplingRow], prev: _FaultyLaunch | None = None
    ) -> _FaultyLaunch:
        """Overlap: a ``before`` fault raises here (nothing was dispatched); ``after`` and ``donated``
        faults dispatch the step and raise at ``collect``, as a device error surfaces when the result
        is fetched."""
        call = self.calls
        self.calls += 1
        if self.on_execute is not None:
            self.on_execute(plan)
        fault = self._by_call.get(call)
        if fault is not None and fault.when == "before":
            self.faults_raised += 1
            raise InjectedFault(f"injected before fault in step call {call}")
        inner = cast(OverlapExecutor, self.inner)  # launch is called only when capabilities.overlap
        return _FaultyLaunch(inner.launch(plan, sampling, None if prev is None else prev.inner), fault, call)

    def collect(self, handle: _FaultyLaunch) -> StepResult:
        result = cast(OverlapExecutor, self.inner).collect(handle.inner)
        fault = handle.fault
        if fault is None:
            return result
        self.faults_raised += 1
        if fault.when == "donated":
            self.inner.lose_device_state()
        raise InjectedFault(f"injected {fault.when} fault in step call {handle.call}")

    def reset(self) -> None:
        self.resets += 1
        if self.fail_reset:
            raise InjectedFault("injected failure while rebuilding the pools")
        self.inner.reset()
