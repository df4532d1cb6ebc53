"""Verify points of speculative decoding (``scheduler/drafts.py``): where in a round's packed tokens
the step computes the greedy successor of a verify row's last known token and of its drafted
tokens (``StepInputs.verify_index``, ``runner/step.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from radixflow_jax.scheduler.plan import RowPlan


def fill_verify(
    verify_index: np.ndarray, cu_seqlens: np.ndarray, rows: Sequence[RowPlan]
) -> tuple[tuple[int, int, int], ...]:
    """The verify points of every verify row: its last known token and each drafted token but the
    last (whose successor is the row's sample), in row order; padding points read token 0."""
    points, out = [], []
    for i, row in enumerate(rows):
        if row.num_draft:
            last_known = int(cu_seqlens[i + 1]) - 1 - row.num_draft
            out.append((row.request_id, len(points), row.num_draft))
            points.extend(range(last_known, last_known + row.num_draft))
    if len(points) > verify_index.shape[0]:
        raise ValueError(f"{len(points)} drafted tokens exceed the variant's {len(verify_index)} verify points")
    verify_index[: len(points)] = points
    return tuple(out)
