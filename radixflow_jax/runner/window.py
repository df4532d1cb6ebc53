"""Which one-token rows of a round run in the decode region, and at which array row (host side).

The model reads and writes the decode region's recurrent states as one contiguous window of slots
(``models/mixers/recurrent.DecodeWindow``): decode row ``r`` runs in slot ``base + r``. So a
round's decode region is chosen by *slot*, not by count:

  * a one-token row is *windowable* when it continues its own state: ``start > 0``, no checkpoint
    to copy from, not paired, a real slot. Other one-token rows (a request's first row after a
    cache hit, a one-token prompt) run in the prefill region, whose rows gather their states;
  * ``base`` is the lowest slot of the windowable rows; the rows whose slot lies in ``[base, base
    + max_rows)`` form the decode region, at array row ``slot - base``; windowable rows above that
    run in the prefill region too (the scheduler hands request slots out lowest first and
    checkpoint slots highest first, ``cache/pools.SlotPool``, so this is rare);
  * the region's size is the decode bucket that holds the *span* ``max slot - base + 1``; window
    positions without a decode row are padding rows (their slot's state is written back unchanged);
  * ``base`` is lowered where needed so the window ends inside the pool (``num_slots``);
  * under ``ShapeConfig.mixed_layout="packed"`` a round with any row outside the decode region has
    none: every row runs in the prefill region (``variant_for``).

Invariant: every row listed in ``rows`` has ``base <= slot < base + variant.num_decode <=
num_slots``, and no two share a slot.
"""

from __future__ import annotations

import dataclasses

from radixflow_jax.runner.shapes import ShapeConfig, Variant
from radixflow_jax.scheduler.plan import RoundPlan, RowPlan


def windowable(row: RowPlan) -> bool:
    """A one-token row that continues the state in its own slot (see the module docstring)."""
    return len(row.tokens) == 1 and row.start > 0 and row.copy_from is None and row.pair_slot is None and row.slot > 0


@dataclasses.dataclass(frozen=True)
class DecodePlacement:
    """``base``: the slot of decode row 0; ``rows``: indices into ``plan.rows`` of the rows in the
    decode region (each at array row ``slot - base``); ``span``: window positions from ``base`` to
    the highest of them."""

    base: int
    rows: tuple[int, ...]
    span: int


def place_decode(plan: RoundPlan, max_rows: int) -> DecodePlacement:
    """The decode region of ``plan`` before the window is fitted into the pool (``base`` unclamped)."""
    slots = [(i, row.slot) for i, row in enumerate(plan.rows) if windowable(row)]
    if not slots or max_rows < 1:
        return DecodePlacement(0, (), 0)
    base = min(slot for _, slot in slots)
    inside = [(i, slot) for i, slot in slots if slot < base + max_rows]
    return DecodePlacement(base, tuple(i for i, _ in inside), max(slot for _, slot in inside) - base + 1)


def variant_for(plan: RoundPlan, shapes: ShapeConfig) -> tuple[Variant, DecodePlacement]:
    """The variant a round runs in and its decode placement (``base`` not fitted to a pool): what
    the model executor selects, so the simulated executor and the round-cost model use it too."""
    placement = place_decode(plan, shapes.max_num_seqs)
    variant = shapes.select(
        plan.num_tokens,
        len(plan.rows),
        num_decode=len(placement.rows),
        num_emits=plan.num_emits,
        decode_span=placement.span,
        num_riders=plan.num_riders,
        verify=plan.num_drafted > 0,
    )
    if not variant.num_decode:  # packed layout (or no windowable row): every row in the prefill region
        placement = DecodePlacement(0, (), 0)
    return variant, placement


def select_round(plan: RoundPlan, shapes: ShapeConfig, num_slots: int) -> tuple[Variant, DecodePlacement]:
    """:func:`variant_for`, with ``base`` fitted so the window ``[base, base + num_decode)`` lies
    inside a pool of ``num_slots`` slots."""
    variant, placement = variant_for(plan, shapes)
    if variant.num_decode > num_slots:
        raise ValueError(f"decode region of {variant.num_decode} rows does not fit a pool of {num_slots} slots")
    base = min(placement.base, num_slots - variant.num_decode)
    return variant, dataclasses.replace(placement, base=max(base, 0))
