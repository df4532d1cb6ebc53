"""Speculative decoding, the host side: drafts, their verification, and what a verify row commits.

A *verify row* (``RowPlan.num_draft``) feeds a request's known span followed by ``k`` drafted
tokens and gets back, from one step, the model's token after its last known token and after each
drafted token (``StepResult.verified`` and ``sampled``). The longest prefix of the draft that
matches those tokens is accepted, and one more token appended, the model's own (the correction at
the first mismatch, or the bonus token after a fully accepted draft). Greedy, every accepted token
is exactly the token plain decoding would have produced; sampled, the step draws each verify
token with the key a run without drafts uses at that position (``runner/step._verify``), so a
drafted token is kept with probability ``p(draft)``, which is speculative sampling's rule for a
draft proposed with certainty, and the committed tokens are those of a run without drafts.

State (``docs/design.md``, "Speculative decoding"): a verify row of a hybrid model feeds one
known token and its draft; it reads the request's state from its slot and the step leaves the
state after its last *accepted* token in the request's spare slot (``runner/rollback.py``: a
recurrent state cannot be un-appended, so the step keeps it per drafted position). The slots then
swap, and the next row feeds only the token the verify row sampled. Where a stop token or
``max_tokens`` cut accepted tokens, the request finishes with its state from before the row. KV
of rejected positions is never read (attention reads ``kv_lens`` positions) and is overwritten
by the next row. Attention-only models keep the KV
of the accepted tokens and need no spare slot. Verify rows emit no checkpoint, so the cache holds
no state of a drafted token.

Drafts here are n-gram lookups in the request's own tokens (prompt lookup decoding): the longest
suffix of ``max_n`` down to ``min_n`` tokens that occurred before, and the tokens that followed its
most recent earlier occurrence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

METHODS = ("ngram", "draft", "mtp")
# a model drafter (engine/drafter.py): up to k tokens guessed after the tokens given
Drafter = Callable[[Sequence[int], int], tuple[int, ...]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeculativeConfig:
    """``method``: where drafts come from (``ngram``: the request's own prompt and output;
    ``draft``: a separate model, ``draft_model``, a path or preset sharing the target's tokenizer,
    run greedily by ``engine/drafter.py``; ``mtp``: the model's own MTP layer, one token a round,
    ``runner/mtpstep.py`` and :class:`MtpDrafts`);
    ``num_draft``: the most drafted tokens of one verify row (a request's draft length adapts
    below it, :func:`next_draft_len`; None: 4, and 1 for ``mtp``, the only length it drafts);
    ``ngram_max`` / ``ngram_min``: the suffix lengths looked up,
    longest first. Defaults are our choice, not tuned: 4 drafted tokens (vLLM's and SGLang's
    n-gram examples use 3-5), suffixes of 4 down to 2 tokens (a one-token suffix matches too often
    to be worth a verify position)."""

    method: str = "ngram"
    num_draft: int | None = None
    ngram_max: int = 4
    ngram_min: int = 2
    draft_model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method {self.method!r}: expected one of {', '.join(METHODS)}")
        if (self.method == "draft") != (self.draft_model is not None):
            raise ValueError("speculative draft_model: needed by method 'draft', and only by it")
        if self.num_draft is None:
            object.__setattr__(self, "num_draft", 1 if self.method == "mtp" else 4)
        assert self.num_draft is not None
        if self.num_draft < 1:
            raise ValueError(f"speculative num_draft={self.num_draft} must be >= 1")
        if self.method == "mtp" and self.num_draft != 1:
            raise ValueError(f"speculative num_draft={self.num_draft}: method 'mtp' drafts one token a round")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"speculative ngram_min={self.ngram_min}, ngram_max={self.ngram_max}: need 1 <= min <= max")


def ngram_draft(tokens: Sequence[int], k: int, *, max_n: int, min_n: int) -> tuple[int, ...]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest suffix of
    ``tokens`` (``max_n`` down to ``min_n`` tokens long) found in them that ``k`` known tokens
    follow, else its most recent occurrence (fewer tokens follow: in a run of one repeated token
    the most recent occurrence has one); empty when none occurs."""
    if k < 1 or len(tokens) <= min_n:
        return ()
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, len(arr) - 1), min_n - 1, -1):
        # windows starting before the suffix itself, each followed by at least one token
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
        hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
        if hits.size:
            full = hits[hits + n + k <= len(arr)]
            at = int(full[-1] if full.size else hits[-1]) + n
            return tuple(int(t) for t in arr[at : at + k])
    return ()


def accepted_length(draft: Sequence[int], verified: Sequence[int]) -> int:
    """The greedy rule: how many leading drafted tokens equal the model's greedy token at their
    position (``verified[i]`` follows the last known token and ``draft[:i]``)."""
    a = 0
    while a < len(draft) and draft[a] == verified[a]:
        a += 1
    return a


def verified_tokens(draft: Sequence[int], verified: Sequence[int], bonus: int) -> tuple[int, ...]:
    """The tokens a verify row appends: the accepted drafted tokens and the model's next token
    after them (``bonus``, the row's sample, when the whole draft was accepted)."""
    a = accepted_length(draft, verified)
    return tuple(draft[:a]) + ((verified[a],) if a < len(draft) else (bonus,))


def next_draft_len(drafted: int, accepted: int, limit: int) -> int:
    """A request's next draft length: up to ``limit`` after a fully accepted draft, else one more
    than it accepted (a rejected position costs a verify slot each round it is drafted)."""
    return limit if accepted >= drafted else max(1, min(limit, accepted + 1))


def position_counts(
    drafts: Sequence[tuple[Sequence[int], Sequence[int]]],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per drafted position (index 0: the first drafted token), over ``(draft, verified)`` pairs of
    verify rows: ``(rows that drafted a token there, rows whose draft was accepted through it)``;
    position ``j``'s acceptance rate is the second over the first."""
    longest = max((len(d) for d, _ in drafts), default=0)
    drafted, accepted = [0] * longest, [0] * longest
    for draft, verified in drafts:
        for j in range(len(draft)):
            drafted[j] += 1
        for j in range(accepted_length(draft, verified)):
            accepted[j] += 1
    return tuple(drafted), tuple(accepted)


def kept_tokens(new: Sequence[int], room: int, stop_token_ids: Collection[int]) -> tuple[int, ...]:
    """What a verify row commits of ``new`` (:func:`verified_tokens`): at most ``room`` tokens (what
    ``max_tokens`` leaves), through the first stop token."""
    kept: list[int] = []
    for token in new[: max(room, 0)]:
        kept.append(token)
        if token in stop_token_ids:
            break
    return tuple(kept)


class MtpDrafts:
    """The MTP drafts of the last round (speculative method ``mtp``): each sampling row's guess at
    the token after the tokens the round committed for it (``StepResult.drafts``), kept by the
    request's tokens (their count and last ``KEY`` ids), and handed out as a :data:`Drafter`. A
    draft is offered for the tokens it follows and asked for with the same tokens; one that was not
    offered for them is no draft (a stale guess is never verified)."""

    KEY = 16

    def __init__(self, keep: int = 1024) -> None:
        self.keep = keep  # the most drafts held (the oldest go first): requests not in a round keep theirs
        self._drafts: dict[tuple[int, tuple[int, ...]], int] = {}

    def _key(self, tokens: Sequence[int]) -> tuple[int, tuple[int, ...]]:
        return len(tokens), tuple(tokens[-self.KEY :])

    def offer(self, rounds: Sequence[tuple[int, Sequence[int], int]]) -> None:
        """A round's drafts, ``(the request's token count after the round, its last tokens (at
        least ``KEY`` where it has them), draft)``."""
        for count, tail, draft in rounds:
            key = (count, tuple(tail[-self.KEY :]))
            self._drafts.pop(key, None)
            self._drafts[key] = draft
        while len(self._drafts) > self.keep:
            del self._drafts[next(iter(self._drafts))]

    def __call__(self, tokens: Sequence[int], k: int) -> tuple[int, ...]:
        draft = self._drafts.get(self._key(tokens))
        return (draft,) if draft is not None and k >= 1 else ()


def offer_drafts(drafter: Drafter | None, requests: Mapping[int, Any], drafts: Mapping[int, int], rows: Any) -> None:
    """Hands a committed round's MTP drafts (``StepResult.drafts``: request id -> guess) to an
    :class:`MtpDrafts` drafter, each under its request's tokens after the commit. Only rows the
    commit applied count: a request that finished (gone from ``requests``) or was preempted or
    rolled back since the row was planned (a newer epoch) has no draft from it."""
    if not drafts or not isinstance(drafter, MtpDrafts):
        return
    applied = {r.request_id for r in rows if r.request_id in requests and requests[r.request_id].epoch == r.epoch}
    entries = []
    for rid, draft in drafts.items():
        if rid in applied:
            n = requests[rid].num_tokens
            entries.append((n, requests[rid].token_span(max(0, n - MtpDrafts.KEY), n), draft))
    drafter.offer(entries)
