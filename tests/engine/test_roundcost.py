"""The model executor's measured round cost (policy pair's fill rule): running medians per variant
from the round records, a line for variants never measured, nothing invented before a measurement."""

from __future__ import annotations


from radixflow_jax.engine.config import RoundRecord
from radixflow_jax.engine.roundcost import MeasuredRoundCost
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.scheduler.plan import RowPlan

SHAPES = ShapeConfig(max_tokens=256, max_rows=8, max_pages_per_row=16, grid=16, mode="pow2")


def _record(index: int, tokens: int, rows: int, seconds: float, paired: int = 0) -> RoundRecord:
    v = SHAPES.select(tokens, rows, num_decode=0)
    return RoundRecord(
        index=index, num_tokens=tokens, num_rows=rows, token_slots=v.num_tokens, row_slots=v.num_rows,
        padding_tokens=v.num_tokens - tokens, bubble_tokens=0, bubble_rows=0, admitted=rows, consumers_blocked=0,
        consumers_waiting=0, preempted=0, checkpoints_planted=0, checkpoints_skipped=0, checkpoints_evicted_unused=0,
        plan_s=1.0, build_s=seconds / 4, step_s=3 * seconds / 4, consumers_paired=paired, decode_slots=v.num_decode,
    )  # fmt: skip


def _rows(tokens: int, rows: int, paired: bool = False) -> list[RowPlan]:
    each = tokens // rows
    return [
        RowPlan(i, (1,) * each, 0, (), 0, None, (), True, pair_slot=5 if paired and i else None) for i in range(rows)
    ]


def test_medians_per_variant_and_kind_read_incrementally() -> None:
    records: list[RoundRecord] = []
    cost = MeasuredRoundCost(SHAPES, records, window=3)
    assert cost(_rows(32, 2)) == 0.0  # nothing measured yet: no cost invented
    records += [_record(0, 30, 2, 1.0), _record(1, 32, 2, 9.0), _record(2, 31, 2, 2.0)]
    assert cost(_rows(32, 2)) == 2.0  # median, plan time excluded
    records += [_record(3, 32, 2, 3.0), _record(4, 32, 2, 4.0)]  # the window keeps the last 3
    assert cost(_rows(32, 2)) == 3.0
    records += [_record(5, 32, 2, 7.0, paired=1)]
    assert cost(_rows(32, 2, paired=True)) == 7.0  # a round with a paired consumer is its own kind
    assert cost(_rows(32, 2)) == 3.0
    del records[:4]  # an owner trimming the list loses nothing already read
    records.append(_record(6, 32, 2, 3.5))
    assert cost.measured()[cost.key(_rows(32, 2))] == 3.5


def test_unmeasured_variant_from_a_line_through_the_medians() -> None:
    records = [_record(i, t, 2, 0.01 * t) for i, t in enumerate((16, 32, 64, 128))]
    records += [_record(4 + i, t, 4, 0.01 * t + 0.5) for i, t in enumerate((32, 64))]
    cost = MeasuredRoundCost(SHAPES, records)
    est = cost(_rows(256, 4))
    assert 2.0 < est < 3.5  # about 0.01 s per token slot
    assert est > cost(_rows(128, 2))
