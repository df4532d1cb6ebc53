"""Incremental detokenisation: the text of a growing token list without decoding all of it per token.

Each update decodes only the tokens after ``prefix`` (a few tokens of context before the new
ones, so merges and leading spaces come out as in a full decode) and appends what the new tokens
add. Tokens that end inside a multi-byte character (the decode ends in U+FFFD) wait for the next
token. ``finish()`` decodes the whole list once, so the final text always equals a full decode.
"""

from __future__ import annotations

from typing import Protocol, Sequence

_CONTEXT = 4  # tokens decoded in front of the new ones


class _Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalText:
    def __init__(self, tokenizer: _Decoder):
        self.tokenizer = tokenizer
        self.text = ""
        self._read = 0  # tokens whose text is in ``self.text``

    def update(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (which extends the list of the previous call)."""
        if len(ids) <= self._read:
            return self.text
        start = max(0, self._read - _CONTEXT)
        before = self.tokenizer.decode(ids[start : self._read])
        full = self.tokenizer.decode(ids[start:])
        if not full.endswith("\ufffd") and full.startswith(before):
            self.text += full[len(before) :]
            self._read = len(ids)
        return self.text

    def finish(self, ids: Sequence[int]) -> str:
        self.text = self.tokenizer.decode(ids)
        self._read = len(ids)
        return self.text
