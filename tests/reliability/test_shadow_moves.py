"""The shadow executor replays the host tier's KV page moves (``kv_spill``, ``kv_restore``) in
order with the state moves: a restored page reads back what was spilled and is checked like any
page; a restore of a host page never written, or written with other tokens, fails the row that
reads it; host pages survive a device loss."""

from __future__ import annotations

import pytest

from radixflow_jax.cache import StateMove
from radixflow_jax.reliability.shadow import ShadowExecutor, ShadowMismatch
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan

PROMPT = tuple(range(5, 13))  # two pages of four


def _plan(*rows: RowPlan, moves: tuple[StateMove, ...] = ()) -> RoundPlan:
    return RoundPlan(rows=rows, num_decode=sum(r.is_decode for r in rows), stats=RoundStats(), state_moves=moves)


def _row(rid: int, tokens: tuple[int, ...], start: int, pages: tuple[int, ...]) -> RowPlan:
    return RowPlan(request_id=rid, tokens=tokens, start=start, pages=pages, slot=rid, copy_from=None, emits=(),
                   sample=True)


def test_restored_pages_read_back_what_was_spilled() -> None:
    ex = ShadowExecutor(4, hybrid=False, truth=lambda rid: PROMPT + (13,))
    ex.execute(_plan(_row(1, PROMPT, 0, (1, 2))), {})
    # spill both pages, reuse device page 1 at once for a restore, read the restored copies
    moves = (StateMove("kv_spill", 1, 1), StateMove("kv_spill", 2, 2), StateMove("kv_restore", 2, 1),
             StateMove("kv_restore", 1, 3))  # fmt: skip
    ex.execute(_plan(_row(2, (13,), 8, (3, 1, 4)), moves=moves), {})
    assert ex.host_pages == {1: list(PROMPT[:4]), 2: list(PROMPT[4:])}
    ex.lose_device_state()  # host memory is not the device's
    back = (StateMove("kv_restore", 1, 5), StateMove("kv_restore", 2, 6))
    ex.execute(_plan(_row(3, (13,), 8, (5, 6, 7)), moves=back), {})
    with pytest.raises(ShadowMismatch, match="unwritten KV"):  # host page 9 was never spilled
        ex.execute(_plan(_row(4, (13,), 8, (8, 9, 10)), moves=(StateMove("kv_restore", 9, 8),)), {})
    with pytest.raises(ShadowMismatch, match="not its tokens"):  # the pages restored in the wrong order
        swapped = (StateMove("kv_restore", 2, 8), StateMove("kv_restore", 1, 9))
        ex.execute(_plan(_row(5, (13,), 8, (8, 9, 10)), moves=swapped), {})
    assert len(ex.violations) == 2
