"""The shadow executor: a simulated device whose memory is symbolic, so every read is checked.

It runs a round the way the jitted step does (docs/design.md, "One round"), over token ids instead of
tensors: a KV page holds the token ids written at its positions; a state slot holds
``(depth, digest)``, the number of tokens the recurrent state has consumed and a digest of exactly
those tokens. A row first reads (its context from the KV pages written before this round, its
initial state from ``copy_from``, from zero when its span starts at 0, else from its own slot),
then every row writes (its span's KV, its slot's new state, its checkpoint emits), then the
"model" samples ``token_for(context + span)``: a deterministic function of the whole sequence, so
a greedy output equals the cold run's exactly when every context and state read was right.

Paired consumers (policy ``pair``, ``RowPlan.pair_slot``) run as the step runs them: after every
unpaired row of the round has read and written, they read their context (which may now include
the KV their producer wrote in this round) and take their initial state from the emit of an
unpaired row *of this round* into ``pair_slot`` (a value left in that slot by an earlier round is
never taken: the step does not read the pool there), then write like any row.

Riders (``RowPlan.twin_id``) read and write nothing themselves: each samples ``token_for`` its
producer's sequence, which must end this round at the rider's prompt length; the producer's emit
wrote the rider's slot, and the plan's page copies (applied after every row) give it the partial
page, so its next row's context and state checks cover both. A plan's state moves (finished
requests' kept ends leaving the request band, spills to the host tier's ``host`` and restores from
it, KV pages' spills to its ``host_pages`` and restores from them) are applied in order before every
row, as the executor does, so a restored checkpoint that does not hold what was spilled fails the
state check of the row that reads it, and a restored page that does not fails its context check.

A verify row (speculative decoding, ``RowPlan.num_draft``, with ``verify=True``) runs like any row
over its known tokens and its drafted ones (only the known ones are checked against the request's
real tokens) and returns, besides its sample after the whole draft, the model's token after its
last known token and after each drafted token but the last (``StepResult.verified``); the state
after its last accepted token (the greedy rule over those tokens, uncut) goes to its slot (the
spare slot the scheduler gave it), as the step keeps it (``runner/rollback.py``).

Checked on every row (a failure is recorded in ``violations`` and raised as :class:`ShadowMismatch`):
  * no real row runs in the reserved page 0 or slot 0;
  * the context is fully written and (with ``truth``) equals the request's real tokens;
  * the initial state is the state of exactly that context: a checkpoint read (``copy_from``) was
    written at the depth the row starts from, so no pending (unwritten) or stale checkpoint is read;
    a paired row's state was emitted in this round, at its start depth, by an unpaired row;
  * no two rows of a round write the same KV position.
:meth:`reset` empties the memory (rebuilt pools); :meth:`lose_device_state` scrambles it (what a
failed step that consumed donated pools leaves): after either, only recomputed data reads back.
No JAX here.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from radixflow_jax.engine.protocol import ExecutorCapabilities, StepResult
from radixflow_jax.runner.inputs import SamplingRow
from radixflow_jax.scheduler.drafts import accepted_length
from radixflow_jax.scheduler.plan import RoundPlan, RowPlan

FIRST_TOKEN = 3  # sampled ids are >= this (0..2 stay free for stop tokens in tests)


class ShadowMismatch(AssertionError):
    """A round read memory that does not hold what a cold run would have computed."""


def token_for(sequence: Sequence[int], vocab: int) -> int:
    """The shadow model's greedy next token after ``sequence`` (deterministic, no hash seed)."""
    return FIRST_TOKEN + hash(tuple(sequence)) % (vocab - FIRST_TOKEN)


class ShadowExecutor:
    """See the module docstring. ``truth(request_id)``: the request's real tokens (prompt + output
    so far), to check contexts against; ``round_s``: the virtual time a round takes on ``clock``;
    ``verify``: return verify tokens (speculative decoding). No other capabilities: synchronous,
    no logprobs, no penalties, no round cost model."""

    def __init__(
        self,
        page_size: int,
        *,
        hybrid: bool = True,
        vocab: int = 1000,
        truth: Callable[[int], Sequence[int]] | None = None,
        clock: object | None = None,
        round_s: float = 1e-3,
        verify: bool = False,
    ):
        self.capabilities = ExecutorCapabilities(verify=verify)
        if vocab <= FIRST_TOKEN:
            raise ValueError(f"vocab must exceed {FIRST_TOKEN}, got {vocab}")
        self.page_size = page_size
        self.hybrid = hybrid
        self.vocab = vocab
        self.truth = truth
        self.clock = clock
        self.round_s = round_s
        self.pages: dict[int, list[int | None]] = {}
        self.slots: dict[int, tuple[int, int]] = {}
        self.host: dict[int, tuple[int, int]] = {}  # the host tier's checkpoint rows (spills, restores)
        self.host_pages: dict[int, list[int | None]] = {}  # the host tier's KV pages (kv_spill, kv_restore)
        self.violations: list[str] = []
        self.rounds = 0
        self.rows_checked = 0
        self.checkpoint_reads = 0
        self.pair_reads = 0

    # ------------------------------------------------------------------ memory
    def reset(self) -> None:
        """Rebuilt pools: nothing is written any more."""
        self.pages.clear()
        self.slots.clear()

    def lose_device_state(self) -> None:
        """What a step that consumed its donated pools leaves behind: garbage everywhere."""
        for page in self.pages.values():
            page[:] = [-1] * len(page)
        self.slots = {s: (-1, -1) for s in self.slots}

    def _fail(self, message: str) -> None:
        self.violations.append(message)
        raise ShadowMismatch(message)

    def _context(self, row: RowPlan) -> tuple[int, ...]:
        p = self.page_size
        ctx: list[int | None] = []
        for i in range(-(-row.start // p)):
            page = self.pages.get(row.pages[i])
            ctx.extend(page if page is not None else [None] * p)
        del ctx[row.start :]
        if None in ctx:
            self._fail(f"request {row.request_id} reads unwritten KV at position {ctx.index(None)}")
        return tuple(ctx)  # type: ignore[arg-type]

    def _initial_state(self, row: RowPlan, ctx: tuple[int, ...], emitted: set[int]) -> None:
        if row.pair_slot is not None:
            if row.pair_slot not in emitted:
                self._fail(f"request {row.request_id} pairs with slot {row.pair_slot}, which no unpaired row of "
                           f"round {self.rounds} emits")
            src, what = row.pair_slot, f"the in-round emit into slot {row.pair_slot}"
            self.pair_reads += 1
        elif row.copy_from is not None:
            src, what = row.copy_from, f"checkpoint slot {row.copy_from}"
            self.checkpoint_reads += 1
        elif row.start == 0:
            return  # a fresh row starts from the zero state
        else:
            src, what = row.slot, f"its own slot {row.slot}"
        state = self.slots.get(src)
        if state is None:
            self._fail(f"request {row.request_id} reads {what}, never written (pending or lost)")
        elif state != (row.start, hash(ctx)):
            self._fail(f"request {row.request_id} starts at {row.start} from {what} holding the state after "
                       f"{state[0]} tokens of another context")

    # ------------------------------------------------------------------ the round
    def execute(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow]) -> StepResult:
        written: set[tuple[int, int]] = set()  # KV positions written in this round
        emitted: set[int] = set()  # checkpoint slots unpaired rows emitted in this round
        sampled: dict[int, int] = {}
        verified: dict[int, tuple[int, ...]] = {}
        unpaired = [row for row in plan.rows if row.pair_slot is None and row.twin_id is None]
        paired = [row for row in plan.rows if row.pair_slot is not None]
        sequences: dict[int, tuple[int, ...]] = {}
        self._move_states(plan)
        for src, dst in plan.copies_before(self.page_size):  # before the step, as the executor copies them
            self.pages[dst] = list(self.pages.get(src, [None] * self.page_size))
        for phase in (unpaired, paired):  # the step's order: producers, then their partners
            reads = [self._read(row, emitted) for row in phase]  # every read of a phase before its writes
            for row, seq in zip(phase, reads):
                depth = len(seq)
                if row.num_draft and row.sample:  # the model's token after the last known and each drafted one
                    known = len(seq) - row.num_draft
                    after = tuple(token_for(seq[: known + j], self.vocab) for j in range(row.num_draft))
                    verified[row.request_id] = after
                    depth = known + accepted_length(seq[known:], after)  # the state kept (runner/rollback.py)
                self._write(row, seq, written, emitted if phase is unpaired else None, sampled, depth)
                sequences[row.request_id] = seq
        for row in plan.rows:
            if row.twin_id is not None:
                self._ride(row, plan, sequences, sampled)
        for src, dst in plan.page_copies:  # after the step, as the executor copies them
            self.pages[dst] = list(self.pages.get(src, [None] * self.page_size))
        self.rounds += 1
        if self.clock is not None:
            self.clock.advance(self.round_s)  # type: ignore[attr-defined]
        return StepResult(
            sampled=sampled, token_slots=plan.num_tokens, row_slots=len(plan.rows), build_s=0.0, step_s=self.round_s,
            verified=verified,
        )

    def _move_states(self, plan: RoundPlan) -> None:
        """The plan's state moves, before the step, in order, as the executor makes them: a spill
        copies a slot (``kv_spill``: a page) into the host tier, a restore copies it back; a host
        row never written restores garbage (a slot) or unwritten KV (a page), which the row that
        reads it fails on."""
        blank = [None] * self.page_size
        for move in plan.state_moves:
            if move.kind == "spill":
                self.host[move.dst] = self.slots.get(move.src, (-1, -1))
            elif move.kind == "kv_spill":
                self.host_pages[move.dst] = list(self.pages.get(move.src, blank))
            elif move.kind == "kv_restore":
                self.pages[move.dst] = list(self.host_pages.get(move.src, blank))
            else:
                source = self.host if move.kind == "restore" else self.slots
                self.slots[move.dst] = source.get(move.src, (-1, -1))

    def _ride(self, row: RowPlan, plan: RoundPlan, sequences: Mapping[int, tuple[int, ...]], sampled: dict[int, int]) -> None:
        """A rider samples from its producer's last position: the producer's row must sample in this
        round and its whole sequence must be the rider's context (its prompt)."""
        producer = next((r for r in plan.rows if r.request_id == row.twin_id and r.twin_id is None), None)
        seq = sequences.get(row.twin_id)
        if producer is None or seq is None or not producer.sample or len(seq) != row.start:
            self._fail(f"request {row.request_id} rides request {row.twin_id}, which does not end a sequence of "
                       f"{row.start} tokens in round {self.rounds}")
            return
        if self.truth is not None and tuple(self.truth(row.request_id)[: row.start]) != seq:
            self._fail(f"request {row.request_id} rides request {row.twin_id} whose prompt is not its own")
        self.rows_checked += 1
        sampled[row.request_id] = token_for(seq, self.vocab)

    def _read(self, row: RowPlan, emitted: set[int]) -> tuple[int, ...]:
        p, end = self.page_size, row.start + len(row.tokens)
        if any(page == 0 for page in row.pages[: -(-end // p)]) or (self.hybrid and row.slot == 0):
            self._fail(f"request {row.request_id} runs in the reserved page 0 or slot 0")
        ctx = self._context(row)
        known = end - row.num_draft  # drafted tokens are guesses, not yet the request's
        if self.truth is not None and tuple(self.truth(row.request_id)[:known]) != (ctx + row.tokens)[:known]:
            self._fail(f"request {row.request_id}: the context of its span [{row.start}, {end}) is not its tokens")
        if self.hybrid:
            self._initial_state(row, ctx, emitted)
        self.rows_checked += 1
        return ctx + row.tokens

    def _write(
        self,
        row: RowPlan,
        seq: tuple[int, ...],
        written: set[tuple[int, int]],
        emitted: set[int] | None,
        sampled: dict[int, int],
        depth: int,
    ) -> None:
        p = self.page_size
        for pos in range(row.start, len(seq)):
            page_id = row.pages[pos // p]
            if (page_id, pos % p) in written:
                self._fail(f"two rows of round {self.rounds} write page {page_id} position {pos % p}")
            written.add((page_id, pos % p))
            self.pages.setdefault(page_id, [None] * p)[pos % p] = seq[pos]
        if self.hybrid:
            self.slots[row.slot] = (depth, hash(seq[:depth]))
            for offset, slot in row.emits:
                depth = row.start + offset
                self.slots[slot] = (depth, hash(seq[:depth]))
                if emitted is not None:
                    emitted.add(slot)
        if row.sample:
            sampled[row.request_id] = token_for(seq, self.vocab)
