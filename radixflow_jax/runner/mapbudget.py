"""The process's memory-mapping budget, which compiled steps spend.

XLA:CPU loads each compiled program as JIT-linked objects, each section its own memory mapping:
one step variant of hybrid-81m took about 650 mappings (docs/perf-log.md, 2026-12-06), and Linux
caps a process at ``vm.max_map_count`` (65,530 by default). Past it the next compile fails inside
LLVM, which aborts the whole process ("Unable to allocate section memory"): a server with
speculative decoding on that model (107 variants) died that way during its warm-up.

:class:`MapBudget` reads the count (``/proc/self/maps``) and the cap before each compile, learns
the largest growth one compile caused, and says whether another fits with a margin. Where
``/proc`` does not tell (another OS), it always says yes. Callers (``runner/step.CompiledStep``,
``engine/executor.ModelExecutor.warmup``) evict or stop instead of compiling past the cap. No JAX
here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

MAPS = "/proc/self/maps"
LIMIT = "/proc/sys/vm/max_map_count"
FIRST_GUESS = 1000  # mappings one compile may add before any was measured (hybrid-81m's took ~650)
MARGIN = 4096  # mappings kept free for everything else the process maps (threads, buffers, libraries)


def map_count() -> int | None:
    """The process's memory mappings now; None where ``/proc`` does not list them."""
    try:
        with open(MAPS, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def map_limit() -> int | None:
    """``vm.max_map_count``; None where it cannot be read."""
    try:
        with open(LIMIT) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


class MapBudgetError(RuntimeError):
    """Compiling another step variant would pass ``vm.max_map_count`` and nothing can be evicted."""

    recoverable = False  # a host limit, not a device error: retrying the round cannot help


@dataclasses.dataclass
class MapBudget:
    """Whether one more compile fits under the cap. ``count`` / ``limit``: where the numbers come
    from (tests pass their own). Invariant: ``per_compile`` is the largest growth of the count
    across one compile seen so far (``measured``), else :data:`FIRST_GUESS`."""

    count: Callable[[], int | None] = map_count
    limit: int | None = dataclasses.field(default_factory=map_limit)
    per_compile: int = FIRST_GUESS
    measured: bool = False
    _before: int | None = dataclasses.field(default=None, init=False, repr=False)

    def room(self) -> bool:
        """True when one more compile fits with :data:`MARGIN` to spare (always without numbers)."""
        now = self.count()
        return now is None or self.limit is None or now + self.per_compile + MARGIN <= self.limit

    def compiling(self) -> None:
        """A compile starts: remember the count."""
        self._before = self.count()

    def compiled(self) -> None:
        """A compile ended: learn its growth."""
        now = self.count()
        if now is not None and self._before is not None:
            grew = now - self._before
            self.per_compile = max(self.per_compile, grew) if self.measured else grew
            self.measured = True
        self._before = None

    def describe(self) -> str:
        """The numbers, for a message."""
        return (f"{self.count()} of vm.max_map_count {self.limit} memory mappings in use, about "
                f"{self.per_compile} per compiled step variant")  # fmt: skip
