"""Fixed step shapes: the buckets a round is padded to, and the variants they make.

A round runs in one *variant* ``(num_tokens, num_rows, num_decode)``. Its slots are split in two
regions (the layout ``build_arrays`` writes and the model reads):
  * the **decode region**: rows ``[:num_decode]`` own token slots ``[:num_decode]``, one each, and
    take the one-step recurrent updates and single-query attention, so a decode row costs one token
    whatever else the round carries. Decode rows the round does not fill are padding rows;
  * the **prefill region**: the remaining ``num_rows - num_decode`` rows pack their spans into the
    remaining ``num_tokens - num_decode`` token slots and go through the chunked scan.

Buckets per region (``mode``):
  * ``"fine"`` (default): prefill tokens on every multiple of ``min_tokens`` up to 128 (16, 32,
    48, ..., 112, 128: a lean round pads at most 15 prefill tokens; a speculating engine adds a
    bucket of 8 for a lone verify row of up to 8 tokens), on every multiple of 64 up to 512 (192,
    256, 320, ...: a first chat turn of 300 tokens beside 8 decode rows pads 12 slots in 320, not
    76 in 384, the largest padding of the head-to-head chat, ``tools/perf/chat_padding.py``), then
    powers of two with a 1.5x step between them (768, 1024, 1536, ...: at most a third of a
    bucket is padding); prefill
    rows on powers of two; decode-only rounds on powers of two with 1.5x steps from 2 (2, 3, 4, 6,
    8, 12, 16, 24, ...); rounds with prefill rows take a coarse decode region (16, 64, ... below
    ``max_num_seqs``, and ``max_num_seqs``), except that a lean mixed round (one prefill row of at
    most 112 tokens: a chat or agent turn) may take a 4-row region (``LEAN_DECODE``), because a
    padded decode row costs one token slot. At ``radixflow serve --max-num-seqs 16`` (512 tokens)
    that is 88 variants in the ``window`` mixed layout (67 packed, below); ``tools/perf/chat_padding.py`` measures the
    padding on the head-to-head chat and agent workloads.
  * ``"pow2"``: powers of two everywhere (the earlier scheme, plus decode regions in mixed rounds).
  * ``"fixed"``: exactly one variant (``max_num_seqs`` decode rows + ``max_num_seqs`` prefill rows over
    ``max_num_batched_tokens`` prefill tokens), as TPU deployments often run: every round has the same shape
    and a filled bubble is free compute.

Where the one-token rows of a round with prefill rows run (``mixed_layout``):
  * ``"window"`` (default): in the decode region, as above;
  * ``"packed"``: in the prefill region with the prompts; a round has a decode region only when
    every row is windowable (a decode-only round), so mixed and prefill-only rounds run without
    one (``num_decode == 0``) and pad only their token and row buckets. It pays where a one-token
    row costs one token in the prefill region too: the native CPU kernels (token-by-token scans,
    per-query attention), which ``EngineConfig.mixed_layout="auto"`` picks. On the CPU a round of
    6 decode rows joined by a 40-token prompt took 68 ms packed (48 token slots) against 85 ms in
    a 16-row decode region (64 slots), and rounds whose buckets came out equal took equal time
    (docs/perf-log.md, 2026-12-06). It does not pay where the chunked scan pads each row to a
    chunk (the Pallas and XLA forms). Mixed variants then come in one set (decode region 0)
    instead of the lean and coarse sets.

Variants compile lazily on first use (persistent XLA cache) or all at warm-up; ``variants()``
lists the whole set. ``max_emits`` (checkpoint writes per round) follows the variant: each row
emits at most ``span / grid + 1`` checkpoints. A decode-only round also has a variant with room
for only ``FEW_EMITS`` checkpoint writes, taken when its plan emits no more: the recurrent layers
compute and write every emit entry, padding included, and a decode row crosses a grid point once
every ``grid`` tokens, so most decode rounds emit nothing (29 of 29 full decode rounds of
``benchmarks/vs_transformers.py``). Measured inside the compiled 64-row decode round of that
workload (2026-12-01, docs/perf-log.md): 65 entries cost 6 ms of about 80 more than 4 do.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools

MODES = ("fine", "pow2", "fixed")
MIXED_LAYOUTS = ("window", "packed")
FEW_EMITS = 4  # the small emit bucket of decode-only variants (staggered rows cross ~rows/grid grid points a round)
LEAN_DECODE = (4,)  # fine: the small decode region of mixed rounds (where below max_num_seqs) ...
LEAN_ROWS = 1  # ... taken only by variants of at most this many prefill rows ...
LEAN_TOKENS = 112  # ... and at most this many prefill tokens (a turn of a chat: its new text + 1)
DECODE_STEP_FROM = 2  # fine: decode-only regions take a 1.5x step after each power of two from this one
TOKEN_STEP_FROM = 64  # fine: prefill token buckets take a 1.5x step after each power of two from this one
LINEAR_TOKENS = 128  # fine: ... and every multiple of min_tokens up to this one ...
MID_STEP, MID_TOKENS = 64, 512  # ... and every multiple of MID_STEP up to MID_TOKENS (a first chat turn)


def powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    """``lo, 2lo, ...`` up to and including the first value ``>= hi``."""
    out, v = [], max(1, lo)
    while True:
        out.append(v)
        if v >= hi:
            return tuple(out)
        v *= 2


def fine_ladder(lo: int, hi: int, start: int) -> tuple[int, ...]:
    """Powers of two from ``lo`` with a ``1.5x`` step after each power ``p >= start``
    (``start=64``: ``..., 32, 64, 96, 128, 192, ...``), capped at ``hi`` (always the last value)."""
    out = []
    for p in powers_of_two(lo, hi):
        out.append(p)
        if p >= start and p % 2 == 0:
            out.append(p // 2 * 3)
    return tuple(sorted({v for v in out if v < hi} | {hi}))


def _first_at_least(buckets: tuple[int, ...], n: int) -> int:
    return buckets[bisect.bisect_left(buckets, n)]


@dataclasses.dataclass(frozen=True)
class Variant:
    """A compiled step's shape. ``num_verify`` (speculative decoding, ``ShapeConfig.max_draft``):
    the step's verify points, where it also samples the next token (0: none); a variant with
    them has ``prefill_rows * max_draft`` (the most drafted tokens its prefill rows can hold)."""

    num_tokens: int
    num_rows: int
    num_decode: int
    max_emits: int
    num_verify: int = 0

    @property
    def prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode

    @property
    def prefill_rows(self) -> int:
        return self.num_rows - self.num_decode

    @property
    def kind(self) -> str:
        """``decode`` (decode region only), ``prefill`` (prefill region only) or ``mixed``."""
        if self.prefill_rows == 0:
            return "decode"
        return "mixed" if self.num_decode else "prefill"


@dataclasses.dataclass(frozen=True)
class ShapeConfig:
    """``max_num_batched_tokens`` / ``max_num_seqs``: the round budgets (the scheduler's options of
    the same names); ``min_tokens``: the smallest prefill token bucket; ``max_pages_per_row``: the
    page-table width (the model context in pages); ``grid``: the checkpoint grid (the engine's
    ``CacheConfig.grid``); ``mode``: the bucket scheme; ``mixed_layout``: where the one-token rows
    of rounds with prefill rows run (both: see the module docstring; ``fixed`` has one variant and
    keeps its decode region). ``mtp``: every variant also drafts with the model's MTP layer
    (speculative method ``mtp``, ``runner/mtpstep.py``)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_pages_per_row: int
    grid: int
    min_tokens: int = 16
    mode: str = "fine"
    mixed_layout: str = "window"
    max_draft: int = 0
    mtp: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"bucket mode {self.mode!r}: expected one of {', '.join(MODES)}")
        if self.mixed_layout not in MIXED_LAYOUTS:
            raise ValueError(f"mixed_layout {self.mixed_layout!r}: expected one of {', '.join(MIXED_LAYOUTS)}")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            budgets = f"max_num_batched_tokens={self.max_num_batched_tokens} and max_num_seqs={self.max_num_seqs}"
            raise ValueError(f"{budgets} must be >= 1")
        if self.max_draft < 0:
            raise ValueError(f"max_draft={self.max_draft} must be >= 0")

    # ------------------------------------------------------------------------------- buckets
    # (computed once per config: ``select`` reads them every round)
    @functools.cached_property
    def token_buckets(self) -> tuple[int, ...]:
        """Prefill-region token buckets."""
        if self.mode == "fixed":
            return (self.max_num_batched_tokens,)
        lo = min(self.min_tokens, self.max_num_batched_tokens)
        if self.mode == "pow2":
            return powers_of_two(lo, self.max_num_batched_tokens)
        linear = [*range(lo, min(LINEAR_TOKENS, self.max_num_batched_tokens) + 1, lo),
                  *range(LINEAR_TOKENS, min(MID_TOKENS, self.max_num_batched_tokens) + 1, MID_STEP)]  # fmt: skip
        # speculative decoding: a lone verify row (its last known token and its draft) in a bucket of
        # a multiple of 8 slots; hybrid-81m's verify round took 24.3 ms in 8 slots against 27.5 in 16
        # (a decode round: 18-19 ms; docs/perf-log.md, 2026-12-07)
        verify = {-(-(self.max_draft + 1) // 8) * 8} if self.max_draft else set()
        verify = {v for v in verify if v < lo and v <= self.max_num_batched_tokens}
        return tuple(sorted(set(fine_ladder(lo, self.max_num_batched_tokens, TOKEN_STEP_FROM)) | set(linear) | verify))

    @functools.cached_property
    def row_buckets(self) -> tuple[int, ...]:
        """Prefill-region row buckets; packed (``mixed_layout``), from 2 rows where ``max_num_seqs``
        allows: without a decode region a one-row variant made XLA copy the conv pools, as a
        one-row decode variant does (``decode_buckets``; ``tests/engine/test_compile_guard.py``)."""
        if self.mode == "fixed":
            return (self.max_num_seqs,)
        return powers_of_two(min(2, self.max_num_seqs) if self.packed else 1, self.max_num_seqs)

    @functools.cached_property
    def decode_buckets(self) -> tuple[int, ...]:
        """Decode-region sizes of decode-only rounds, from 2 rows (where ``max_num_seqs`` allows): in
        a one-row decode variant XLA folds the state reads and writes into single slices and
        then copies every state pool (the compiled program holds one copy per pool, 2026-12-01;
        ``tests/engine/test_compile_guard.py``), while a padding row costs one token."""
        if self.mode == "fixed":
            return ()
        lo = min(2, self.max_num_seqs)
        if self.mode == "pow2":
            return powers_of_two(lo, self.max_num_seqs)
        return fine_ladder(lo, self.max_num_seqs, DECODE_STEP_FROM)

    @functools.cached_property
    def mixed_decode_buckets(self) -> tuple[int, ...]:
        """Decode-region sizes of rounds that carry prefill rows: powers of four from 16 below
        ``max_num_seqs``, and ``max_num_seqs``. A prefill-only round still has the smallest one, as padding
        rows: a padded decode row costs one token slot, and leaving out a ``0`` (and small sizes)
        keeps the mixed variants to one or two sets. Packed (``mixed_layout``): only ``0``."""
        if self.mode == "fixed":
            return (self.max_num_seqs,)
        if self.packed:
            return (0,)
        out, v = [d for d in LEAN_DECODE if d < self.max_num_seqs and self.mode == "fine"], 16
        while v < self.max_num_seqs:
            out.append(v)
            v *= 4
        return tuple(out) + (self.max_num_seqs,)

    @property
    def packed(self) -> bool:
        """Rounds with prefill rows run without a decode region (``mixed_layout="packed"``; not
        under ``fixed``, whose one variant has one)."""
        return self.mixed_layout == "packed" and self.mode != "fixed"

    def _mixed_decode(self, decode: int, prefill_tokens: int, prefill_rows: int) -> bool:
        """Whether a mixed variant of a ``decode``-row region over this prefill region exists: a
        lean decode region (``LEAN_DECODE``) only over a lean prefill region."""
        lean = decode in LEAN_DECODE and decode < self.max_num_seqs and self.mode == "fine"
        return not lean or (prefill_rows <= LEAN_ROWS and prefill_tokens <= LEAN_TOKENS)

    # ------------------------------------------------------------------------------ variants
    def _variant(self, decode: int, prefill_tokens: int, prefill_rows: int, num_emits: int | None = None) -> Variant:
        """``num_emits``: the round's checkpoint writes; a decode-only round that has at most
        ``FEW_EMITS`` gets the small emit bucket (None: the full one)."""
        tokens, rows = decode + prefill_tokens, decode + prefill_rows
        full = rows + tokens // self.grid
        few = prefill_rows == 0 and num_emits is not None and num_emits <= FEW_EMITS < full
        return Variant(tokens, rows, decode, max_emits=FEW_EMITS if few else full)

    def variants(self) -> list[Variant]:
        """Every variant a round can need (what ``warmup="all"`` compiles)."""
        decode_only = [self._variant(n, 0, 0, e) for n in self.decode_buckets for e in (0, None)]
        out = list(dict.fromkeys(decode_only))  # a small decode bucket has no separate few-emit variant
        rows, tokens = self.row_buckets, self.token_buckets
        for d in self.mixed_decode_buckets:
            for i, r in enumerate(rows):
                fewest = rows[i - 1] + 1 if i else 1  # the fewest prefill rows (and tokens) r holds
                smallest = _first_at_least(tokens, fewest)
                out.extend(self._variant(d, t, r) for t in tokens if t >= smallest and self._mixed_decode(d, t, r))
        if self.max_draft:  # speculative decoding: each variant with prefill rows has a verify form
            out.extend(self.with_verify(v) for v in list(out) if v.prefill_rows)
        return out

    def with_verify(self, variant: Variant) -> Variant:
        """``variant``'s verify form: a verify point per drafted token its prefill rows can hold."""
        if not self.max_draft or not variant.prefill_rows:
            raise ValueError(f"variant {variant} has no verify form (max_draft={self.max_draft})")
        return dataclasses.replace(variant, num_verify=variant.prefill_rows * self.max_draft)

    def select(
        self,
        num_tokens: int,
        num_rows: int,
        all_decode: bool = False,
        *,
        num_decode: int | None = None,
        num_emits: int | None = None,
        decode_span: int = 0,
        num_riders: int = 0,
        verify: bool = False,
    ) -> Variant:
        """The smallest variant holding a round of ``num_tokens`` tokens in ``num_rows`` rows, of
        which the first ``num_decode`` are one-token rows (``all_decode``: every row is; without
        either, the round is treated as prefill only) and which writes ``num_emits`` checkpoints
        (None: as many as any round of that shape can). ``decode_span``: the decode region must
        hold this many rows (the window of slots the decode rows span, ``runner/window.py``).
        ``num_riders``: rows of no tokens among the others (riders, ``scheduler/riders.py``).
        ``verify``: some row carries drafted tokens (speculative decoding): the verify form."""
        if num_rows > self.max_num_seqs or num_tokens > self.max_num_batched_tokens:
            raise ValueError(f"round of {num_tokens} tokens / {num_rows} rows exceeds the budgets")
        d = num_rows if all_decode and num_decode is None else (num_decode or 0)
        if not 0 <= d <= num_rows - num_riders or num_tokens - d < num_rows - d - num_riders:
            raise ValueError(f"{d} decode rows do not fit a round of {num_tokens} tokens / {num_rows} rows")
        if decode_span > self.max_num_seqs or (d and decode_span and decode_span < d):
            raise ValueError(
                f"a decode window of {decode_span} slots cannot hold {d} decode rows (max {self.max_num_seqs})"
            )
        p, tp, region = num_rows - d, num_tokens - d, max(d, decode_span)
        if p and self.packed:  # the one-token rows join the prefill region
            p, tp, region = num_rows, num_tokens, 0
        if p == 0 and self.mode != "fixed":
            return self._variant(_first_at_least(self.decode_buckets, region), 0, 0, num_emits)
        i = self.row_buckets.index(rows := _first_at_least(self.row_buckets, p))
        fewest = self.row_buckets[i - 1] + 1 if i else 1  # as variants(): a row bucket's smallest token bucket
        tokens = _first_at_least(self.token_buckets, max(tp, fewest))  # riders bring rows without tokens
        decode = next(d for d in self.mixed_decode_buckets if d >= region and self._mixed_decode(d, tokens, rows))
        variant = self._variant(decode, tokens, rows)
        return self.with_verify(variant) if verify else variant
