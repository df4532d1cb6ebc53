"""Request preparation off the event loop: decoding the body, validating it, tokenising, rendering
the chat template and converting tools, schemas, regexes and grammars run in a bounded pool of
worker threads (:class:`Preparer`), never inside an async route, so a 4 MiB prompt or a large
schema does not freeze other connections (``/health`` included).

Invariants:
  * At most ``workers`` preparations run at once; ``in_flight`` counts those submitted and not
    finished (queued or running, also one whose caller timed out), and the waiting bound counts
    them (``serve/checks.admit``), so the pool's queue is bounded by ``--max-waiting`` too.
  * A preparation that takes longer than ``timeout_s`` answers 400 ``preparation_timeout``; its
    thread finishes in the background (a thread cannot be stopped) and is still counted meanwhile.
  * The body is decoded with a depth cap (``RequestCaps.max_json_depth``): nesting deeper is a 400,
    never a ``RecursionError``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from typing import Any, Callable, TypeVar

from radixflow_jax.serve.caps import RequestCaps, json_depth
from radixflow_jax.serve.errors import ApiError

T = TypeVar("T")


def decode_json(raw: bytes, caps: RequestCaps) -> Any:
    """A request body as JSON (400 empty, invalid or nested deeper than ``caps.max_json_depth``)."""
    if not raw:
        raise ApiError(400, "the request body is empty; expected a JSON object", code="invalid_body")
    too_deep = ApiError(400, f"the request body nests deeper than {caps.max_json_depth} levels", code="too_deep")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise too_deep from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if json_depth(value) > caps.max_json_depth:
        raise too_deep
    return value


class Preparer:
    """The bounded preparation pool (module docstring)."""

    def __init__(self, workers: int, timeout_s: float | None):
        if workers < 1:
            raise ValueError(f"the preparation pool needs at least one worker, got {workers}")
        self.workers, self.timeout_s = workers, timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="radixflow-prepare")
        self._lock = threading.Lock()
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        """Preparations submitted and not finished."""
        return self._in_flight

    def _done(self, _: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._in_flight -= 1

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on a worker thread; its exception is raised here."""
        with self._lock:
            self._in_flight += 1
        fut = self._pool.submit(fn)
        fut.add_done_callback(self._done)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), self.timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(
                400, f"preparing the request took more than {self.timeout_s} s", code="preparation_timeout"
            ) from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
