"""Warm-up in the background: a served engine compiles the step variants it has not compiled yet
while it is idle, so the server listens at once and requests never queue behind a full warm-up.

:class:`BackgroundWarmup` is the idle work of a :class:`~radixflow_jax.replicas.background.BackgroundEngine`:
the engine thread calls it only when no request is queued, running or in flight, and it compiles
and primes one variant per call (a request that arrives meanwhile waits for at most that one
compile). A variant that a request needed first is compiled by that round and skipped here. The
first call also compiles the prompt scoring program (``ModelExecutor.warmup``; the last call makes
sure of it). When the last variant is done the compile guard turns on (``CompiledStep.strict``): from then on a
compile would be a bug, and the engine refuses it.

Invariants: runs only on the engine thread (the executor's pools are the engine's); ``total`` is
fixed and ``compiled`` counts the variants compiled after the last call (fewer when a round's
compile dropped some under ``vm.max_map_count``: the guard then never turns on), so another thread
may read them for ``/health``.
"""

from __future__ import annotations

import logging
from typing import Any

from radixflow_jax.engine.core import EngineCore


class BackgroundWarmup:
    """Every variant of ``executor.shapes`` not compiled yet, one per idle call."""

    def __init__(self, executor: Any):
        self.executor = executor
        self._todo = [v for v in executor.shapes.variants() if not executor.step.is_compiled(v)]
        self.total = len(executor.shapes.variants())
        self.compiled = self.total - len(self._todo)
        self.failed: str | None = None
        self._finished = False  # set after the guard turns on: ``ready`` implies the guard

    @property
    def phase(self) -> str:
        """``warming`` while variants remain, else ``ready`` (``failed`` after a compile error)."""
        if self.failed is not None:
            return "failed"
        return "ready" if self._finished else "warming"

    def __call__(self, core: EngineCore) -> bool:
        """Compiles and primes the next variant; False once there is nothing left to do."""
        step = self.executor.step
        while self._todo and step.is_compiled(self._todo[0]):
            self._todo.pop(0)  # compiled by a round that needed it first
        if self._todo:
            variant = self._todo[0]
            try:
                self.executor.warmup([variant], first=self.compiled + 1, total=self.total)
            except Exception as exc:  # serving goes on with lazy compiles; the phase says why
                self.failed = f"{type(exc).__name__}: {exc}"
                logging.getLogger(__name__).error("background warm-up stopped at %s: %s", variant, self.failed)
                return False
            if not step.is_compiled(variant):  # another compile would pass vm.max_map_count (runner/mapbudget.py)
                self.failed = f"stopped: {step.budget.describe()}"
                logging.getLogger(__name__).error("background warm-up stopped at %s: %s", variant, self.failed)
                return False
            self._todo.pop(0)
        self.compiled = sum(step.is_compiled(v) for v in self.executor.shapes.variants())
        if self._todo:
            return True
        if self.compiled < self.total:  # a round's compile dropped ones warmed before (vm.max_map_count)
            self.failed = f"stopped: {self.total - self.compiled} variants dropped, {step.budget.describe()}"
            logging.getLogger(__name__).error("background warm-up ends without the guard: %s", self.failed)
            return False
        try:  # the page copy and prompt scoring programs (compiled already unless rounds compiled every variant)
            self.executor.warmup([])
        except Exception as exc:
            self.failed = f"{type(exc).__name__}: {exc}"
            logging.getLogger(__name__).error("background warm-up stopped at prompt scoring: %s", self.failed)
            return False
        step.strict = True  # every variant a round can need is compiled: a compile now is a bug
        self._finished = True
        return False
