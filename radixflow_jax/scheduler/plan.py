"""The round plan (scheduler -> runner) and round statistics (for metrics).

A plan is plain data over integers. Rows with a one-token span come first (``num_decode`` of them)
so the model can run them through the one-step recurrent updates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from radixflow_jax.cache import StateMove

UNKNOWN_TOKEN = -1
"""Overlap: a token sampled by a round still in flight. A row whose input is this token takes it on the
device from that round's sampled array (``engine/executor.py``); the commit fence replaces it in the
request's output."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RowPlan:
    """One request's work in a round (constructed with keyword arguments only).

    ``tokens`` are computed at positions ``start .. start + len(tokens) - 1``; ``pages`` is the page
    table covering ``start + len(tokens)`` tokens; ``slot`` the row's state slot (0 for attention-only
    models); ``copy_from``: a committed checkpoint slot copied into ``slot`` before the model runs;
    ``emits``: ``(offset, slot)`` pairs, the state after ``offset`` tokens of the span written into a
    checkpoint slot (offset is a chunk multiple or the span length); ``sample``: the span ends the
    known tokens, so the next token is sampled from its last position.
    ``pair_slot`` (policy ``pair``): the row is a *paired consumer*; its initial state is the state
    another (unpaired) row of the same round emits into this checkpoint slot, taken inside the step
    (never read from the pool), and its page table starts with that producer's pages, which the
    step writes before attention reads them.
    ``copy_page_from`` (a request starting at a tail, an exact-depth checkpoint off the page grid,
    ``cache/tree.py``): the tail's committed partial page, which the executor copies into the row's
    page ``pages[start // page_size]`` before the step, so the row attends to the tail's tokens
    there and writes its own after them; ``None``: no copy.
    ``epoch``: the request's epoch when the row was planned; a row of an earlier epoch (the request
    was preempted or rolled back after planning, overlap) is skipped at commit.
    ``num_draft`` (speculative decoding, a *verify row*): the last ``num_draft`` of ``tokens`` are
    drafted, not known; the row samples (``sample`` is true) a token after its last known token and
    after each drafted one, the step returning the first ``num_draft`` of those as its verify
    tokens (``runner/sampling.verify_draws``) and the last as the row's sample. A verify row reads its state from ``copy_from``
    (the request's slot) and writes ``slot`` (its spare slot), so the request's state before the
    row survives a rejected draft; it emits no checkpoint (only accepted tokens are cached).
    ``twin_id`` (a *rider*, ``scheduler/riders.py``): the request id of the row whose prompt this
    request shares exactly and whose round completes it. A rider row computes no token (``tokens``
    is empty, ``start`` is the prompt length, ``slot`` is 0) and samples its first token from that
    row's last-position logits; the producer row emits its end state into the rider's own slot and
    the plan's ``page_copies`` give it its own copy of the producer's partial last page.
    ``next_token``: the known token after the span when the row does not sample (a prompt's next
    chunk begins with it), else -1; MTP drafts pair it with the span's last hidden state.
    """

    request_id: int
    tokens: tuple[int, ...]
    start: int
    pages: tuple[int, ...]
    slot: int
    copy_from: int | None
    emits: tuple[tuple[int, int], ...]
    sample: bool
    pair_slot: int | None = None
    copy_page_from: int | None = None
    epoch: int = 0
    twin_id: int | None = None
    num_draft: int = 0
    next_token: int = -1

    @property
    def is_decode(self) -> bool:
        return len(self.tokens) == 1

    @property
    def known_end(self) -> int:
        """The position after the row's last known (not drafted) token."""
        return self.start + len(self.tokens) - self.num_draft

    @property
    def is_rider(self) -> bool:
        return self.twin_id is not None


@dataclasses.dataclass
class RoundStats:
    """What the scan decided; the engine adds the slot counts once the runner picked buckets."""

    admitted: int = 0
    consumers_blocked: int = 0  # consumers that hit STOP_ROUND (native)
    consumers_waiting: int = 0  # consumers that got WAIT (radixflow)
    consumers_paired: int = 0  # consumers admitted into their producer's round (pair)
    riders: int = 0  # requests admitted as riders of an identical prompt completed this round
    riders_waiting: int = 0  # requests that wait for their twin's prompt to complete, to ride it
    fill_declined: int = 0  # fill requests the pair policy's cost rule kept out of the round
    pairs_declined: int = 0  # consumers the pair policy's cost rule left waiting instead of pairing
    stopped_by_consumer: bool = False
    stopped_by_memory: bool = False
    shadow_tokens: int = 0  # tokens admissible requests behind a consumer stop would have brought
    shadow_rows: int = 0
    preempted: int = 0
    waited_for_pages: int = 0  # running requests left without a row until a commit in flight frees pages
    evicted_pages: int = 0
    evicted_slots: int = 0
    checkpoints_planted: int = 0  # pending checkpoints this round will emit
    checkpoints_skipped: int = 0  # placements dropped for lack of a state slot
    checkpoints_evicted_unused: int = 0  # committed checkpoints dropped this round before any read
    host_hits: int = 0  # requests whose match resumed from a host checkpoint (read into their slot, or restoring)
    restore_waits: int = 0  # requests that waited this round for a pending restore they started
    host_kv_pages: int = 0  # KV pages brought back from the host tier for requests this round admits
    prefill_first: bool = False  # planned prefill before decode rows (the last round starved a prefill)


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """``rows``: one-token rows first (``num_decode`` of them), rider rows last. ``page_copies``:
    ``(source page, destination page)`` pairs the executor copies (every attention layer's K and V)
    after the round's step, so a rider owns the producer's partial last page as the step left it;
    :meth:`copies_before` the pairs it copies before the step (rows starting at a tail).
    ``state_moves``: the recurrent-state copies (every recurrent layer's conv and SSM state) the
    executor makes before the step, in this order (``cache/results.StateMove``): kept ends leaving
    the request band, spills of demoted checkpoints to the host tier and restores from it
    (``cache/tiers.py``); no row of the round writes a slot a move reads.
    ``restores``: the restore ids among them, committed with the round (a plan with restores runs
    even without rows: a waiting consumer needs its commit)."""

    rows: tuple[RowPlan, ...]
    num_decode: int
    stats: RoundStats
    page_copies: tuple[tuple[int, int], ...] = ()
    state_moves: tuple[StateMove, ...] = ()
    restores: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.rows)

    def copies_before(self, page_size: int) -> tuple[tuple[int, int], ...]:
        """``(source page, destination page)`` pairs copied before the step: each row's
        ``copy_page_from`` into its page ``pages[start // page_size]`` (distinct: each row owns its
        destination)."""
        return tuple(
            (r.copy_page_from, r.pages[r.start // page_size]) for r in self.rows if r.copy_page_from is not None
        )

    @property
    def num_emits(self) -> int:
        """Checkpoint writes of the round (the step's emit entries it fills)."""
        return sum(len(r.emits) for r in self.rows)

    @property
    def is_empty(self) -> bool:
        """Nothing to launch: no rows and no restore (queued moves without either wait)."""
        return not self.rows and not self.restores

    @property
    def num_riders(self) -> int:
        return sum(1 for r in self.rows if r.twin_id is not None)

    @property
    def num_drafted(self) -> int:
        """Drafted tokens the round verifies (speculative decoding)."""
        return sum(r.num_draft for r in self.rows)


def attention_pairs(rows: Sequence[RowPlan]) -> int:
    """Query-key pairs the round's attention computes over its real rows: a row of ``n`` tokens at
    ``start`` attends ``start + 1, ..., start + n`` positions, ``n * start + n (n + 1) / 2`` pairs
    (a decode row: its context length). A feature of the round-cost estimator."""
    return sum(len(r.tokens) * r.start + len(r.tokens) * (len(r.tokens) + 1) // 2 for r in rows)


def pairing_spans(rows: Sequence[RowPlan]) -> dict[int, int]:
    """Policy ``pair``: for each producer row some row of the round pairs with, the tokens of its
    span up to its deepest pairing depth (what a GPU kernel's pre-pass scans, ``kernels/pallas/
    chunk_scan.py``), keyed by the producer's request id. Empty for a round without paired rows."""
    depth_of = {slot: (row.request_id, offset) for row in rows for offset, slot in row.emits}
    deepest: dict[int, int] = {}
    for row in rows:
        if row.pair_slot is not None and row.pair_slot in depth_of:
            producer, offset = depth_of[row.pair_slot]
            deepest[producer] = max(deepest.get(producer, 0), offset)
    return deepest
