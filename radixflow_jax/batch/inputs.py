"""Batch input: one JSON request per line, read through ``grain`` from an index of line offsets.

Two line formats (chosen per line):

* OpenAI batch: ``{"custom_id", "method": "POST", "url", "body"}`` with url ``/v1/completions`` or
  ``/v1/chat/completions``; the body is validated and translated by the server's own code
  (:mod:`radixflow_jax.serve.protocol`), so a body is accepted here iff the server accepts it.
* plain: ``{"id", "prompt" | "prompt_token_ids" | "messages", "max_tokens"?, sampling fields?}``
  (greedy unless ``temperature`` is given; unknown fields are refused by ``SamplingParams``).

Invariants: whitespace-only lines are not requests (they never get an output line); every other
line becomes exactly one :class:`BatchItem`, with either a request or an ``error`` naming the line.
Parsing never raises (``Exception``) for any input: JSON the decoder refuses (a 4,300-digit integer,
nesting past the recursion limit), a template or tokenizer that fails, any other exception becomes
that line's error, so one bad line cannot stop the job on every resume. A line's key (what its
output record answers) is :func:`line_key` of its bytes, the same whether the line is valid or not.
A request without a ``seed`` gets one derived from its line number, so a sampled request draws the
same tokens in a resumed run as in an uninterrupted one.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import json
from typing import Any, Callable, Iterator

from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.serve.protocol import TextTokenizer

PLAIN = "plain"
OPENAI = "openai"
URLS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
_PLAIN_PROMPTS = ("prompt", "prompt_token_ids", "messages")
_MAX_MESSAGE = 500  # characters of an unexpected exception's text kept in a line's error record


@dataclasses.dataclass(frozen=True)
class LineError:
    """Why one input line produced no request; ``code`` is short and machine-readable."""

    line: int
    message: str
    code: str = "invalid_request"


@dataclasses.dataclass(frozen=True)
class BatchItem:
    """One non-blank input line. ``index``: position among requests (= output line number, 0-based);
    ``line``: 1-based line number in the file; ``key``: the id (plain) or custom_id (OpenAI)."""

    index: int
    line: int
    fmt: str
    key: Any
    kind: str = "completions"  # or "chat" (OpenAI format: the response object type)
    prompt_ids: tuple[int, ...] = ()
    params: SamplingParams | None = None
    model: str | None = None
    error: LineError | None = None


@dataclasses.dataclass(frozen=True)
class LineLimits:
    """What the engine can run; lines beyond it become errors before reaching the engine."""

    max_model_len: int
    vocab_size: int
    seed: int = 0


class LineIndex:
    """Byte offsets of the non-blank lines of a file and the file's sha256 (one pass).

    A random-access ``grain`` data source: ``source[i]`` is ``(line number, text)`` of request ``i``."""

    def __init__(self, path: str):
        self.path = path
        self._starts = array.array("q")
        self._ends = array.array("q")
        self._lines = array.array("q")
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                pos, lineno = 0, 0
                for raw in f:
                    digest.update(raw)
                    lineno += 1
                    if raw.strip():
                        self._starts.append(pos)
                        self._ends.append(pos + len(raw))
                        self._lines.append(lineno)
                    pos += len(raw)
        except OSError as exc:
            raise FileNotFoundError(f"{path}: cannot read the input ({exc.strerror})") from None
        self.sha256 = digest.hexdigest()

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, i: int) -> tuple[int, int, bytes]:
        with open(self.path, "rb") as f:
            f.seek(self._starts[i])
            return i, self._lines[i], f.read(self._ends[i] - self._starts[i])

    def keys(self, start: int, end: int) -> Iterator[Any]:
        """:func:`line_key` of requests ``start .. end - 1`` in order (one open file, one pass)."""
        with open(self.path, "rb") as f:
            for i in range(start, min(end, len(self))):
                f.seek(self._starts[i])
                yield line_key(f.read(self._ends[i] - self._starts[i]))


def read_items(
    index: LineIndex, start: int, tokenizer: TextTokenizer | None, limits: LineLimits, threads: int = 2,
    end: int | None = None,
) -> Iterator[BatchItem]:
    """Items ``start, start + 1, ..., end - 1`` in input order, parsed ahead on ``threads`` grain threads."""
    import grain

    end = len(index) if end is None else min(end, len(index))
    if start >= end:
        return iter(())
    dataset = grain.MapDataset.source(index).slice(slice(start, end))
    dataset = dataset.map(lambda entry: parse_line(entry[0], entry[1], entry[2], tokenizer, limits))
    options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=64)
    return iter(dataset.to_iter_dataset(options))


def _is_openai(obj: dict[str, Any]) -> bool:
    return "custom_id" in obj or "body" in obj or "url" in obj


def _key_of(obj: Any) -> Any:
    """The id a decoded line's output record answers: ``custom_id`` (OpenAI format), ``id`` (plain), or None."""
    if not isinstance(obj, dict):
        return None
    return obj.get("custom_id") if _is_openai(obj) else obj.get("id")


def line_key(raw: bytes) -> Any:
    """The key :func:`parse_line` gives the item of ``raw`` (None when the line is not a JSON
    object); only decodes JSON, so a resume checks its output records against the input cheaply."""
    try:
        return _key_of(json.loads(raw))
    except Exception:  # anything the decoder refuses is not valid JSON: such a line's key is None
        return None


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "..."


def parse_line(index: int, line: int, raw: bytes, tokenizer: TextTokenizer | None, limits: LineLimits) -> BatchItem:
    """Never raises (``Exception``): whatever goes wrong, the returned item carries a :class:`LineError`."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        error = LineError(line, f"line {line}: not valid JSON ({exc.msg})", "invalid_json")
        return BatchItem(index=index, line=line, fmt=PLAIN, key=None, error=error)
    except Exception as exc:  # UnicodeDecodeError, a ValueError for huge integers, a RecursionError for deep nesting
        error = LineError(line, f"line {line}: not valid JSON ({_short(exc)})", "invalid_json")
        return BatchItem(index=index, line=line, fmt=PLAIN, key=None, error=error)
    if not isinstance(obj, dict):
        error = LineError(line, f"line {line}: expected a JSON object")
        return BatchItem(index=index, line=line, fmt=PLAIN, key=None, error=error)
    fmt = OPENAI if _is_openai(obj) else PLAIN
    try:
        if fmt == OPENAI:
            return _parse_openai(index, line, obj, tokenizer, limits)
        return _parse_plain(index, line, obj, tokenizer, limits)
    except Exception as exc:  # a failure nothing below foresaw is still this line's alone
        return _failing(index, line, fmt, _key_of(obj))(f"cannot be read ({_short(exc)})")


def _not_in_batch(params: SamplingParams) -> str | None:
    """Why a batch job cannot run ``params`` (it writes one output record per input line), or None."""
    if params.num_samples > 1:
        return "n: several samples (n > 1, best_of) are not available in a batch job; send one line per sample"
    if params.prompt_logprobs is not None:
        return "prompt_logprobs: not available in a batch job"
    return None


def _with_seed(params: SamplingParams, line: int, limits: LineLimits) -> SamplingParams:
    if params.seed is not None:
        return params
    seed = int.from_bytes(hashlib.sha256(f"{limits.seed}:{line}".encode()).digest()[:4], "little")
    return dataclasses.replace(params, seed=seed)


def _failing(index: int, line: int, fmt: str, key: Any) -> Callable[..., BatchItem]:
    """``fail(message, code)``: the error item of line ``line`` (a bad line becomes an error record)."""

    def fail(message: str, code: str = "invalid_request") -> BatchItem:
        error = LineError(line, f"line {line}: {message}", code)
        return BatchItem(index=index, line=line, fmt=fmt, key=key, error=error)

    return fail


def _parse_openai(
    index: int, line: int, obj: dict[str, Any], tok: TextTokenizer | None, limits: LineLimits
) -> BatchItem:
    from radixflow_jax.serve import protocol

    key = _key_of(obj)
    fail = _failing(index, line, OPENAI, key)

    if not isinstance(key, str) or not key:
        return fail("custom_id must be a non-empty string")
    if obj.get("method", "POST") != "POST":
        return fail(f"method {obj.get('method')!r} is not supported (only POST)")
    url = obj.get("url")
    if url not in URLS:
        return fail(f"unknown url {url!r} (supported: {', '.join(URLS)})", "invalid_url")
    kind = URLS[url]
    try:
        body = protocol.parse_body(kind, obj.get("body"))
        if body.stream:
            raise protocol.ProtocolError("stream: streaming is not available in a batch job", param="stream")
        req = protocol.to_engine_request(body, tok, max_model_len=limits.max_model_len, vocab_size=limits.vocab_size)
        refused = _not_in_batch(req.params) or ("echo: not available in a batch job" if req.echo else None)
        refused = refused or ("tools: not available in a batch job" if getattr(body, "tools", None) else None)
        if refused:
            raise protocol.ProtocolError(refused, param=refused.split(":")[0])
    except protocol.ProtocolError as exc:
        return fail(f"body: {exc.message}", exc.code or "invalid_request")
    params = _with_seed(req.params, line, limits)
    return BatchItem(
        index=index, line=line, fmt=OPENAI, key=key, kind=kind, prompt_ids=tuple(req.prompt_ids), params=params,
        model=req.model,
    )


def _parse_plain(
    index: int, line: int, obj: dict[str, Any], tok: TextTokenizer | None, limits: LineLimits
) -> BatchItem:
    key = _key_of(obj)
    fail = _failing(index, line, PLAIN, key)

    if isinstance(key, bool) or not isinstance(key, (str, int)) or key == "":
        return fail("'id' (a string or an integer) is required")
    given = [k for k in _PLAIN_PROMPTS if k in obj]
    if len(given) != 1:
        return fail(f"exactly one of {', '.join(_PLAIN_PROMPTS)} is required, got {given or 'none'}", "missing_prompt")
    try:
        ids = _plain_prompt(given[0], obj[given[0]], tok)
    except ValueError as exc:
        return fail(f"{given[0]}: {exc}")
    sampling = {k: v for k, v in obj.items() if k not in ("id", *_PLAIN_PROMPTS)}
    if isinstance(sampling.get("stop_token_ids"), list):
        sampling["stop_token_ids"] = tuple(sampling["stop_token_ids"])
    try:
        params = SamplingParams.from_dict(sampling)
    except (ValueError, TypeError) as exc:
        return fail(str(exc), "invalid_parameter")
    refused = _not_in_batch(params)
    if refused:
        return fail(refused, "invalid_parameter")
    bad = next((t for t in ids if not 0 <= t < limits.vocab_size), None)
    if bad is not None:
        return fail(f"token id {bad} is outside the vocabulary [0, {limits.vocab_size})")
    if len(ids) + params.max_tokens > limits.max_model_len:
        return fail(
            f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
            f"max_model_len={limits.max_model_len}",
            "context_length_exceeded",
        )
    return BatchItem(
        index=index, line=line, fmt=PLAIN, key=key, kind="completions", prompt_ids=tuple(ids),
        params=_with_seed(params, line, limits),
    )


def _plain_prompt(field: str, value: Any, tok: TextTokenizer | None) -> list[int]:
    if field == "prompt_token_ids":
        ints = isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
        if not ints or not value:
            raise ValueError("must be a non-empty list of integers")
        return list(value)
    if tok is None:
        raise ValueError("this model has no tokenizer: send prompt_token_ids")
    if field == "prompt":
        if not isinstance(value, str) or not value:
            raise ValueError("must be a non-empty string")
        ids = tok.encode(value)
    else:
        ok = isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
        )
        if not ok:
            raise ValueError("must be a non-empty list of {'role': str, 'content': str}")
        ids = tok.encode(tok.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in value]))
    if not ids:
        raise ValueError("encodes to no tokens")
    return ids
