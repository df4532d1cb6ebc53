"""Checkpoint emits of a round's rows (``StepInputs.emit_rows / emit_offsets / emit_slots``) and
the emit each paired consumer starts from (``pair_emit``), written by ``runner/inputs.build_arrays``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from radixflow_jax.scheduler.plan import RowPlan

if TYPE_CHECKING:
    from radixflow_jax.runner.inputs import StepInputs


def fill_emits(inputs: StepInputs, rows: Sequence[RowPlan], num_decode: int) -> None:
    """Checkpoint emits in row order, and each paired row's emit index. A decode row (the first
    ``num_decode``) emits only after its one token and never pairs; a row pairs with the emit of an
    unpaired row of the same round."""
    emits = [(i, offset, slot) for i, row in enumerate(rows) for offset, slot in row.emits]
    for i, offset, _ in emits:
        if i < num_decode and offset != 1:  # the model reads only a decode row's new state
            raise ValueError(
                f"request {rows[i].request_id}: a decode row emits after its one token, not at offset {offset}"
            )
    if emits:
        inputs.emit_rows[: len(emits)], inputs.emit_offsets[: len(emits)], inputs.emit_slots[: len(emits)] = zip(*emits)
    emit_of = {slot: j for j, (_, _, slot) in enumerate(emits)}
    for i, row in enumerate(rows):
        if row.pair_slot is not None:
            j = emit_of.get(row.pair_slot)
            if j is None or rows[emits[j][0]].pair_slot is not None or i < num_decode:
                raise ValueError(
                    f"request {row.request_id} pairs with checkpoint slot {row.pair_slot}, which no unpaired "
                    "prefill row of the round emits"
                )
            inputs.pair_emit[i] = j
