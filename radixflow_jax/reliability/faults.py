"""Fault injection at the executor boundary: a wrapper that makes chosen rounds fail, runs a hook
between planning and commit, and can make recovery itself fail.

``FaultyExecutor(inner, faults=(Fault(round=3),))`` raises :class:`InjectedFault` in the fourth call
of ``execute`` (0-based ``round`` counts calls, failed ones included). ``Fault.when`` says what the
failed step did first: ``before`` (nothing ran: a launch or shape error), ``after`` (the step ran
and its result is lost: a host-side error after the device finished) or ``donated`` (the step ran,
its result is lost and the donated pools are gone: a device error). ``on_execute(plan)`` runs before
every step, after planning and before commit: the place to abort requests whose round is running.
``fail_reset`` makes every later ``reset`` raise (recovery fails: the engine must stop, loudly).
With overlap (an inner executor that has ``launch``/``collect``) the faults hit ``launch`` calls.
No JAX here unless a ``donated`` fault hits the model executor.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from radixflow_jax.engine.protocol import Executor, StepResult
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


def lose_device_state(executor: object) -> None:
    """Destroys what a failed step with donated pools destroys: the shadow executor's memory, or the
    model executor's pool buffers (deleted, as donation does)."""
    lose = getattr(executor, "lose_device_state", None)
    if lose is not None:
        lose()
        return
    cache = getattr(executor, "cache", None)
    if cache is None:
        return  # the simulated executor holds no device state
    import jax

    for leaf in jax.tree_util.tree_leaves(cache):
        if not leaf.is_deleted():
            leaf.delete()


class FaultyExecutor:
    """Wraps an executor; see the module docstring. Counts ``calls``, ``faults_raised``, ``resets``."""

    def __init__(
        self,
        inner: Executor,
        faults: tuple[Fault, ...] = (),
        *,
        on_execute: Callable[[RoundPlan], None] | None = None,
        fail_reset: bool = False,
    ):
        self.inner = inner
        self.faults = tuple(faults)
        self._by_call = {call: f for f in reversed(self.faults) for call in range(f.round, f.round + f.times)}
        self.on_execute = on_execute
        self.fail_reset = fail_reset
        self.calls = 0
        self.faults_raised = 0
        self.resets = 0

    def __getattr__(self, name: str) -> object:  # penalty_window, supports_logprobs, cache, ...
        return getattr(self.inner, name)

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
            lose_device_state(self.inner)
        raise InjectedFault(f"injected {fault.when} fault in step call {call}")

    @property
    def supports_overlap(self) -> bool:
        return bool(getattr(self.inner, "supports_overlap", False))

    def launch(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow], prev: object = None) -> object:
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
        return (self.inner.launch(plan, sampling, None if prev is None else prev[0]), fault, call)

    def collect(self, handle: object) -> StepResult:
        inner, fault, call = handle
        result = self.inner.collect(inner)
        if fault is None:
            return result
        self.faults_raised += 1
        if fault.when == "donated":
            lose_device_state(self.inner)
        raise InjectedFault(f"injected {fault.when} fault in step call {call}")

    def reset(self) -> None:
        self.resets += 1
        if self.fail_reset:
            raise InjectedFault("injected failure while rebuilding the pools")
        self.inner.reset()
