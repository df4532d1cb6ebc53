"""``BackgroundEngine``: an :class:`EngineCore` on its own thread, fed from other threads and from
asyncio. Streams grow monotonically and end in exactly one final event; aborts, bad requests,
engine errors and shutdown each end the right requests and nothing else.

Rounds are made deterministic where it matters with a :class:`Gate` around ``core.step``: the test
lets a given number of rounds through, so "abort mid-stream" or "shut down while a request runs"
happen at a known point instead of depending on thread timing."""

from __future__ import annotations

import asyncio
import threading

import pytest

from radixflow_jax import LLM, SamplingParams
from radixflow_jax.replicas.background import BackgroundEngine, EngineDeadError, RequestHandle
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.engine.build import build_engine
from radixflow_jax.engine.params import RequestOutput

SMALL = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512, warmup=False)
PROMPTS = [[(13 * i + 7 * j) % 480 + 20 for j in range(n)] for i, n in enumerate((5, 70, 12, 33, 140, 9, 48, 21))]
MAX_TOKENS = [5, 8, 6, 10, 4, 7, 9, 6]
LONG = 400  # max_tokens of requests that are aborted or shut down long before they could finish
WAIT = 120.0  # generous bound so a broken engine fails the test instead of hanging it


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("tiny-qwen3.5")


@pytest.fixture(scope="module")
def reference(model) -> list[list[int]]:
    """``LLM.generate``'s greedy outputs for ``PROMPTS`` (and a greedy prefix for the long prompt)."""
    llm = LLM(model, **SMALL)
    outs = llm.generate(PROMPTS, [greedy(n) for n in MAX_TOKENS])
    return [o.token_ids for o in outs]


@pytest.fixture(scope="module")
def core(model) -> EngineCore:
    return build_engine(model, EngineConfig.from_options(**SMALL))


class Gate:
    """Wraps ``core.step``: rounds run only while allowed (``allow(n)`` lets n more through)."""

    def __init__(self, core: EngineCore):
        self.core = core
        self._cv = threading.Condition()
        self._budget: float = float("inf")
        self.fail: BaseException | None = None
        self._step = core.step
        core.step = self._gated  # type: ignore[method-assign]

    def _gated(self) -> list[RequestOutput]:
        with self._cv:
            self._cv.wait_for(lambda: self._budget > 0)
            self._budget -= 1
            if self.fail is not None:
                raise self.fail
        return self._step()

    def close(self) -> None:
        with self._cv:
            self._budget = 0

    def allow(self, n: float = float("inf")) -> None:
        with self._cv:
            self._budget = n
            self._cv.notify_all()

    def restore(self) -> None:
        self.allow()
        del self.core.step


@pytest.fixture
def engine(core: EngineCore):
    """A fresh engine thread around the shared core (one owner at a time), with a gate."""
    gate = Gate(core)
    eng = BackgroundEngine(core)
    eng.gate = gate  # type: ignore[attr-defined]
    yield eng
    gate.allow()
    eng.shutdown()
    assert not eng.is_running
    gate.restore()
    for rid, req in core.scheduler.requests.items():  # leave nothing running for the next engine
        if not req.is_finished:
            core.abort(rid)
    assert not core.has_unfinished()


def check_stream(events: list[RequestOutput]) -> RequestOutput:
    """Token lists only grow (each event extends the previous one by new tokens; an abort event
    repeats the tokens so far), exactly one event is final and it is the last."""
    assert events, "no events"
    for prev, cur in zip(events, events[1:]):
        if cur.finish_reason == "abort":
            assert len(cur.token_ids) >= len(prev.token_ids)
        else:
            assert len(cur.token_ids) > len(prev.token_ids)
        assert cur.token_ids[: len(prev.token_ids)] == prev.token_ids
    assert [e.finished for e in events] == [False] * (len(events) - 1) + [True]
    assert len({e.request_id for e in events}) == 1
    return events[-1]


def collect(handle: RequestHandle, n: int | None = None) -> list[RequestOutput]:
    """The events a reader sees, until the final one or until one carries ``n`` tokens (a handle
    keeps the latest snapshot only, so a reader may skip intermediate ones)."""
    events = []
    for out in handle.stream(timeout=WAIT):
        events.append(out)
        if n is not None and len(out.token_ids) >= n:
            break
    return events


# ------------------------------------------------------------------------------------------------
def test_concurrent_submitters_stream_and_match_generate(engine: BackgroundEngine, reference) -> None:
    barrier = threading.Barrier(4)
    results: dict[int, tuple[int | None, list[RequestOutput]]] = {}
    errors: list[BaseException] = []

    def client(k: int) -> None:
        try:
            barrier.wait(WAIT)
            idx = [k, k + 4]
            handles = [engine.submit(PROMPTS[i], greedy(MAX_TOKENS[i])) for i in idx]
            for i, h in zip(idx, handles):
                events = collect(h)
                results[i] = (h.request_id, events)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not errors, errors
    assert sorted(results) == list(range(8))
    rids = [results[i][0] for i in range(8)]
    assert len(set(rids)) == 8 and None not in rids
    for i in range(8):
        rid, events = results[i]
        final = check_stream(events)
        assert final.request_id == rid
        assert final.finish_reason == "length"
        assert final.token_ids == reference[i]
        assert list(final.prompt_token_ids) == PROMPTS[i]
        assert len(events) <= MAX_TOKENS[i]  # at most one event per token (a slow reader gets the latest)


def test_result_equals_generate(engine: BackgroundEngine, reference) -> None:
    handles = [engine.submit(PROMPTS[i], greedy(MAX_TOKENS[i])) for i in (3, 1)]
    assert [h.result(timeout=WAIT).token_ids for h in handles] == [reference[3], reference[1]]
    for h in handles:
        assert not h.has_unread  # nothing after the final event
    # the final event stays available: asking again does not wait for events that never come
    again = handles[0].result(timeout=WAIT)
    assert again.finished and again.token_ids == reference[3]
    assert [o.token_ids for o in handles[1].stream(timeout=WAIT)] == [reference[1]]
    assert asyncio.run(_last(handles[1])).token_ids == reference[1]


async def _last(handle: RequestHandle) -> RequestOutput:
    return [o async for o in handle.astream()][-1]


def test_abort_mid_stream(engine: BackgroundEngine, reference) -> None:
    gate = engine.gate  # type: ignore[attr-defined]
    gate.close()
    victim = engine.submit(PROMPTS[0], greedy(LONG))
    other = engine.submit(PROMPTS[3], greedy(MAX_TOKENS[3]))
    gate.allow(3)
    first = collect(victim, 3)  # three rounds ran: three tokens
    victim.abort()
    victim.abort()  # a second abort is harmless
    gate.allow()
    events = first + collect(victim)
    final = check_stream(events)
    assert final.finish_reason == "abort"
    assert 3 <= len(final.token_ids) < LONG
    # the engine keeps serving: the other request finishes untouched, new requests run
    assert other.result(timeout=WAIT).token_ids == reference[3]
    assert engine.submit(PROMPTS[2], greedy(MAX_TOKENS[2])).result(timeout=WAIT).token_ids == reference[2]
    victim.abort()  # aborting a finished request does nothing
    assert engine.submit(PROMPTS[5], greedy(MAX_TOKENS[5])).result(timeout=WAIT).token_ids == reference[5]
    assert not victim.has_unread


def test_abort_before_the_first_round(engine: BackgroundEngine, reference) -> None:
    gate = engine.gate  # type: ignore[attr-defined]
    gate.close()
    h = engine.submit(PROMPTS[1], greedy(LONG))
    h.abort()
    gate.allow()
    final = check_stream(collect(h))
    assert final.finish_reason == "abort"
    assert len(final.token_ids) <= 1
    assert engine.submit(PROMPTS[1], greedy(MAX_TOKENS[1])).result(timeout=WAIT).token_ids == reference[1]


@pytest.mark.parametrize(
    "prompt,params,error",
    [
        ([], greedy(4), ValueError),
        ([5] * 500, greedy(16), ValueError),  # 500 + 16 > max_model_len 512
        ([5, "x", 7], greedy(4), ValueError),
        ([5, None, 7], greedy(4), ValueError),
        ([5, 1.5, 7], greedy(4), ValueError),
        ("a string", greedy(4), TypeError),
        ([5, 6], {"max_tokens": 4}, TypeError),
    ],
)
def test_invalid_request_raises_in_caller(engine: BackgroundEngine, reference, prompt, params, error) -> None:
    gate = engine.gate  # type: ignore[attr-defined]
    gate.close()
    ok = engine.submit(PROMPTS[2], greedy(MAX_TOKENS[2]))
    with pytest.raises(error):
        engine.submit(prompt, params)
    gate.allow()
    assert ok.result(timeout=WAIT).token_ids == reference[2]
    assert engine.is_running


def test_astream_inside_asyncio_run(engine: BackgroundEngine, reference) -> None:
    async def consume(i: int) -> list[RequestOutput]:
        h = engine.submit(PROMPTS[i], greedy(MAX_TOKENS[i]))
        return [out async for out in h.astream()]

    async def main() -> list[list[RequestOutput]]:
        return await asyncio.wait_for(asyncio.gather(*(consume(i) for i in (0, 4, 6))), WAIT)

    streams = asyncio.run(main())
    for i, events in zip((0, 4, 6), streams):
        final = check_stream(events)
        assert final.token_ids == reference[i]
        assert len(events) <= MAX_TOKENS[i]  # a reader that falls behind skips to the latest snapshot


def test_cancelled_astream_wait_loses_no_event(engine: BackgroundEngine, reference) -> None:
    """A client that times out waiting (asyncio.wait_for) and listens again sees every event."""
    gate = engine.gate  # type: ignore[attr-defined]
    gate.close()
    h = engine.submit(PROMPTS[3], greedy(MAX_TOKENS[3]))

    async def main() -> list[RequestOutput]:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(h.astream().__anext__(), 0.2)  # no round runs: nothing arrives
        gate.allow()
        return [out async for out in h.astream()]

    events = asyncio.run(asyncio.wait_for(main(), WAIT))
    final = check_stream(events)
    assert len(events) <= MAX_TOKENS[3]  # the latest snapshot each time; the final one always
    assert final.token_ids == reference[3]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread re-raises
def test_engine_error_fails_open_requests(engine: BackgroundEngine, reference) -> None:
    gate = engine.gate  # type: ignore[attr-defined]
    gate.close()
    handles = [engine.submit(PROMPTS[i], greedy(LONG)) for i in (0, 2)]
    gate.allow(2)
    firsts = [collect(h, 2) for h in handles]
    gate.fail = RuntimeError("injected step failure")
    gate.allow()
    for h, first in zip(handles, firsts):
        assert len(first[-1].token_ids) == 2
        with pytest.raises(EngineDeadError, match="injected step failure"):
            collect(h)
    engine._thread.join(WAIT)
    assert not engine.is_running
    with pytest.raises(EngineDeadError, match="injected"):
        engine.submit(PROMPTS[1], greedy(3))


def test_shutdown_stops_the_thread_and_ends_open_requests(engine: BackgroundEngine, reference) -> None:
    gate = engine.gate  # type: ignore[attr-defined]
    gate.close()
    running = engine.submit(PROMPTS[1], greedy(LONG))
    gate.allow(2)
    first = collect(running, 2)
    # the thread is now held in its third round; a request submitted now is still in the inbox
    pending = engine.submit(PROMPTS[2], greedy(4))
    engine.shutdown(timeout=0)
    gate.allow()
    engine._thread.join(WAIT)
    assert not engine.is_running
    final = check_stream(first + collect(running))
    assert final.finish_reason == "abort"
    assert 2 <= len(final.token_ids) < LONG
    with pytest.raises(EngineDeadError):
        pending.result(timeout=WAIT)
    with pytest.raises(EngineDeadError):
        engine.submit(PROMPTS[3], greedy(3))
