"""The reliability checks have teeth: planted bugs (a checkpoint committed but never written, a
leaked slot, a stale read) are caught by the shadow executor, the audit or the harness."""

from __future__ import annotations

import dataclasses

import pytest

from radixflow_jax.cache.pools import InvariantError
from radixflow_jax.reliability.harness import Harness, shadow_of
from radixflow_jax.reliability.shadow import ShadowExecutor, ShadowMismatch
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan
from tests.reliability.scenarios import GREEDY, engine
from tests.reliability.test_engine_scenarios import _shared_prefix


def _row(rid: int, tokens: tuple[int, ...], start: int, pages: tuple[int, ...], slot: int, copy_from=None, emits=()):
    return RowPlan(
        request_id=rid,
        tokens=tokens,
        start=start,
        pages=pages,
        slot=slot,
        copy_from=copy_from,
        emits=tuple(emits),
        sample=True,
    )


def _plan(*rows: RowPlan) -> RoundPlan:
    return RoundPlan(rows=rows, num_decode=sum(r.is_decode for r in rows), stats=RoundStats())


def test_shadow_flags_unwritten_and_wrong_reads() -> None:
    ex = ShadowExecutor(4)
    ex.execute(_plan(_row(1, (5, 6, 7, 8, 9), 0, (1, 2), 1, emits=[(4, 3)])), {})
    # reading the emitted checkpoint at its depth is fine
    ex.execute(_plan(_row(2, (10,), 4, (1, 4), 2, copy_from=3)), {})
    with pytest.raises(ShadowMismatch, match="never written"):  # a slot nobody emitted (pending)
        ex.execute(_plan(_row(3, (10,), 4, (1, 5), 6, copy_from=7)), {})
    with pytest.raises(ShadowMismatch, match="another context"):  # a checkpoint at another depth
        ex.execute(_plan(_row(4, (9, 9, 9, 9, 1), 5, (1, 2, 6), 8, copy_from=3)), {})
    with pytest.raises(ShadowMismatch, match="unwritten KV"):
        ex.execute(_plan(_row(5, (1,), 8, (1, 9, 10), 9, copy_from=3)), {})
    with pytest.raises(ShadowMismatch, match="reserved"):
        ex.execute(_plan(_row(6, (1, 2), 0, (0,), 1)), {})
    with pytest.raises(ShadowMismatch, match="two rows"):
        ex.execute(_plan(_row(7, (1, 2), 0, (11,), 1), _row(8, (3, 4), 0, (11,), 2)), {})
    assert len(ex.violations) == 5


def test_a_checkpoint_committed_but_never_written_is_caught() -> None:
    h = Harness(engine("radixflow"))
    shadow = shadow_of(h.core)
    real = shadow.execute

    def drops_emits(plan, sampling):  # the bug: the step skips its checkpoint writes
        rows = tuple(dataclasses.replace(r, emits=()) for r in plan.rows)
        return real(dataclasses.replace(plan, rows=rows), sampling)

    shadow.execute = drops_emits  # type: ignore[method-assign]
    for i, p in enumerate(_shared_prefix(11, 4)):
        h.submit(p, GREEDY, at_round=3 * i)
    with pytest.raises(ShadowMismatch, match="never written"):  # propagates: the engine does not retry a bug
        h.run()


def test_a_tail_read_without_its_own_page_copy_is_caught() -> None:
    h = Harness(engine("radixflow", num_pages=200, num_slots=40))
    shadow = shadow_of(h.core)
    real = shadow.execute

    def skips_page_copies(plan, sampling):  # the bug: a row starting at a tail never gets its partial page
        rows = tuple(dataclasses.replace(r, copy_page_from=None) for r in plan.rows)
        return real(dataclasses.replace(plan, rows=rows), sampling)

    shadow.execute = skips_page_copies  # type: ignore[method-assign]
    first = list(range(10, 47))  # 37 tokens: the first turn ends at 37 + 6 - 1 = 42, off the page grid
    h.submit(first, GREEDY)
    h.on_finished.append(lambda key, out: key == 0 and h.follow_up(first + out.token_ids + [5, 6], GREEDY))
    with pytest.raises(ShadowMismatch, match="unwritten KV|another context"):
        h.run()


def test_a_leaked_slot_is_caught_by_the_audit(monkeypatch) -> None:
    h = Harness(engine("native"))
    mem = h.core.scheduler.memory
    real = mem.release

    def leaky(req, *, keep_prefix):  # the bug: a finished request's slot is never given back
        req.slot = None
        real(req, keep_prefix=keep_prefix)

    monkeypatch.setattr(mem, "release", leaky)
    for p in _shared_prefix(12, 2):
        h.submit(p, GREEDY)
    with pytest.raises(InvariantError, match="slot"):
        h.run()


def test_stale_state_after_a_failed_step_is_caught_without_the_flush(monkeypatch) -> None:
    """Recovery that rebuilt the pools but kept the cache's checkpoints would read garbage."""
    from radixflow_jax.reliability.faults import Fault

    h = Harness(engine("radixflow", faults=(Fault(6, "donated"),)))
    mem = h.core.scheduler.memory
    monkeypatch.setattr(h.core.executor, "reset", lambda: None)  # the pools are not rebuilt...
    monkeypatch.setattr(mem, "flush", lambda waiting=(): None)  # ...and the cache is not flushed
    monkeypatch.setattr(h.core.scheduler, "requeue_running", lambda: [])  # ...and nothing recomputes
    for i, p in enumerate(_shared_prefix(13, 6)):
        h.submit(p, GREEDY, at_round=i)
    with pytest.raises(Exception, match="still in use|another context|never written|unwritten"):
        h.run()


class _GuardError(RuntimeError):
    recoverable = False


@pytest.mark.parametrize("error", [_GuardError("compiled after warm-up"), AssertionError("broken invariant")])
def test_bugs_are_not_retried(error: Exception) -> None:
    """A guard or a broken invariant inside the step propagates: retrying would hide a bug."""
    h = Harness(engine("radixflow"))
    shadow = shadow_of(h.core)

    def raises(plan, sampling):
        raise error

    shadow.execute = raises  # type: ignore[method-assign]
    h.submit(_shared_prefix(14, 1)[0], GREEDY)
    with pytest.raises(type(error), match=str(error)):
        h.run()
    assert h.core.num_step_failures == 0


def test_batch_output_of_a_request_that_failed_is_an_error_record() -> None:
    from radixflow_jax.batch.inputs import OPENAI, BatchItem
    from radixflow_jax.batch.output import result_record
    from radixflow_jax.engine.params import RequestOutput

    out = RequestOutput(0, (1, 2), [7], None, "error", 2, 0, 0.0, error="the step failed in 2 rounds in a row")
    plain = result_record(BatchItem(0, 3, "plain", "q1"), out, "m")
    assert plain["finish_reason"] is None and plain["error"]["code"] == "step_failed"
    assert "line 3: the step failed" in plain["error"]["message"]
    openai = result_record(BatchItem(0, 3, OPENAI, "q1"), out, "m")
    assert openai["response"] is None and openai["error"]["code"] == "step_failed"
