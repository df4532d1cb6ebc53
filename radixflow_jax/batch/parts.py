"""A batch job across processes: each process answers its share of the requests, process 0 merges.

Process ``p`` of ``k`` (started through ``jax.distributed``, see ``replicas/distributed.py``) runs an
ordinary :class:`BatchJob` over the contiguous requests :func:`process_share` gives it, into its own
part file ``OUTPUT.part{p}-of-{k}`` with its own state file, so each part resumes exactly as a
one-process job does. After a barrier, process 0 concatenates the parts in process order into
``OUTPUT`` (written to a temporary file, then renamed) and writes ``OUTPUT``'s state file; once that
state says complete, the parts are removed and a ``--resume`` of the job has nothing left to do.

Invariants: the merged output equals the output of the same job in one process (line ``k`` answers
request ``k``): shares are contiguous and in order, each part keeps its own order, and an id that
repeats one answered in an *earlier share* becomes a ``duplicate_id`` error record at the merge,
as it would have in one process. A part that stopped (``--on-error fail``) ends the merged output
after its last record, so the output is still a completed prefix of the work.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from radixflow_jax.batch.inputs import OPENAI, PLAIN, BatchItem, LineError, LineIndex
from radixflow_jax.batch.output import (
    JobState,
    ResumeError,
    error_record,
    read_state,
    record_key,
    recover_output,
    state_path,
    write_state,
)
from radixflow_jax.batch.runner import BatchJob, JobConfig, JobStats, JobStopped, model_fingerprint
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.replicas.distributed import barrier, process_share
from radixflow_jax.models.api import LoadedModel


def part_path(output: str, process_id: int, num_processes: int) -> str:
    return f"{output}.part{process_id}-of-{num_processes}"


def finished_before(cfg: JobConfig) -> bool:
    """Checks the start of a process's share: ``True`` when a resumed job's merged output is
    already complete (nothing to do); a fresh start refuses an existing merged output."""
    spath = state_path(cfg.output)
    if not cfg.resume:
        if (os.path.exists(cfg.output) and os.path.getsize(cfg.output)) or os.path.exists(spath):
            raise ResumeError(f"{cfg.output} (or its state file) exists: pass --resume to continue it, or remove both")
        return False
    return os.path.exists(spath) and read_state(spath).complete


@dataclasses.dataclass(frozen=True)
class ShareResult:
    stats: JobStats | None  # None: the merged output was complete already
    stopped: str | None  # this share's JobStopped message (--on-error fail)
    merged: int | None  # process 0: records in the merged output
    merge_stopped: str | None  # process 0: why the merged output ends early


def run_share(
    engine: EngineCore, model: LoadedModel, cfg: JobConfig, process_id: int, num_processes: int
) -> ShareResult:
    """Runs this process's share into its part file; every process then meets at a barrier and
    process 0 merges. Every process of the job must call this."""
    if finished_before(cfg):
        return ShareResult(None, None, None, None)
    index = LineIndex(cfg.input)
    share = process_share(len(index), process_id, num_processes)
    part = dataclasses.replace(
        cfg, output=part_path(cfg.output, process_id, num_processes), first=share.start, end=share.stop
    )
    job = BatchJob(engine, model, part)
    stats, stopped = None, None
    try:
        stats = job.run()
    except JobStopped as exc:
        stats, stopped = job.stats, str(exc)
    barrier(f"radixflow-batch-parts:{cfg.output}")
    merged, why = None, None
    if process_id == 0:
        merged, why = merge_parts(cfg, index, num_processes, model_fingerprint(model))
    barrier(f"radixflow-batch-merged:{cfg.output}")
    return ShareResult(stats, stopped, merged, why)


def _duplicate(index: LineIndex, k: int, record: dict[str, Any]) -> dict[str, Any]:
    line = index[k][1]
    key = record_key(record)
    item = BatchItem(index=k, line=line, fmt=OPENAI if "custom_id" in record else PLAIN, key=key)
    return error_record(item, LineError(line, f"line {line}: duplicate id {key!r}", "duplicate_id"))


def merge_parts(cfg: JobConfig, index: LineIndex, num_processes: int, fingerprint: str) -> tuple[int, str | None]:
    """Concatenates the parts into ``cfg.output``; returns ``(records, why it ended early or None)``."""
    records: list[bytes] = []
    seen: set[Any] = set()
    why: str | None = None
    for p in range(num_processes):
        path = part_path(cfg.output, p, num_processes)
        state = read_state(state_path(path))
        done = recover_output(path)
        if (state.first, done) != (len(records), state.done):
            raise ResumeError(
                f"merge refused: part {path} holds {done} records from request {state.first}, "
                f"expected records from request {len(records)} (state: {state.done})"
            )
        with open(path, "rb") as f:
            for line in f.read().splitlines()[:done]:
                rec = json.loads(line)
                submitted = rec.get("error") is None or rec["error"].get("code") == "step_failed"
                if submitted and record_key(rec) in seen:
                    rec = _duplicate(index, len(records), rec)
                    if cfg.on_error == "fail":
                        why = f"{rec['error']['message']} (--on-error fail: {len(records)} records written)"
                        break
                    line = json.dumps(rec, ensure_ascii=False).encode()
                elif submitted:
                    seen.add(record_key(rec))
                records.append(line + b"\n")
        if why is not None or not state.complete:
            why = why or f"part {p} stopped after {done} of its {state.total} requests"
            break
    tmp = f"{cfg.output}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(b"".join(records))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, cfg.output)
    complete = why is None
    final = JobState(
        input=os.path.abspath(cfg.input),
        input_sha256=index.sha256,
        model=fingerprint,
        total=len(index),
        done=len(records),
        complete=complete,
    )
    write_state(state_path(cfg.output), final)
    if complete:
        for p in range(num_processes):
            path = part_path(cfg.output, p, num_processes)
            os.remove(path)
            os.remove(state_path(path))
    return len(records), why
