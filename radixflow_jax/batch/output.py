"""Batch output: records in input order, an append-only JSONL file, and an atomically written state file.

Invariants (what makes ``--resume`` exact after a kill or a power loss at any moment):
  * Output line ``k`` answers request ``k`` (the ``k``-th non-blank input line); lines are appended
    with raw ``os.write`` calls (no user-space buffer), so after a kill the file is a byte prefix of
    the uninterrupted output: complete lines, then at most one torn line without its newline.
  * The output is fsynced before every state write (``StateKeeper.flush`` syncs its writer first),
    so a state file never counts a record the disk may lose. A power loss can still drop, tear or
    zero-fill the unsynced tail written after the last state write, and a file system may lose
    more than it promised.
  * :func:`recover_output` keeps the longest prefix of complete records (lines that decode to a
    JSON object) and truncates the rest; with the expected keys, every kept record must answer its
    input line (a record answering another id refuses the resume: another job's output). Its count
    is the resume position, also when it is below the state's count (the lost records are computed
    again and the state is rewound to it).
  * The state file (input sha256, model fingerprint, requests written) is replaced atomically
    (temporary file, fsync, ``os.replace``, directory fsync): a reader sees the old or the new
    version, never a mix. It is written before the first record and after appends (at most once a
    second).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Iterator, Sequence

from radixflow_jax.batch.inputs import OPENAI, BatchItem, LineError
from radixflow_jax.engine.params import RequestOutput

STATE_SUFFIX = ".state.json"
STATE_VERSION = 1
_NO_KEY = object()  # recover_output: the input has no request left for a record
CrashHook = Callable[[str, int], None]  # (point, last output line (0-based) of the append, or requests done)


class ResumeError(ValueError):
    """The job cannot be (re)started as asked; the message says why and what to do."""


def state_path(output: str) -> str:
    return output + STATE_SUFFIX


@dataclasses.dataclass(frozen=True)
class JobState:
    input: str
    input_sha256: str
    model: str
    total: int
    done: int
    complete: bool = False
    version: int = STATE_VERSION
    first: int = 0  # a process's share (batch/parts.py): requests first .. first + total - 1


def write_state(path: str, state: JobState) -> None:
    """Atomic replace: write a temporary file in the same directory, fsync it, rename over ``path``."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(dataclasses.asdict(state), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_state(path: str) -> JobState:
    try:
        with open(path) as f:
            raw = json.load(f)
        state = JobState(**raw)
    except FileNotFoundError:
        raise ResumeError(f"cannot resume: no state file {path} (start the job without --resume)") from None
    except (json.JSONDecodeError, TypeError) as exc:
        raise ResumeError(f"cannot resume: the state file {path} is unreadable ({exc})") from None
    if state.version != STATE_VERSION:
        raise ResumeError(f"cannot resume: state file version {state.version}, this radixflow writes {STATE_VERSION}")
    return state


def _complete_record(raw: bytes) -> dict[str, Any] | None:
    """The record of one output line, or None when it is torn (no newline) or not a JSON object."""
    if not raw.endswith(b"\n"):
        return None
    try:
        record = json.loads(raw)
    except Exception:  # torn, zero-filled or otherwise garbled bytes of a lost tail
        return None
    return record if isinstance(record, dict) else None


def recover_output(path: str, expected_keys: Iterator[Any] | None = None) -> int:
    """Truncates the output to its longest prefix of complete records and returns their number.

    ``expected_keys`` (the keys of the input lines the records answer, in order): a complete record
    whose key differs, or one more record than keys, raises :class:`ResumeError`."""
    if not os.path.exists(path):
        return 0
    kept, count = 0, 0
    with open(path, "rb") as f:
        for raw in f:
            record = _complete_record(raw)
            if record is None:
                break
            if expected_keys is not None:
                want = next(expected_keys, _NO_KEY)
                if want is _NO_KEY:
                    raise ResumeError(f"cannot resume: {path} has more records than the job has requests")
                if record_key(record) != want:
                    raise ResumeError(
                        f"resume refused: output record {count + 1} of {path} answers id {record_key(record)!r}, "
                        f"its input request has id {want!r}"
                    )
            kept += len(raw)
            count += 1
    if kept < os.path.getsize(path):
        os.truncate(path, kept)
    return count


def record_key(record: dict[str, Any]) -> Any:
    """The input id a record answers (``custom_id`` for the OpenAI format)."""
    return record["custom_id"] if "custom_id" in record else record.get("id")


class OutputWriter:
    """Appends whole records; ``crash_hook`` (tests) is called at the points a kill can land."""

    def __init__(self, path: str, crash_hook: CrashHook | None = None):
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._hook = crash_hook
        self.lines = 0

    def append(self, records: Sequence[dict[str, Any]], first_line: int) -> None:
        data = b"".join(_encode(r) for r in records)
        if self._hook is not None:
            last = first_line + len(records) - 1
            self._hook("before_write", last)
            half = len(data) // 2
            self._write(data[:half])
            self._hook("mid_write", last)
            self._write(data[half:])
            self._hook("after_write", last)
        else:
            self._write(data)
        self.lines += len(records)

    def _write(self, data: bytes) -> None:
        assert self._fd is not None, "append after close"
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def sync(self) -> None:
        """Makes every appended record durable (before a state write counts it); no-op once closed."""
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _encode(record: dict[str, Any]) -> bytes:
    """One output line; a record holding text UTF-8 cannot carry (a lone surrogate from an input
    id) keeps ASCII escapes instead, so writing a record never fails."""
    try:
        return json.dumps(record, ensure_ascii=False).encode() + b"\n"
    except UnicodeEncodeError:
        return json.dumps(record).encode() + b"\n"


class StateKeeper:
    """Rewrites the state file after appends, at most every ``interval_s`` (and always on ``flush``),
    each time after syncing ``output`` (the writer whose records the state counts)."""

    def __init__(
        self,
        path: str,
        state: JobState,
        output: OutputWriter,
        interval_s: float = 1.0,
        crash_hook: CrashHook | None = None,
    ):
        self.path = path
        self.state = state
        self._output = output
        self._interval = interval_s
        self._last = 0.0
        self._hook = crash_hook
        self.flush()

    def update(self, done: int) -> None:
        self.state = dataclasses.replace(self.state, done=done)
        if time.monotonic() - self._last >= self._interval:
            self.flush()

    def flush(self, complete: bool = False) -> None:
        self.state = dataclasses.replace(self.state, complete=complete)
        self._output.sync()
        write_state(self.path, self.state)
        self._last = time.monotonic()
        if self._hook is not None:
            self._hook("after_state", self.state.done)


def _usage(out: RequestOutput) -> dict[str, Any]:
    return {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": len(out.token_ids),
        "total_tokens": out.prompt_tokens + len(out.token_ids),
        "prompt_tokens_details": {"cached_tokens": out.cached_tokens},
    }


def result_record(item: BatchItem, out: RequestOutput, model_name: str) -> dict[str, Any]:
    """The output line of a finished request: plain shape, or the OpenAI batch response shape. A
    request whose rounds' step kept failing (``finish_reason='error'``) becomes an error record."""
    if out.finish_reason == "error":
        return error_record(item, LineError(item.line, f"line {item.line}: {out.error}", "step_failed"))
    if item.fmt != OPENAI:
        return {
            "id": item.key,
            "text": out.text,
            "token_ids": list(out.token_ids),
            "finish_reason": out.finish_reason,
            "cached_tokens": out.cached_tokens,
            "error": None,
        }
    if item.kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": out.text},
            "logprobs": None,
            "finish_reason": out.finish_reason,
        }
        obj, prefix = "chat.completion", "chatcmpl"
    else:
        choice = {"index": 0, "text": out.text, "logprobs": None, "finish_reason": out.finish_reason}
        obj, prefix = "text_completion", "cmpl"
    body = {
        "id": f"{prefix}-{item.line}",
        "object": obj,
        "created": int(time.time()),
        "model": item.model or model_name,
        "choices": [choice],
        "usage": _usage(out),
    }
    return {
        "id": f"batch_req_{item.line}",
        "custom_id": item.key,
        "response": {"status_code": 200, "request_id": f"req_{item.line}", "body": body},
        "error": None,
    }


def error_record(item: BatchItem, error: LineError) -> dict[str, Any]:
    err = {"code": error.code, "message": error.message, "line": error.line}
    if item.fmt == OPENAI:
        return {"id": f"batch_req_{item.line}", "custom_id": item.key, "response": None, "error": err}
    return {"id": item.key, "text": None, "token_ids": [], "finish_reason": None, "cached_tokens": 0, "error": err}
