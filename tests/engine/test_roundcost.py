"""The round-cost estimator (the policies' one model of round time): a non-negative line over the
round's features, fitted to the rounds an executor reported, read incrementally; the prior before
enough rounds costs every round the same, so no cost is invented before a measurement."""

from __future__ import annotations

import pytest

from radixflow_jax.engine.config import RoundRecord
from radixflow_jax.engine.roundcost import FEATURES, FittedRoundCost, LinearRoundCost, plan_features
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan, attention_pairs

SHAPES = ShapeConfig(max_num_batched_tokens=256, max_num_seqs=8, max_pages_per_row=16, grid=16, mode="pow2")
TRUE = (0.010, 1e-4, 5e-4, 1e-7, 0.0)  # seconds per round, token slot, row slot, attention pair, pairing token


def _rows(tokens: int, rows: int, start: int = 0) -> list[RowPlan]:
    each = tokens // rows
    return [
        RowPlan(request_id=i, tokens=(1,) * each, start=start, pages=(), slot=0, copy_from=None, emits=(), sample=True)
        for i in range(rows)
    ]


def _record(index: int, rows: list[RowPlan], seconds: float | None = None) -> RoundRecord:
    plan = RoundPlan(tuple(rows), 0, RoundStats())
    v = SHAPES.select(plan.num_tokens, len(rows), num_decode=0)
    if seconds is None:
        seconds = LinearRoundCost(TRUE).predict(plan_features(rows, v.num_tokens, v.num_rows))
    return RoundRecord(
        index=index, num_tokens=plan.num_tokens, num_rows=len(rows), token_slots=v.num_tokens, row_slots=v.num_rows,
        padding_tokens=v.num_tokens - plan.num_tokens, bubble_tokens=0, bubble_rows=0, admitted=len(rows),
        consumers_blocked=0, consumers_waiting=0, preempted=0, checkpoints_planted=0, checkpoints_skipped=0,
        checkpoints_evicted_unused=0, plan_s=1.0, build_s=seconds / 4, step_s=3 * seconds / 4,
        decode_slots=v.num_decode, attention_pairs=attention_pairs(rows),
    )  # fmt: skip


SHAPES_SEEN = [(t, r, s) for t in (16, 32, 64, 128, 256) for r in (1, 2, 4, 8) for s in (0, 64) if t >= r]


def test_prior_until_enough_rounds_then_the_fit_recovers_the_line() -> None:
    records: list[RoundRecord] = []
    cost = FittedRoundCost(SHAPES, records, window=len(SHAPES_SEEN))  # the first round falls out of the window
    assert cost(_rows(32, 2)) == 0.0 and cost.line().rounds == 0  # nothing measured: nothing invented
    records.append(_record(0, _rows(32, 2), seconds=0.2))
    assert cost(_rows(32, 2)) == cost(_rows(256, 8)) == pytest.approx(0.2)  # the prior: every round the same
    records.extend(_record(1 + i, _rows(t, r, s)) for i, (t, r, s) in enumerate(SHAPES_SEEN))
    line = cost.line()
    assert line.rounds == len(SHAPES_SEEN)  # plan time is not part of the fit: build + step only
    for got, want in zip(line.coef, TRUE):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12)
    held_out = _rows(192, 6, start=40)  # a round shape never in the fit
    v = SHAPES.select(192, 6, num_decode=0)
    assert cost(held_out) == pytest.approx(LinearRoundCost(TRUE).predict(plan_features(held_out, v.num_tokens, v.num_rows)))


def test_read_incrementally_window_and_trimming() -> None:
    records = [_record(i, _rows(t, r, s)) for i, (t, r, s) in enumerate(SHAPES_SEEN)]
    cost = FittedRoundCost(SHAPES, records, window=len(SHAPES_SEEN))
    before = cost.line()
    del records[:10]  # an owner trimming the list loses nothing already read
    slower = [_record(100 + i, _rows(t, r, s), seconds=2.0 * _seconds(t, r, s)) for i, (t, r, s) in
              enumerate(SHAPES_SEEN)]  # fmt: skip
    records.extend(slower)  # the window keeps only the newest rounds: the executor got 2x slower
    after = cost.line()
    assert after is not before
    for a, b in zip(after.coef, before.coef):
        assert a == pytest.approx(2 * b, rel=1e-6, abs=1e-12)
    assert cost.line() is after  # no new rounds: no refit


def _seconds(t: int, r: int, s: int) -> float:
    rec = _record(0, _rows(t, r, s))
    return rec.build_s + rec.step_s


def test_fit_is_non_negative_and_checks_its_input() -> None:
    feats = [(1.0, float(t), 1.0, 0.0, 0.0) for t in (16, 32, 64, 128)]
    # time falls as tokens grow: the token term clamps at 0 instead of going negative
    line = LinearRoundCost.fit(list(zip(feats, (0.04, 0.03, 0.02, 0.01))))
    assert all(c >= 0 for c in line.coef) and line.named()["token_slots"] == 0.0
    assert set(line.named()) == set(FEATURES)
    with pytest.raises(ValueError, match="at least one measured round"):
        LinearRoundCost.fit([])
    with pytest.raises(ValueError, match="window >= min_rounds"):
        FittedRoundCost(SHAPES, [], window=4, min_rounds=10)
