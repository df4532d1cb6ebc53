"""An *oracle* drafter for speculative decoding where no n-gram lookup would guess (random-weight
models, the shadow model's hashed tokens): it proposes a request's true continuation, known from a
run without drafts, with one token altered in rows whose length is a multiple of ``every`` (at a
position that moves with the length), so drafts are accepted whole, in part and not at all on a
fixed pattern. It has ``scheduler/drafts.ngram_draft``'s signature, so tests and
``tools/perf/spec_oracle.py`` put it in place of the lookup (``scheduler/running.ngram_draft``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def oracle_drafter(full: Sequence[tuple[int, ...]], vocab: int, every: int = 3) -> Callable[..., tuple[int, ...]]:
    """A drafter over the finished sequences ``full`` (prompt and output each); a request none of
    them starts with gets no draft. ``every`` 0: drafts are never altered."""

    def draft(tokens: Sequence[int], k: int, *, max_n: int, min_n: int) -> tuple[int, ...]:  # noqa: ARG001
        tokens = tuple(tokens)
        seq = next((f for f in full if f[: len(tokens)] == tokens), None)
        if seq is None:
            return ()
        true = list(seq[len(tokens) : len(tokens) + k])
        if true and every and len(tokens) % every == 0:
            at = (len(tokens) // every) % len(true)
            true[at] = (true[at] + 1) % vocab
        return tuple(true)

    return draft
