"""Failure handling of the engine loop (``docs/reliability.md``), apart from the loop itself.

A round whose step raised is not committed. :func:`is_fatal` says which errors are bugs rather
than device errors (they propagate); :func:`rebuild` puts the scheduler and the executor back into
a state every running request can recompute from; :func:`failure_text` is the error a request
ends with when it ran in too many failed rounds in a row. ``EngineCore`` counts the failures.

Invariants after :func:`rebuild` returns: no round is in flight, every running request is back in
the waiting queue holding nothing, the radix cache is empty and no page or state slot is in use.
If any of that cannot be reached, :class:`EngineFailure` is raised: the engine cannot serve.
No JAX here.
"""

from __future__ import annotations

from radixflow_jax.engine.config import EngineFailure
from radixflow_jax.engine.protocol import Executor
from radixflow_jax.scheduler.scheduler import Scheduler


def is_fatal(exc: Exception) -> bool:
    """A broken invariant (``AssertionError``) or a guard (an exception class that sets
    ``recoverable = False``, e.g. the compile guard's): a bug, not a device error."""
    return isinstance(exc, AssertionError) or not getattr(exc, "recoverable", True)


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
