"""``radixflow batch``: run a JSONL file of requests through the engine, resumable after a kill.

The job drives the engine's own request path (:class:`EngineCore`: ``check``, ``add``,
``step``), the same one ``LLM`` and the server use. Input is read through grain in blocks of
``window`` requests; each block is submitted sorted by prompt tokens (``group``), so requests that
share a prefix run back to back and hit the radix cache, while at most two blocks are in flight and
the output is still written strictly in input order (a reorder buffer of at most two blocks).

Invariants: output line ``k`` answers request ``k``; the output is always a completed prefix of the
work; each id is written once (a duplicate id within the job is an error record). Every exception
of one line (parsing, the engine's check, queueing) becomes that line's error record. ``--resume``
continues from the number of complete output records that answer their input lines, after
dropping a torn or lost tail (``recover_output``), and only when the state file's input sha256 and
model fingerprint equal the current ones; an output shorter than its state says (a power loss took
its unsynced tail) rewinds the state and computes the lost records again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from typing import Any, Iterator

from radixflow_jax.batch.inputs import BatchItem, LineError, LineIndex, LineLimits, read_items
from radixflow_jax.batch.output import (
    CrashHook,
    JobState,
    OutputWriter,
    ResumeError,
    StateKeeper,
    error_record,
    read_state,
    record_key,
    recover_output,
    result_record,
    state_path,
)
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.engine.intake import CheckedRequest
from radixflow_jax.models.api import LoadedModel


class JobStopped(RuntimeError):
    """``--on-error fail`` met a bad line: everything before it was written, nothing after it."""


@dataclasses.dataclass(frozen=True)
class JobConfig:
    input: str
    output: str
    resume: bool = False
    on_error: str = "skip"  # or "fail"
    window: int = 256
    group: bool = True
    model_name: str = "radixflow"
    progress: bool = True
    first: int = 0  # this job answers requests [first, end) of the input (a process's share)
    end: int | None = None  # None: to the end of the input
    state_interval_s: float = 1.0  # the state file is rewritten at most this often during a run

    def __post_init__(self) -> None:
        if self.first < 0 or (self.end is not None and self.end < self.first):
            raise ValueError(f"bad request range [{self.first}, {self.end})")
        if self.on_error not in ("skip", "fail"):
            raise ValueError(f"--on-error must be skip or fail, got {self.on_error!r}")
        if self.window < 1:
            raise ValueError(f"--window must be >= 1, got {self.window}")


@dataclasses.dataclass
class JobStats:
    """Counters of this run (a resumed run counts only what it did itself)."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    started: int = 0
    elapsed_s: float = 0.0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def model_fingerprint(model: LoadedModel) -> str:
    """sha256 over the model's source path, parsed config, dtype and weight files (names, sizes)."""
    path = os.path.abspath(model.model_dir)
    files = [path] if os.path.isfile(path) else sorted(os.path.join(path, n) for n in os.listdir(path))
    weights = [(os.path.basename(f), os.path.getsize(f)) for f in files if os.path.isfile(f)]
    blob = json.dumps([path, repr(model.config), str(model.dtype), weights])
    return hashlib.sha256(blob.encode()).hexdigest()


def check_start(cfg: JobConfig, *, announce: bool = True) -> JobState | None:
    """The checks that need no model: a fresh start finds no output; a resume finds a state file,
    unless the job wrote nothing yet (no state file and no output, or an empty one: killed before
    its first record), which starts from the beginning and says so on stderr (``announce``). An
    output with records but no state file is refused: which input line its records answer cannot
    be told."""
    spath = state_path(cfg.output)
    wrote = os.path.exists(cfg.output) and os.path.getsize(cfg.output) > 0
    if not cfg.resume:
        if wrote or os.path.exists(spath):
            raise ResumeError(f"{cfg.output} (or its state file) exists: pass --resume to continue it, or remove both")
        return None
    if not wrote and not os.path.exists(spath):
        if announce:
            print(
                f"radixflow batch: --resume: {cfg.output} has no records and no state file yet; starting from the "
                "beginning",
                file=sys.stderr,
            )
        return None
    return read_state(spath)


def _prepare(cfg: JobConfig, index: LineIndex, fingerprint: str) -> int:
    """Checks a fresh start or a resume; returns the first request index to run (output line ``k``
    answers request ``cfg.first + k``)."""
    state = check_start(cfg)
    first, end = cfg.first, len(index) if cfg.end is None else min(cfg.end, len(index))
    if state is None:
        return first
    if state.input_sha256 != index.sha256:
        raise ResumeError(
            f"resume refused: {cfg.input} is not the input this job started with (sha256 {index.sha256[:12]} != "
            f"{state.input_sha256[:12]} recorded for {state.input})"
        )
    if state.model != fingerprint:
        raise ResumeError("resume refused: the model (path, config, dtype or weights) differs from the job's model")
    if (state.first, state.total) != (first, end - first):
        raise ResumeError(
            f"resume refused: {cfg.output} answers requests [{state.first}, {state.first + state.total}), "
            f"this run was given [{first}, {end})"
        )
    done = recover_output(cfg.output, index.keys(first, end))
    if done < state.done:
        print(
            f"radixflow batch: --resume: {cfg.output} holds {done} complete records, its state file counted "
            f"{state.done} (a lost or damaged tail); computing the rest again",
            file=sys.stderr,
        )
    return first + done


class BatchJob:
    """One run of a job over ``engine`` (an idle :class:`EngineCore`) for ``model``."""

    def __init__(self, engine: EngineCore, model: LoadedModel, cfg: JobConfig, crash_hook: CrashHook | None = None):
        self.engine = engine
        self.model = model
        self.cfg = cfg
        self.hook = crash_hook
        self.limits = LineLimits(engine.max_model_len, model.config.vocab_size, engine.seed)
        self.stats = JobStats()
        self.first_errors: list[LineError] = []
        self._stop_error: LineError | None = None
        self._t0 = time.perf_counter()

    def run(self) -> JobStats:
        t0 = self._t0 = time.perf_counter()
        index = LineIndex(self.cfg.input)
        fingerprint = model_fingerprint(self.model)
        start = _prepare(self.cfg, index, fingerprint)
        first, end = self.cfg.first, len(index) if self.cfg.end is None else min(self.cfg.end, len(index))
        self.stats.started = start
        source = os.path.abspath(self.cfg.input)
        state = JobState(
            input=source,
            input_sha256=index.sha256,
            model=fingerprint,
            total=end - first,
            done=start - first,
            first=first,
        )
        writer = OutputWriter(self.cfg.output, crash_hook=self.hook)
        keeper = StateKeeper(
            state_path(self.cfg.output), state, writer, interval_s=self.cfg.state_interval_s, crash_hook=self.hook
        )
        seen = self._seen_keys(start - first)
        bar = self._bar(end - first, start - first)
        try:
            items = read_items(index, start, self.model.tokenizer, self.limits, end=end)
            self._loop(items, start, end, writer, keeper, seen, bar)
        finally:
            writer.close()
            if bar is not None:
                bar.close()
        keeper.flush(complete=True)
        self.stats.elapsed_s = time.perf_counter() - t0
        return self.stats

    # ------------------------------------------------------------------------------------- loop
    def _loop(
        self,
        items: Iterator[BatchItem],
        start: int,
        total: int,
        writer: OutputWriter,
        keeper: StateKeeper,
        seen: set[Any],
        bar: Any,
    ) -> None:
        records: dict[int, dict[str, Any]] = {}  # finished, waiting for their turn to be written
        running: dict[int, BatchItem] = {}  # engine request id -> item
        next_write, read, stop_at = start, start, None
        while next_write < (total if stop_at is None else stop_at):
            if stop_at is None and read < total and len(running) <= self.cfg.window // 2:
                block = [item for _, item in zip(range(self.cfg.window), items)]
                read += len(block)
                stop_at = self._submit(block, records, running, seen)
            if running:
                self.engine.step()
                for rid, item in list(running.items()):
                    out = self.engine.output(rid)
                    if out.finished:
                        records[item.index] = result_record(item, out, self.cfg.model_name)
                        self._count(out)
                        self.engine.forget(rid)
                        del running[rid]
            ready = []
            while next_write + len(ready) in records:
                ready.append(records.pop(next_write + len(ready)))
            if ready:
                writer.append(ready, next_write)
                next_write += len(ready)
                keeper.update(next_write - self.cfg.first)
                if bar is not None:
                    bar.update(len(ready))
                    bar.set_postfix_str(self._postfix(), refresh=False)
        if stop_at is not None:
            keeper.flush()
            assert self._stop_error is not None
            written = f"{next_write - self.cfg.first} records written, the job stopped here"
            raise JobStopped(f"{self._stop_error.message} (--on-error fail: {written})")

    def _submit(
        self, block: list[BatchItem], records: dict[int, dict[str, Any]], running: dict[int, BatchItem], seen: set[Any]
    ) -> int | None:
        """Submits a block (grouped by prompt); error items become records or stop the job."""
        ok: list[BatchItem] = []
        checked: dict[int, CheckedRequest] = {}  # item index -> the engine's one check of it
        for item in block:
            error = item.error
            if error is None and item.key in seen:
                error = LineError(item.line, f"line {item.line}: duplicate id {item.key!r}", "duplicate_id")
            if error is None:
                try:
                    checked[item.index] = self.engine.check(item.prompt_ids, item.params)  # type: ignore[arg-type]
                except Exception as exc:  # ValueError / TypeError, or anything else: this line's error
                    error = LineError(item.line, f"line {item.line}: {exc}")
            if error is not None and self.cfg.on_error == "fail":
                self._stop_error, stop = error, item.index
                break
            if error is not None:
                self._error(item, error, records)
                continue
            seen.add(item.key)
            ok.append(item)
        else:
            stop = None
        for item in sorted(ok, key=lambda it: it.prompt_ids) if self.cfg.group else ok:
            try:
                rid = self.engine.add(checked[item.index])
            except Exception as exc:  # queueing failed (a grammar that does not compile, say): this line's error
                seen.discard(item.key)
                self._error(item, LineError(item.line, f"line {item.line}: {type(exc).__name__}: {exc}"), records)
                continue
            running[rid] = item
        return stop

    def _error(self, item: BatchItem, error: LineError, records: dict[int, dict[str, Any]]) -> None:
        records[item.index] = error_record(item, error)
        self.stats.errors += 1
        if len(self.first_errors) < 5:
            self.first_errors.append(error)
            if self.cfg.progress:
                print(f"radixflow batch: {error.message}", file=sys.stderr)

    def _count(self, out: Any) -> None:
        self.stats.requests += 1
        self.stats.prompt_tokens += out.prompt_tokens
        self.stats.cached_tokens += out.cached_tokens
        self.stats.generated_tokens += len(out.token_ids)

    def _seen_keys(self, done: int) -> set[Any]:
        """Ids already answered by the first ``done`` output records (duplicates stay errors on resume)."""
        seen: set[Any] = set()
        if done:
            with open(self.cfg.output) as f:
                for _, line in zip(range(done), f):
                    rec = json.loads(line)
                    if rec.get("error") is None:
                        seen.add(record_key(rec))
        return seen

    def _bar(self, total: int, start: int) -> Any:
        if not self.cfg.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=total, initial=start, unit="req", desc="batch", file=sys.stderr, dynamic_ncols=True)

    def _postfix(self) -> str:
        dt = max(time.perf_counter() - self._t0, 1e-9)
        s = self.stats
        return f"{s.requests / dt:.2f} req/s, {s.generated_tokens / dt:.1f} tok/s, cache hit {100 * s.hit_rate:.1f}%"
