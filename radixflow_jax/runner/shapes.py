"""Fixed step shapes: token and row buckets (powers of two) and the variants compiled at start-up.

A round runs in one *variant* ``(num_tokens, num_rows, num_decode)``:
  * decode-only rounds (every row has a one-token span) use ``(n, n, n)`` for a row bucket ``n``,
    so every row takes the one-step recurrent updates;
  * every other round uses ``(T, R, 0)``: all rows go through the chunked scan.
``max_emits`` (checkpoint writes per round) is derived from the variant so the emit arrays have a
fixed shape too: each row emits at most ``span / grid + 1`` checkpoints.
"""

from __future__ import annotations

import dataclasses


def powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    """``lo, 2lo, ...`` up to and including the first value ``>= hi``."""
    out, v = [], max(1, lo)
    while True:
        out.append(v)
        if v >= hi:
            return tuple(out)
        v *= 2


@dataclasses.dataclass(frozen=True)
class Variant:
    num_tokens: int
    num_rows: int
    num_decode: int
    max_emits: int


@dataclasses.dataclass(frozen=True)
class ShapeConfig:
    """``max_tokens``/``max_rows``: the round budgets; ``min_tokens``: the smallest token bucket;
    ``max_pages_per_row``: the page-table width (the model context in pages)."""

    max_tokens: int
    max_rows: int
    max_pages_per_row: int
    grid: int
    min_tokens: int = 16

    @property
    def token_buckets(self) -> tuple[int, ...]:
        return powers_of_two(min(self.min_tokens, self.max_tokens), self.max_tokens)

    @property
    def row_buckets(self) -> tuple[int, ...]:
        return powers_of_two(1, self.max_rows)

    def _variant(self, tokens: int, rows: int, decode: int) -> Variant:
        return Variant(tokens, rows, decode, max_emits=rows + tokens // self.grid)

    def variants(self) -> list[Variant]:
        """Every variant a round can need (compiled at start-up)."""
        out = [self._variant(n, n, n) for n in self.row_buckets]
        for t in self.token_buckets:
            out.extend(self._variant(t, r, 0) for r in self.row_buckets if r <= t)
        return out

    def select(self, num_tokens: int, num_rows: int, all_decode: bool) -> Variant:
        """The smallest variant holding a round of ``num_tokens`` tokens in ``num_rows`` rows."""
        if num_rows > self.max_rows or num_tokens > self.max_tokens:
            raise ValueError(f"round of {num_tokens} tokens / {num_rows} rows exceeds the budgets")
        rows = next(r for r in self.row_buckets if r >= num_rows)
        if all_decode:
            return self._variant(rows, rows, rows)
        tokens = next(t for t in self.token_buckets if t >= max(num_tokens, rows))
        return self._variant(tokens, rows, 0)
