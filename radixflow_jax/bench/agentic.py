"""The text of the ``agentic`` workload: one long system prompt of tool descriptions that every
session shares, a task per session, and tool results, all seeded and tokenised by an encoder.

An agent loop resends its whole history every turn: the shared system prompt (a tool schema of a
thousand tokens or more), the user's task, then per turn the model's tool call (its real answer,
appended by the driver) and the tool's result. This module writes the texts (synthetic, shaped as
JSON tool schemas and tool results are) and cuts their token ids to the asked lengths.

Invariants:
  * Same seed, same encoder: same ids (no global random state; :class:`WordIds` hashes words with
    CRC-32, which does not change between processes).
  * ``text_ids(...)`` returns exactly ``n`` ids, all from the encoder (cut at a token boundary).
  * With no tokenizer (the simulated executor, or a run given only a vocabulary size) the encoder is
    :class:`WordIds`, one id per word or punctuation mark; callers say which encoder they used.
"""

from __future__ import annotations

import dataclasses
import json
import re
import zlib
from typing import Callable

import numpy as np

Encode = Callable[[str], list[int]]

_VERBS = ("search", "read", "write", "list", "get", "create", "update", "delete", "run", "fetch", "summarize",
          "translate", "schedule", "query", "compare", "convert")  # fmt: skip
_NOUNS = ("file", "issue", "calendar_event", "weather", "ticket", "invoice", "repository", "test_suite", "email",
          "database_row", "web_page", "contact", "order", "flight", "document", "metric")  # fmt: skip
_WORDS = ("the", "a", "of", "to", "for", "with", "when", "each", "returns", "given", "user", "request", "value",
          "results", "matching", "optional", "required", "maximum", "number", "string", "list", "field", "date",
          "range", "page", "status", "error", "only", "all", "first", "last", "name", "path", "id", "query",
          "timeout", "seconds", "format", "json", "text", "limit", "offset", "sorted", "by", "newest", "oldest",
          "account", "project", "owner", "created", "updated", "filter", "include", "exclude", "tag", "label")  # fmt: skip
_TYPES = ("string", "integer", "boolean", "number", "array")


@dataclasses.dataclass(frozen=True)
class WordIds:
    """A stand-in tokenizer for runs without one: each word or punctuation mark of the text is one
    id in ``[3, vocab)``, the word's CRC-32 modulo the range (ids 0-2 stay free for special tokens)."""

    vocab: int

    def __post_init__(self) -> None:
        if self.vocab < 4:
            raise ValueError(f"WordIds needs vocab >= 4, got {self.vocab}")

    def __call__(self, text: str) -> list[int]:
        return [3 + zlib.crc32(w.encode()) % (self.vocab - 3) for w in re.findall(r"\w+|[^\w\s]", text)]


def _sentence(rng: np.random.Generator, words: int) -> str:
    return " ".join(_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), words)).capitalize() + "."


def _tool(rng: np.random.Generator, index: int) -> dict[str, object]:
    verb, noun = _VERBS[index % len(_VERBS)], _NOUNS[(index * 7 + index // len(_VERBS)) % len(_NOUNS)]
    params = {}
    for k in range(int(rng.integers(2, 6))):
        name = f"{_WORDS[int(rng.integers(0, len(_WORDS)))]}_{k}"
        params[name] = {"type": _TYPES[int(rng.integers(0, len(_TYPES)))],
                        "description": _sentence(rng, int(rng.integers(4, 10)))}  # fmt: skip
    required = sorted(params)[: int(rng.integers(1, len(params) + 1))]
    return {
        "name": f"{verb}_{noun}",
        "description": _sentence(rng, int(rng.integers(8, 20))),
        "parameters": {"type": "object", "properties": params, "required": required},
    }


def text_ids(encode: Encode, make_text: Callable[[], str], n: int, limit: int = 64) -> tuple[int, ...]:
    """Exactly ``n`` ids: ``make_text()`` pieces joined until they encode to ``n`` or more, then cut."""
    if n < 1:
        raise ValueError(f"a text needs at least one token, got n={n}")
    text = ""
    for _ in range(limit):
        text += make_text()
        ids = encode(text)
        if len(ids) >= n:
            return tuple(int(t) for t in ids[:n])
        text += "\n"
    raise ValueError(f"{limit} pieces of text encode to fewer than {n} tokens")


def system_prompt(rng: np.random.Generator, encode: Encode, n: int) -> tuple[int, ...]:
    """The shared system prompt: an instruction, then tool schemas as JSON, cut to ``n`` tokens."""
    tools = iter(range(10_000))

    def piece() -> str:
        i = next(tools)
        head = "You are an agent. Call one tool per turn as JSON. Tools:\n" if i == 0 else ""
        return head + json.dumps(_tool(rng, i))

    return text_ids(encode, piece, n)


def task(rng: np.random.Generator, encode: Encode, n: int, session: int) -> tuple[int, ...]:
    """A session's user task (``n`` tokens)."""
    return text_ids(encode, lambda: f"\nUser (session {session}): " + _sentence(rng, 3 * n), n)


def tool_result(rng: np.random.Generator, encode: Encode, n: int, turn: int) -> tuple[int, ...]:
    """A tool's result as the agent loop appends it after the model's call (``n`` tokens)."""

    def piece() -> str:
        rows = [{"id": int(rng.integers(1, 10**6)), "name": _sentence(rng, 3), "status": _WORDS[int(rng.integers(0, 20))]}
                for _ in range(4)]  # fmt: skip
        return f"\n<tool_result turn={turn}>" + json.dumps({"ok": True, "rows": rows})

    return text_ids(encode, piece, n)
