"""``runner/window.py``: which one-token rows form the decode region and where they sit (row
``slot - base``), the region sized by the slots it spans, fitted into the pool; ``build_arrays``
lays the round out accordingly and maps every plan row to its array row."""

from __future__ import annotations

import numpy as np
import pytest

from radixflow_jax.runner.inputs import build_arrays
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.runner.window import place_decode, select_round, windowable
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan

SHAPES = ShapeConfig(max_num_batched_tokens=128, max_num_seqs=8, max_pages_per_row=4, grid=16)


def _row(rid: int, n: int, start: int, slot: int, copy_from: int | None = None, pair: int | None = None) -> RowPlan:
    return RowPlan(
        request_id=rid,
        tokens=tuple(range(1, n + 1)),
        start=start,
        pages=(1, 2, 3, 4),
        slot=slot,
        copy_from=copy_from,
        emits=(),
        sample=True,
        pair_slot=pair,
    )


def _plan(*rows: RowPlan) -> RoundPlan:
    return RoundPlan(rows=tuple(rows), num_decode=sum(r.is_decode for r in rows), stats=RoundStats())


def test_only_rows_continuing_their_own_state_are_windowable() -> None:
    assert windowable(_row(1, 1, 9, slot=3))
    assert not windowable(_row(2, 1, 0, slot=3))  # a one-token prompt: starts fresh
    assert not windowable(_row(3, 1, 9, slot=3, copy_from=40))  # starts from a checkpoint
    assert not windowable(_row(4, 1, 9, slot=3, pair=41))  # a paired consumer
    assert not windowable(_row(5, 2, 9, slot=3))  # two tokens
    assert not windowable(_row(6, 1, 9, slot=0))  # attention-only models have no slot


def test_decode_rows_sit_at_their_slot_and_the_rest_in_the_prefill_region() -> None:
    rows = (_row(1, 1, 9, slot=7), _row(2, 1, 9, slot=4), _row(3, 1, 9, slot=5, copy_from=40), _row(4, 5, 0, slot=6))
    plan = _plan(*rows)
    variant, decode = select_round(plan, SHAPES, num_slots=64)
    assert (decode.base, decode.rows, decode.span) == (4, (0, 1), 4)  # slots 7 and 4: window 4..7
    assert variant.num_decode == 8 and variant.prefill_rows >= 2  # (mixed rounds: one decode bucket here)
    built = build_arrays(plan, variant, page_size=4, max_pages=4, sampling={}, decode=decode)
    a = built.inputs
    assert int(a.decode_base) == 4
    assert a.state_slots[:8].tolist() == [4, 0, 0, 7, 0, 0, 0, 0]  # slots 5, 6 are padding positions
    assert built.plan_rows.tolist() == [3, 0, 8, 9]  # plan row -> array row; the checkpoint row runs as prefill
    assert a.state_slots[8:10].tolist() == [5, 6] and a.copy_src[8] == 40
    assert a.cu_seqlens[8:11].tolist() == [8, 9, 14]  # prefill tokens after the decode region


def test_window_is_sized_by_span_and_rows_beyond_it_run_as_prefill() -> None:
    rows = [_row(i, 1, 9, slot=s) for i, s in enumerate((2, 3, 9, 30))]  # 30 lies beyond 2 + max_rows
    decode = place_decode(_plan(*rows), SHAPES.max_num_seqs)
    assert (decode.base, decode.rows, decode.span) == (2, (0, 1, 2), 8)
    variant, placed = select_round(_plan(*rows), SHAPES, num_slots=64)
    assert variant.num_decode == 8 and variant.prefill_rows >= 1  # the row of slot 30 is a prefill row
    assert placed == decode


def test_window_is_fitted_into_the_pool() -> None:
    plan = _plan(_row(1, 1, 9, slot=60), _row(2, 1, 9, slot=62))
    variant, decode = select_round(plan, SHAPES, num_slots=64)
    assert decode.base + variant.num_decode <= 64 and decode.base <= 60
    built = build_arrays(plan, variant, page_size=4, max_pages=4, sampling={}, decode=decode)
    a = built.inputs
    assert a.state_slots[60 - decode.base] == 60 and a.state_slots[62 - decode.base] == 62
    with pytest.raises(ValueError, match="does not fit a pool"):
        select_round(_plan(*(_row(i, 1, 9, slot=1 + i) for i in range(8))), SHAPES, num_slots=4)


def test_a_window_that_does_not_hold_its_rows_is_refused() -> None:
    plan = _plan(_row(1, 1, 9, slot=3), _row(2, 1, 9, slot=9))
    variant, decode = select_round(plan, SHAPES, num_slots=64)
    small = type(variant)(variant.num_tokens, variant.num_rows, 4, variant.max_emits)
    with pytest.raises(ValueError, match="do not fit the window"):
        build_arrays(plan, small, page_size=4, max_pages=4, sampling={}, decode=decode)
    placed_here = build_arrays(plan, variant, page_size=4, max_pages=4, sampling={}).inputs
    assert np.all(placed_here.state_slots[[0, 6]] == [3, 9])
