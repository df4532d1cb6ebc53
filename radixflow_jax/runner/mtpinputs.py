"""The host side of MTP drafts (``runner/mtpstep.py``): each token slot's next token (no JAX)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from radixflow_jax.scheduler.plan import RowPlan


def fill_mtp_next(nxt: np.ndarray, tokens: np.ndarray, cu: np.ndarray, rows: Sequence[RowPlan]) -> None:
    """Writes ``StepInputs.mtp_next`` (``nxt``, all -1 before) of rows packed as ``cu`` (their
    ``cu_seqlens``) over ``tokens``: the row's next token inside a span, a chunk's
    ``RowPlan.next_token`` at its end; -1 (the step's sample there) at a sampling row's end and at
    every slot of a verify row."""
    total = int(cu[len(rows)])
    nxt[: max(total - 1, 0)] = tokens[1:total]
    ends = (cu[1 : len(rows) + 1] - 1)[np.asarray([len(row.tokens) for row in rows], dtype=np.int64) > 0]
    nxt[ends] = [row.next_token for row in rows if row.tokens]
    for i in np.flatnonzero([row.num_draft for row in rows]):
        nxt[cu[i] : cu[i + 1]] = -1
