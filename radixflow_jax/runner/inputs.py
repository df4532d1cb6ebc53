"""Turn a round plan into the fixed-shape numpy arrays of one step (host side, no JAX).

Layout (``runner/shapes.py``, ``runner/window.py``): the decode region's rows are the plan's
windowable one-token rows of the round's :class:`~radixflow_jax.runner.window.DecodePlacement`,
row ``slot - base`` each (``decode_base = base``), rows ``[:num_decode]`` owning token slots
``[:num_decode]``; decode positions they leave free hold *padding decode rows* (one token, id 0, at
position 0 of page 0, state slot 0). The other rows, in plan order, pack their spans into the
prefill region from token slot ``num_decode`` on; prefill rows left free are empty spans at the
end.

Padding rules (docs/design.md, "One round"): padding tokens write their KV into the reserved page 0,
padding rows run in the reserved state slot 0 and copy slot 0 onto itself, padding emits write
slot 0. A padded token never changes a real page or slot.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Mapping, NamedTuple, Protocol, Sequence

import numpy as np

from radixflow_jax.runner.shapes import Variant
from radixflow_jax.runner.emits import fill_emits
from radixflow_jax.runner.mtpinputs import fill_mtp_next
from radixflow_jax.runner.verify import fill_verify, fill_verify_sampling
from radixflow_jax.runner.window import DecodePlacement, place_decode
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan


class RowMask(Protocol):
    """A request's grammar (``engine/grammar.GrammarState``): writes its allowed next tokens."""

    def mask_into(self, row: np.ndarray) -> None: ...

    def draft_masks(self, draft: Sequence[int], points: np.ndarray, after: np.ndarray) -> None: ...


@dataclasses.dataclass(frozen=True)
class SamplingRow:
    """Per-request sampling settings as the device needs them (``top_k`` 0 = off). With a penalty
    set, ``prompt`` and ``output`` are the request's token ids (``output`` the live list the
    scheduler appends to), written into the round's context window. ``grammar``: the request's
    structured-output matcher, whose mask of the next token is written when a round samples the row."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int = -1  # top alternatives to return per sampled token; -1: no logprobs
    bias: tuple[tuple[int, float], ...] = ()  # logit_bias: (token id, added to its logit)
    ban: tuple[int, ...] = ()  # min_tokens: token ids masked while the sampled position is < ban_until
    ban_until: int = 0
    prompt: tuple[int, ...] = dataclasses.field(default=(), compare=False, repr=False)
    output: Sequence[int] = dataclasses.field(default=(), compare=False, repr=False)
    grammar: RowMask | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def has_penalty(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


GREEDY = SamplingRow()
BIAS_WIDTH = 128  # bias entries (logit_bias + min_tokens bans) one row may carry
_ALWAYS = np.iinfo(np.int32).max  # ban_until of a logit_bias entry: it applies at every position


class StepInputs(NamedTuple):
    """Every array the step takes, by name: a pytree (the step reads ``inputs.tokens``), flattened
    in field order. Shapes depend only on the variant (``T`` tokens, ``R`` rows, ``M`` emits, the
    penalty window ``W``, ``BIAS_WIDTH`` ``B``, the grammar mask width, ``O`` the length of the
    previous round's sampled array). The engine may swap an array for an equal one kept on the
    device (``_replace``); a swap never changes a shape or dtype."""

    tokens: np.ndarray  # int32 [T]
    cu_seqlens: np.ndarray  # int32 [R + 1]
    kv_lens: np.ndarray  # int32 [R]
    page_table: np.ndarray  # int32 [R, max_pages]
    slot_mapping: np.ndarray  # int32 [T]
    state_slots: np.ndarray  # int32 [R]
    copy_src: np.ndarray  # int32 [R]
    emit_rows: np.ndarray  # int32 [M]
    emit_offsets: np.ndarray  # int32 [M]
    emit_slots: np.ndarray  # int32 [M]
    logits_index: np.ndarray  # int32 [R]: last token of each row
    temperature: np.ndarray  # float32 [R]
    top_k: np.ndarray  # int32 [R]
    top_p: np.ndarray  # float32 [R]
    min_p: np.ndarray  # float32 [R]
    seed: np.ndarray  # uint32 [R]
    position: np.ndarray  # int32 [R]: position of the sampled token (per-request RNG stream)
    presence: np.ndarray  # float32 [R]
    frequency: np.ndarray  # float32 [R]
    repetition: np.ndarray  # float32 [R]
    ctx_ids: np.ndarray  # int32 [R, W]: penalised rows' prompt + output ids, -1 = empty
    ctx_out: np.ndarray  # bool [R, W]: the entry is a generated token
    want_logprobs: np.ndarray  # bool [R]: the row asked for logprobs (the step skips them when none did)
    bias_ids: np.ndarray  # int32 [R, B]: token ids of bias entries, -1 = empty
    bias_vals: np.ndarray  # float32 [R, B]: added to those logits (-inf: a min_tokens ban)
    bias_until: np.ndarray  # int32 [R, B]: an entry applies while the sampled position is below it
    pair_emit: np.ndarray  # int32 [R]: a paired consumer's initial state is emit pair_emit[r]; -1 = unpaired
    decode_base: np.ndarray  # int32 []: decode row r runs in state slot decode_base + r
    token_mask: np.ndarray  # int32 [R, ceil(V/32)]: grammar mask, bit v%32 of word v//32; all ones (-1): none
    splice_src: np.ndarray  # int32 [T]: overlap, input token t is prev_tokens[splice_src[t]] when >= 0
    prev_tokens: np.ndarray  # int32 [O]: the previous round's sampled array (overlap; zeros: none)
    verify_index: np.ndarray  # int32 [V]: speculative decoding, the tokens whose successor the step samples
    verify_ctx_end: np.ndarray  # int32 [V]: a verify point's penalty context, its row's first entries (runner/verify)
    verify_mask: np.ndarray  # int32 [V, mask words]: a verify point's grammar mask (all ones: none)
    verify_drafts: np.ndarray  # int32 [R]: a verify row's drafted tokens (0: not one; runner/rollback)
    mtp_next: np.ndarray  # int32 [T]: the token after each slot where known, -1: the one sampled there (runner/mtpstep)


@dataclasses.dataclass
class StepArrays:
    """A built round: the step's :class:`StepInputs` and what stays on the host."""

    inputs: StepInputs
    plan_rows: np.ndarray
    """the array row of each plan row (``sampled[plan_rows[i]]`` belongs to ``plan.rows[i]``)"""

    masked_rows: int = 0
    """rows whose ``token_mask`` a grammar wrote (0: the mask is all ones)"""

    verify_points: tuple[tuple[int, int, int], ...] = ()
    """``(request id, first verify point, drafted tokens)`` of each verify row (``RowPlan.num_draft``)"""


# a padding decode row: one token at position 0 of page 0, in slot 0
_PAD_DECODE = RowPlan(
    request_id=-1, tokens=(0,), start=0, pages=(0,), slot=0, copy_from=None, emits=(), sample=False
)


def build_arrays(
    plan: RoundPlan, variant: Variant, *, page_size: int, max_pages: int, sampling: Mapping[int, SamplingRow],
    penalty_window: int = 0, decode: DecodePlacement | None = None, mask_words: int = 0, num_out: int = 0,
    mtp: bool = False,
) -> StepArrays:
    """``penalty_window``: width ``W`` of the penalty context arrays (0: penalties unavailable);
    ``mtp``: the step drafts with the model's MTP layer, which reads ``mtp_next`` (else left -1);
    ``mask_words``: width of the grammar mask (0: structured outputs unavailable);
    ``num_out``: length of the sampled array the step returns (``runner/step.out_rows``), which
    ``prev_tokens`` takes (at least the variant's rows); the round splices no token from another;
    ``decode``: the round's decode placement (``runner/window.select_round``; None: placed here,
    with ``base`` the lowest decode slot, which the caller must know fits its pool).

    Every check runs before the arrays it guards are written, in this order (the first failing one
    raises ``ValueError``): the decode window, the variant's capacity, each row's pages, decode-row
    emits, pairings, penalty contexts."""
    if decode is None:
        decode = place_decode(plan, variant.num_decode)
    order = _check_fits(plan, variant, decode)
    prefill = tuple(plan.rows[i] for i in order)
    region = [_PAD_DECODE] * variant.num_decode
    for i in decode.rows:
        region[plan.rows[i].slot - decode.base] = plan.rows[i]
    rows = tuple(region) + prefill
    _check_pages(rows, page_size, max_pages)
    inputs = empty_inputs(
        variant,
        max_pages,
        penalty_window=penalty_window,
        num_out=num_out,
        mask_words=mask_words,
        decode_base=decode.base,
    )
    _fill_tokens(inputs, rows, page_size)
    if mtp:
        fill_mtp_next(inputs.mtp_next, inputs.tokens, inputs.cu_seqlens, rows)
    verify_points = fill_verify(inputs.verify_index, inputs.verify_drafts, inputs.cu_seqlens, rows)
    fill_emits(inputs, rows, variant.num_decode)
    masked_rows = _fill_sampling(inputs, rows, sampling, penalty_window)
    if verify_points:
        fill_verify_sampling(inputs, rows, sampling, penalty_window)
    plan_rows = np.zeros(len(plan.rows), np.int64)
    for i in decode.rows:
        plan_rows[i] = plan.rows[i].slot - decode.base
    plan_rows[order] = np.arange(variant.num_decode, variant.num_decode + len(prefill))
    return StepArrays(inputs=inputs, plan_rows=plan_rows, masked_rows=masked_rows, verify_points=verify_points)


def _check_fits(plan: RoundPlan, variant: Variant, decode: DecodePlacement) -> list[int]:
    """Raises unless the placed decode rows fit the decode window and the other rows (tokens, rows,
    and every row's emits) fit the variant; returns the plan indices of the other rows, in order.
    Checked before filling: an oversized plan must raise this, not an index/broadcast error halfway."""
    d = len(decode.rows)
    fits = all(0 <= plan.rows[i].slot - decode.base < variant.num_decode for i in decode.rows)
    if d > variant.num_decode or not fits:
        raise ValueError(
            f"decode rows of slots {[plan.rows[i].slot for i in decode.rows]} do not fit the window "
            f"of {variant.num_decode} slots from {decode.base}"
        )
    in_window = set(decode.rows)
    order = [i for i in range(len(plan.rows)) if i not in in_window]
    prefill_tokens = sum(len(plan.rows[i].tokens) for i in order)
    num_emits = sum(len(row.emits) for row in plan.rows)
    if prefill_tokens > variant.prefill_tokens or len(order) > variant.prefill_rows or num_emits > variant.max_emits:
        raise ValueError(
            f"plan ({d} decode rows; {prefill_tokens} tokens in {len(order)} other rows; {num_emits} emits) "
            f"exceeds variant {variant}"
        )
    return order


def _check_pages(rows: Sequence[RowPlan], page_size: int, max_pages: int) -> None:
    """Raises unless every row's pages fit the page table and cover the positions it writes."""
    for row in rows:
        n = len(row.tokens)
        if len(row.pages) > max_pages:
            raise ValueError(f"request {row.request_id} needs {len(row.pages)} pages, the page table holds {max_pages}")
        if len(row.pages) * page_size < row.start + n:
            raise ValueError(
                f"request {row.request_id}: {len(row.pages)} pages of {page_size} do not cover positions "
                f"{row.start}..{row.start + n - 1}"
            )


def empty_inputs(
    variant: Variant, max_pages: int, *, penalty_window: int = 0, num_out: int = 0, mask_words: int = 0,
    decode_base: int = 0,
) -> StepInputs:
    """The inputs of ``variant`` with every row and token padding (neutral sampling, no emits, no
    splice); the one statement of every input's shape and dtype (``runner/step.input_specs``)."""
    t, r, m = variant.num_tokens, variant.num_rows, variant.max_emits
    return StepInputs(
        tokens=np.zeros(t, np.int32),
        cu_seqlens=np.zeros(r + 1, np.int32),
        kv_lens=np.zeros(r, np.int32),
        page_table=np.zeros((r, max_pages), np.int32),
        slot_mapping=np.zeros(t, np.int32),
        state_slots=np.zeros(r, np.int32),
        copy_src=np.zeros(r, np.int32),
        emit_rows=np.zeros(m, np.int32),
        emit_offsets=np.zeros(m, np.int32),
        emit_slots=np.zeros(m, np.int32),
        logits_index=np.zeros(r, np.int32),
        temperature=np.zeros(r, np.float32),
        top_k=np.zeros(r, np.int32),
        top_p=np.ones(r, np.float32),
        min_p=np.zeros(r, np.float32),
        seed=np.zeros(r, np.uint32),
        position=np.zeros(r, np.int32),
        presence=np.zeros(r, np.float32),
        frequency=np.zeros(r, np.float32),
        repetition=np.ones(r, np.float32),
        ctx_ids=np.full((r, penalty_window), -1, np.int32),
        ctx_out=np.zeros((r, penalty_window), np.bool_),
        want_logprobs=np.zeros(r, np.bool_),
        bias_ids=np.full((r, BIAS_WIDTH), -1, np.int32),
        bias_vals=np.zeros((r, BIAS_WIDTH), np.float32),
        bias_until=np.zeros((r, BIAS_WIDTH), np.int32),
        pair_emit=np.full(r, -1, np.int32),
        decode_base=np.asarray(decode_base, np.int32),
        token_mask=np.full((r, mask_words), -1, np.int32),
        splice_src=np.full(t, -1, np.int32),
        prev_tokens=np.zeros(max(num_out, r), np.int32),
        verify_index=np.zeros(variant.num_verify, np.int32),
        verify_ctx_end=np.zeros(variant.num_verify, np.int32),
        verify_mask=np.full((variant.num_verify, mask_words), -1, np.int32),
        verify_drafts=np.zeros(r, np.int32),
        mtp_next=np.full(t, -1, np.int32),
    )


def _fill_tokens(inputs: StepInputs, rows: Sequence[RowPlan], page_size: int) -> None:
    """Token ids, page table, KV slot of every token, row boundaries and lengths, state slots.
    Rows past ``len(rows)`` stay empty spans at the end (``cu_seqlens`` repeats the total)."""
    nr = len(rows)
    lens = [len(row.tokens) for row in rows]
    starts = [row.start for row in rows]
    # one vectorised pass per array: per-row numpy calls dominated the host overhead
    cu = np.zeros(nr + 1, np.int64)
    np.cumsum(lens, out=cu[1:])
    total = int(cu[-1])
    inputs.tokens[:total] = np.fromiter(itertools.chain.from_iterable(row.tokens for row in rows), np.int32, total)
    for i, row in enumerate(rows):
        inputs.page_table[i, : len(row.pages)] = row.pages
    row_of = np.repeat(np.arange(nr), lens)
    pos = np.asarray(starts, np.int64)[row_of] + (np.arange(total) - cu[:-1][row_of])
    inputs.slot_mapping[:total] = inputs.page_table[row_of, pos // page_size] * page_size + pos % page_size
    inputs.cu_seqlens[: nr + 1] = cu
    inputs.cu_seqlens[nr + 1 :] = total
    inputs.kv_lens[:nr] = cu[1:] - cu[:-1] + np.asarray(starts, np.int64)
    inputs.position[:nr] = inputs.kv_lens[:nr]
    inputs.logits_index[:nr] = cu[1:] - 1
    inputs.state_slots[:nr] = [row.slot for row in rows]
    inputs.copy_src[:nr] = [row.slot if row.copy_from is None else row.copy_from for row in rows]
    if any(row.twin_id is not None for row in rows):
        _fill_riders(inputs, rows)


def _fill_riders(inputs: StepInputs, rows: Sequence[RowPlan]) -> None:
    """A rider row (``scheduler/riders.py``) computes no token and runs in the sink slot; it samples
    position ``start`` from its producer row's last token. The model's last layer queries each row's
    last token with that row's page table and context length (``models/mixers/attention.py``,
    ``row_last``), so the rider row carries its producer's: its own partial last page is written
    only after the step (``RoundPlan.page_copies``)."""
    index_of = {row.request_id: i for i, row in enumerate(rows) if row.twin_id is None and row.request_id >= 0}
    for i, row in enumerate(rows):
        if row.twin_id is None:
            continue
        producer = index_of.get(row.twin_id)
        if producer is None or not rows[producer].sample:
            raise ValueError(
                f"request {row.request_id} rides request {row.twin_id}, which samples in no row of the round"
            )
        inputs.kv_lens[i] = inputs.kv_lens[producer]
        inputs.page_table[i] = inputs.page_table[producer]
        inputs.position[i] = row.start
        inputs.logits_index[i] = inputs.logits_index[producer]


def _fill_sampling(
    inputs: StepInputs, rows: Sequence[RowPlan], sampling: Mapping[int, SamplingRow], window: int
) -> int:
    """Each row's sampling settings (``GREEDY`` for a request without any, and for padding rows);
    a penalised row's prompt + output ids, which must fit the penalty ``window``, go into ``ctx_ids``.
    Returns how many rows' grammar mask it wrote."""
    nr, masked_rows = len(rows), 0
    params = [sampling.get(row.request_id, GREEDY) for row in rows]
    inputs.temperature[:nr] = [p.temperature for p in params]
    inputs.top_k[:nr] = [p.top_k for p in params]
    inputs.top_p[:nr] = [p.top_p for p in params]
    inputs.min_p[:nr] = [p.min_p for p in params]
    inputs.seed[:nr] = [p.seed & 0xFFFFFFFF for p in params]
    inputs.want_logprobs[:nr] = [p.logprobs >= 0 for p in params]
    for i, p in enumerate(params):
        if p.bias or p.ban:
            _fill_bias(inputs, i, p)
        if p.grammar is not None and rows[i].sample:
            if not inputs.token_mask.shape[1]:
                raise ValueError(f"request {rows[i].request_id} has a grammar; this step has no grammar mask")
            if not rows[i].num_draft:  # a verify row's mask follows its draft (runner/verify.py)
                p.grammar.mask_into(inputs.token_mask[i])
            masked_rows += 1
        if p.has_penalty:
            n_prompt, n_out = len(p.prompt), len(p.output)
            if n_prompt + n_out > window:
                raise ValueError(
                    f"request {rows[i].request_id}: {n_prompt + n_out} context tokens exceed the penalty window "
                    f"{window}"
                )
            inputs.presence[i], inputs.frequency[i] = p.presence_penalty, p.frequency_penalty
            inputs.repetition[i] = p.repetition_penalty
            inputs.ctx_ids[i, :n_prompt] = p.prompt
            inputs.ctx_ids[i, n_prompt : n_prompt + n_out] = p.output
            inputs.ctx_out[i, n_prompt : n_prompt + n_out] = True
    return masked_rows


def check_row(row: SamplingRow, *, penalty_window: int = 0) -> None:
    """Raises what writing ``row`` into a round's sampling arrays would raise (a value out of its
    dtype's range, too many bias entries, a penalty context over ``penalty_window``), by writing it
    into the arrays of a one-row round with :func:`_fill_sampling`, the code every round runs. The
    grammar mask is left out: it is written per round, from the matcher's state then."""
    inputs = empty_inputs(_ONE_ROW, 1, penalty_window=penalty_window)
    _fill_sampling(inputs, (_PAD_DECODE,), {_PAD_DECODE.request_id: row}, penalty_window)


_ONE_ROW = Variant(num_tokens=1, num_rows=1, num_decode=1, max_emits=0)


def _fill_bias(inputs: StepInputs, i: int, p: SamplingRow) -> None:
    """Row ``i``'s logit_bias entries, then its min_tokens bans (which must fit ``BIAS_WIDTH``)."""
    nb, nban = len(p.bias), len(p.ban)
    if nb + nban > BIAS_WIDTH:
        raise ValueError(f"{nb} logit_bias entries + {nban} banned stop tokens exceed the {BIAS_WIDTH} bias slots")
    if nb:
        ids, vals = zip(*p.bias)
        inputs.bias_ids[i, :nb], inputs.bias_vals[i, :nb], inputs.bias_until[i, :nb] = ids, vals, _ALWAYS
    if nban:
        inputs.bias_ids[i, nb : nb + nban], inputs.bias_vals[i, nb : nb + nban] = p.ban, -np.inf
        inputs.bias_until[i, nb : nb + nban] = p.ban_until


def padding_inputs(
    variant: Variant, max_pages: int, *, penalty_window: int = 0, num_out: int = 0, mask_words: int = 0
) -> StepInputs:
    """The inputs of a round with no real row (warm-up executions): every row and token is padding."""
    empty = RoundPlan(rows=(), num_decode=0, stats=RoundStats())
    built = build_arrays(
        empty, variant, page_size=1, max_pages=max_pages, sampling={}, penalty_window=penalty_window,
        mask_words=mask_words, num_out=num_out,
    )
    return built.inputs
