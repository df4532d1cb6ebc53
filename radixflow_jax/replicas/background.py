"""Runs an :class:`EngineCore` on its own thread so servers and clients can add, abort and stream
requests from other threads or an asyncio loop while rounds keep running.

Invariants:
  * Only the engine thread touches the core. Other threads talk to it through a locked inbox that
    the thread drains before every round, so nothing accepted is lost.
  * Every accepted request gets exactly one final event (finished or aborted); a request that ended
    with an error (its rounds' step kept failing, ``EngineCore`` recovery) gets
    :class:`RequestFailedError`; an engine error (recovery failed, or an error outside the step)
    is logged, fails every open request with that error and stops the thread instead of hanging clients;
    ``shutdown`` aborts open requests and fails those not yet accepted. A bad request fails alone.
  * ``observer`` (optional) sees every delivered event and every round record on the engine thread;
    with ``trim_records`` the core's record list is emptied after each round (long-running servers).
  * ``call(fn)`` runs ``fn(core)`` on the engine thread between rounds (e.g. a prefix-cache reset).
  * A handle holds the latest snapshot of its request and a wake-up, not a queue of copies
    (:class:`RequestHandle`): a reader that falls behind skips to the newest state.
  * ``step_running_for`` is the heartbeat: how long the step running now has run (``/health``).
  * A request for several samples (``n`` / ``best_of``) is one inbox item with one handle per
    sibling (``submit_group``), added to the core in one ``EngineCore.add_group``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, AsyncIterator, Callable, Iterator, Protocol, Sequence

from radixflow_jax.engine.config import RoundRecord
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.engine.intake import CheckedRequest
from radixflow_jax.engine.params import RequestOutput, SamplingParams


class EngineDeadError(RuntimeError):
    """The engine thread stopped after an error; the message carries it."""


class RequestFailedError(RuntimeError):
    """This request ended with an error (the step of the rounds it ran in failed); the engine goes on."""


@dataclasses.dataclass
class _Pending:
    request: CheckedRequest
    handles: tuple[RequestHandle, ...]  # one per sample (``n`` / ``best_of`` siblings), index order


class RequestHandle:
    """A submitted request: ``stream()`` yields snapshots as tokens arrive; ``result()`` waits.

    Backpressure: the handle keeps only the latest snapshot (or the error that ended the request)
    and a wake-up, never a queue of copies, so a reader that falls behind costs one snapshot of
    memory and, when it reads again, gets the newest state (a reader computes its deltas from what
    it last saw). The final snapshot always reaches the reader: nothing replaces a final event."""

    def __init__(self, engine: BackgroundEngine):
        self._engine = engine
        self.request_id: int | None = None
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._latest: RequestOutput | BaseException | None = None  # newest event not read yet
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self._final: RequestOutput | BaseException | None = None  # the final event, once consumed

    @property
    def has_unread(self) -> bool:
        """An event was delivered that no reader took yet."""
        return self._latest is not None

    def _take(self, item: RequestOutput | BaseException) -> RequestOutput:
        """Returns a consumed event (raises an error event); remembers the final one."""
        if isinstance(item, BaseException) or item.finished:
            self._final = item
        if isinstance(item, BaseException):
            raise item
        return item

    def _push(self, item: RequestOutput | BaseException) -> None:
        with self._lock:
            last = self._latest
            if not (isinstance(last, BaseException) or (last is not None and last.finished)):
                self._latest = item  # a newer state replaces an unread one; a final event stays
            waiter, self._waiter = self._waiter, None
            self._ready.notify_all()
        if waiter is not None:
            loop, fut = waiter
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:  # the waiting loop is closed: nobody listens any more
                pass

    def _pop(self) -> RequestOutput | BaseException | None:
        """Takes the unread event (under the lock)."""
        item, self._latest = self._latest, None
        return item

    def stream(self, timeout: float | None = None) -> Iterator[RequestOutput]:
        """Yields the newest snapshot each time one arrived since the last, the final one last
        (``queue.Empty`` after ``timeout`` seconds without an event). Once the final event was
        consumed, a new stream yields just that."""
        if self._final is not None:
            yield self._take(self._final)
            return
        while True:
            with self._ready:
                if not self._ready.wait_for(lambda: self._latest is not None, timeout):
                    raise queue.Empty
                item = self._pop()
            assert item is not None
            out = self._take(item)
            yield out
            if out.finished:
                return

    def result(self, timeout: float | None = None) -> RequestOutput:
        last = None
        for last in self.stream(timeout):
            pass
        assert last is not None
        return last

    async def astream(self) -> AsyncIterator[RequestOutput]:
        """Like :meth:`stream` on an asyncio loop. Waiting parks a future that the engine thread
        resolves (no executor thread blocks), so a cancelled wait loses no event."""
        loop = asyncio.get_running_loop()
        if self._final is not None:
            yield self._take(self._final)
            return
        while True:
            with self._lock:
                item = self._pop()
                if item is None:
                    fut: asyncio.Future[None] = loop.create_future()
                    self._waiter = (loop, fut)
            if item is None:
                try:
                    await fut
                finally:
                    with self._lock:
                        if self._waiter is not None and self._waiter[1] is fut:
                            self._waiter = None
                continue
            out = self._take(item)
            yield out
            if out.finished:
                return

    def abort(self) -> None:
        self._engine.abort(self)


def _snapshot(out: RequestOutput) -> RequestOutput:
    """A copy the engine thread no longer mutates (token and logprob lists grow in place)."""
    logprobs = list(out.logprobs) if out.logprobs is not None else None
    return dataclasses.replace(out, token_ids=list(out.token_ids), logprobs=logprobs)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class EngineObserver(Protocol):
    """Called on the engine thread: ``events`` delivered to clients (final ones included, aborts
    too), ``records`` of the rounds just run. Must be quick and must not raise."""

    def __call__(self, events: Sequence[RequestOutput], records: Sequence[RoundRecord]) -> None: ...


class BackgroundEngine:
    def __init__(
        self,
        core: EngineCore,
        *,
        observer: EngineObserver | None = None,
        trim_records: bool = False,
        idle: Callable[[EngineCore], bool] | None = None,
    ):
        """``idle``: work for the engine thread while no request is queued, running or in flight
        (e.g. :class:`~radixflow_jax.replicas.warmup.BackgroundWarmup`), one unit per call, which
        returns False when there is none left; requests that arrive wait for the unit in progress."""
        self.core = core
        self._observer = observer
        self._trim = trim_records
        self._idle = idle
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._inbox: list[_Pending] = []
        self._aborts: list[RequestHandle] = []
        self._calls: list[tuple[Callable[[EngineCore], Any], concurrent.futures.Future[Any]]] = []
        self._handles: dict[int, RequestHandle] = {}
        self._stopped = False
        self._error: BaseException | None = None
        self._step_started: float | None = None  # heartbeat: monotonic start of the step running now
        self._thread = threading.Thread(target=self._run, name="radixflow-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt: Sequence[int], params: SamplingParams) -> RequestHandle:
        """Queues a request. Validation errors (``EngineCore.check``, the request's one check) raise
        here, in the caller's thread."""
        return self.enqueue(self.core.check(prompt, params))

    def enqueue(self, request: CheckedRequest) -> RequestHandle:
        """Queues a request checked by this engine's core or an identical one (a replica's)."""
        if request.params.num_samples > 1:
            raise ValueError("a request with n > 1 or best_of has one handle per sample: use submit_group / enqueue_group")
        return self.enqueue_group(request)[0]

    def submit_group(self, prompt: Sequence[int], params: SamplingParams) -> list[RequestHandle]:
        """:meth:`submit` for a request that may ask for several samples: one handle per sibling
        (``engine/siblings.py``), in index order, queued together (their prompt is computed once)."""
        return self.enqueue_group(self.core.check(prompt, params))

    def enqueue_group(self, request: CheckedRequest) -> list[RequestHandle]:
        """Queues a checked request's siblings (one for ``n == 1``); one handle each."""
        handles = tuple(RequestHandle(self) for _ in range(request.params.num_samples))
        with self._wake:  # checked under the lock: the thread fails or drops the inbox under it too
            if self._error is not None:
                raise EngineDeadError(f"engine stopped: {self._error!r}")
            if self._stopped:
                raise EngineDeadError("engine was shut down")
            self._inbox.append(_Pending(request, handles))
            self._wake.notify()
        return list(handles)

    def abort(self, handle: RequestHandle) -> None:
        with self._wake:
            self._aborts.append(handle)
            self._wake.notify()

    def call(self, fn: Callable[[EngineCore], Any]) -> concurrent.futures.Future[Any]:
        """Runs ``fn(core)`` on the engine thread before the next round; the future holds its result
        (or its exception). Fails at once with :class:`EngineDeadError` if the engine stopped."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._wake:
            if self._error is not None or self._stopped:
                fut.set_exception(EngineDeadError(f"engine stopped: {self._error!r}"))
                return fut
            self._calls.append((fn, fut))
            self._wake.notify()
        return fut

    @property
    def num_waiting(self) -> int:
        """Requests accepted but not yet admitted to a round (inbox + the scheduler's waiting queue);
        a group of ``n`` siblings counts as ``n`` requests."""
        return sum(len(item.handles) for item in list(self._inbox)) + len(self.core.scheduler.waiting)

    @property
    def step_running_for(self) -> float:
        """Seconds the engine thread has been inside the step running now (0.0 between steps and
        during idle work such as the background warm-up): the heartbeat ``/health`` reads."""
        started = self._step_started
        return 0.0 if started is None else time.monotonic() - started

    @property
    def num_running(self) -> int:
        return len(self.core.scheduler.running)

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the engine thread, if any."""
        return self._error

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stops the thread after the current round; open requests end with an ``abort`` event and
        requests not yet accepted fail with :class:`EngineDeadError`."""
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(timeout)

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    def _drain(self) -> None:
        with self._wake:
            while not (self._inbox or self._aborts or self._calls or self.core.has_unfinished() or self._stopped):
                if self._idle is not None:
                    break  # nothing to serve: the caller runs a unit of idle work
                self._wake.wait()
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
            calls, self._calls = self._calls, []
        for fn, fut in calls:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(self.core))
                except Exception as exc:  # the caller gets it; the engine keeps going
                    fut.set_exception(exc)
        delivered: list[RequestOutput] = []
        for item in inbox:
            try:
                rids = self.core.add_group(item.request)
            except Exception as exc:  # checked already; should the scheduler refuse it, it fails alone
                for handle in item.handles:
                    handle._push(exc)
                continue
            for rid, handle in zip(rids, item.handles):
                handle.request_id = rid
                self._handles[rid] = handle
        for handle in aborts:
            if handle.request_id is not None and handle.request_id in self._handles:
                out = self.core.abort(handle.request_id)
                if out is not None:
                    event = _snapshot(out)
                    handle._push(event)
                    delivered.append(event)
                    self.core.forget(handle.request_id)  # delivered: keep no per-request state
                self._handles.pop(handle.request_id, None)
        if delivered:
            self._observe(delivered, ())

    def _observe(self, events: Sequence[RequestOutput], records: Sequence[RoundRecord]) -> None:
        if self._observer is None:
            return
        try:
            self._observer(events, records)
        except Exception:  # a metrics bug must not stop serving; it is logged, not hidden
            logging.getLogger(__name__).exception("engine observer failed")

    def _run(self) -> None:
        try:
            while not self._stopped:
                self._drain()
                if self._stopped:
                    break
                if self._idle is not None and not self.core.has_unfinished():
                    if not self._idle(self.core):
                        self._idle = None
                    continue
                delivered = []
                seen = len(self.core.records)
                self._step_started = time.monotonic()
                try:
                    outs = self.core.step()
                finally:
                    self._step_started = None
                for out in outs:
                    handle = self._handles.get(out.request_id)
                    if handle is None:
                        continue
                    event = _snapshot(out)
                    handle._push(RequestFailedError(out.error) if out.finish_reason == "error" else event)
                    delivered.append(event)
                    if out.finished:
                        self._handles.pop(out.request_id, None)
                        self.core.forget(out.request_id)  # delivered: keep no per-request state
                self._observe(delivered, self.core.records[seen:])
                if self._trim:
                    self.core.records.clear()
            self._close()
        except BaseException as exc:  # fail every open request instead of hanging it
            logging.getLogger(__name__).error("engine stopped, failing every open request: %r", exc, exc_info=exc)
            self._error = exc
            dead = EngineDeadError(f"engine stopped: {exc!r}")
            for handle in list(self._handles.values()):
                handle._push(dead)
            with self._wake:
                for item in self._inbox:
                    for handle in item.handles:
                        handle._push(dead)
                self._inbox.clear()
                for _, fut in self._calls:
                    fut.set_exception(dead)
                self._calls.clear()
            raise

    def _close(self) -> None:
        """After shutdown: every open request gets its final (abort) event, the inbox fails."""
        for rid, handle in list(self._handles.items()):
            out = self.core.abort(rid)
            if out is not None:
                handle._push(_snapshot(out))
        self._handles.clear()
        with self._wake:
            inbox, self._inbox = self._inbox, []
            calls, self._calls = self._calls, []
        for item in inbox:
            for handle in item.handles:
                handle._push(EngineDeadError("engine was shut down"))
        for _, fut in calls:
            fut.set_exception(EngineDeadError("engine was shut down"))
