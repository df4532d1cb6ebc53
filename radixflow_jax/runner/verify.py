"""Verify points of speculative decoding (``scheduler/drafts.py``): where in a round's packed tokens
the step computes the successor of a verify row's last known token and of its drafted tokens
(``StepInputs.verify_index``, ``runner/step.py``), and what each point samples with.

A verify point samples as a round without drafts would have sampled at its position: with its
row's parameters, and with what depends on the tokens before it taken from the drafted tokens
before it. So its penalty context is the row's prompt and output plus those drafted tokens
(``verify_ctx_end``: the row's ``ctx_ids`` hold prompt, output and the whole draft, a point reads
the first ``verify_ctx_end`` entries), and its grammar mask is the matcher's after them
(``verify_mask``). The row's own sample follows the whole draft: its context holds every drafted
token and its mask is the matcher's after all of them. Where a drafted token is one the grammar
does not allow, the masks from there on are all ones: that point's mask excludes the token, so
the token is rejected there and nothing after it is committed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from radixflow_jax.scheduler.plan import RowPlan

if TYPE_CHECKING:
    from radixflow_jax.runner.inputs import SamplingRow, StepInputs


def fill_verify(
    verify_index: np.ndarray, verify_drafts: np.ndarray, cu_seqlens: np.ndarray, rows: Sequence[RowPlan]
) -> tuple[tuple[int, int, int], ...]:
    """The verify points of every verify row: its last known token and each drafted token but the
    last (whose successor is the row's sample), in row order; padding points read token 0. Each
    row's drafted tokens go to ``verify_drafts`` (the step keeps a verify row's state at its last
    accepted token from them, ``runner/rollback.py``)."""
    points, out = [], []
    for i, row in enumerate(rows):
        verify_drafts[i] = row.num_draft
        if row.num_draft:
            last_known = int(cu_seqlens[i + 1]) - 1 - row.num_draft
            out.append((row.request_id, len(points), row.num_draft))
            points.extend(range(last_known, last_known + row.num_draft))
    if len(points) > verify_index.shape[0]:
        raise ValueError(f"{len(points)} drafted tokens exceed the variant's {len(verify_index)} verify points")
    verify_index[: len(points)] = points
    return tuple(out)


def fill_verify_sampling(
    inputs: StepInputs, rows: Sequence[RowPlan], sampling: Mapping[int, SamplingRow], window: int
) -> None:
    """What the verify points of penalised and constrained verify rows sample with (module
    docstring), after the rows' own settings are written (a constrained row's own mask is
    rewritten: it follows the whole draft). Raises ``ValueError`` when a penalised row's context
    and draft exceed ``window``."""
    first = 0
    for i, row in enumerate(rows):
        k = row.num_draft
        if not k:
            continue
        p = sampling.get(row.request_id)
        draft = row.tokens[len(row.tokens) - k :]
        if p is not None and p.has_penalty:
            n = len(p.prompt) + len(p.output)
            if n + k > window:
                raise ValueError(
                    f"request {row.request_id}: {n} context tokens and {k} drafted exceed the penalty window {window}"
                )
            inputs.ctx_ids[i, n : n + k] = draft
            inputs.ctx_out[i, n : n + k] = True
            inputs.verify_ctx_end[first : first + k] = np.arange(n, n + k)
        if p is not None and p.grammar is not None:
            p.grammar.draft_masks(draft, inputs.verify_mask[first : first + k], inputs.token_mask[i])
        first += k
