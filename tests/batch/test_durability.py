"""Batch durability: a power loss that takes the output's unsynced tail leaves a resumable job, the
output is fsynced before every state write that counts it, and every exception of a line becomes
that line's error record. The engine is the module-scoped tiny-qwen3.5 one of ``jobs.SMALL`` (its
step variants come from the shared model, compiled by whichever batch module ran first)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from radixflow_jax.batch import BatchJob
from radixflow_jax.batch.inputs import LineIndex, LineLimits, line_key, parse_line
from radixflow_jax.batch.output import ResumeError, recover_output, state_path
from radixflow_jax.llm import LLM
from tests.batch.jobs import (
    SMALL,
    SimulatedKill,
    comparable,
    job_cfg,
    read_records,
    request_lines,
    reset_engine,
    write_lines,
)

IDS = [f"r{i}" for i in range(12)]


@pytest.fixture(scope="module")
def llm(tiny_model) -> LLM:
    return LLM(tiny_model("tiny-qwen3.5"), **SMALL)


@pytest.fixture(scope="module")
def reference(llm, tmp_path_factory) -> tuple[str, list[dict]]:
    workdir = tmp_path_factory.mktemp("durability")
    src = write_lines(str(workdir / "in.jsonl"), request_lines())
    out = str(workdir / "ref.jsonl")
    BatchJob(llm.engine, llm.model, job_cfg(src, out, window=4)).run()
    return src, read_records(out)


def _line_ends(path: str) -> list[int]:
    data = open(path, "rb").read()
    return [i + 1 for i, b in enumerate(data) if b == ord("\n")]


def _lose_tail(path: str, keep: int, how: str) -> None:
    """What a power loss can leave of the records after the first ``keep``: nothing (``cut``), a
    torn line (``torn``), or the file's length with zeros in place of the lost data (``zeros``)."""
    ends = _line_ends(path)
    start = ends[keep - 1] if keep else 0
    if how == "cut":
        os.truncate(path, start)
    elif how == "torn":
        os.truncate(path, (start + ends[keep]) // 2)
    else:
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.seek(start)
            f.write(b"\0" * (size - start))


@pytest.mark.parametrize(
    "kill_at, keep, how",
    [(None, 5, "torn"), (None, 0, "cut"), (9, 3, "cut"), (9, 4, "zeros"), (7, 6, "torn")],
)
def test_a_lost_unsynced_tail_resumes_with_every_id_once(llm, reference, tmp_path, capsys, kill_at, keep, how) -> None:
    """The state file counts more records than the output kept (a power loss after the state write
    took the output's tail): the resume rewinds to the surviving records and computes the rest."""
    src, ref = reference
    out = str(tmp_path / "out.jsonl")

    def hook(where: str, at: int) -> None:
        if kill_at is not None and where == "after_state" and at >= kill_at:
            raise SimulatedKill(f"{where}@{at}")

    if kill_at is None:
        BatchJob(llm.engine, llm.model, job_cfg(src, out, window=4)).run()
    else:
        cfg = job_cfg(src, out, window=4, state_interval_s=0.0)  # a state write after every append
        with pytest.raises(SimulatedKill):
            BatchJob(llm.engine, llm.model, cfg, crash_hook=hook).run()
        reset_engine(llm)
    with open(state_path(out)) as f:
        counted = json.load(f)["done"]
    assert counted > keep
    _lose_tail(out, keep, how)
    capsys.readouterr()
    stats = BatchJob(llm.engine, llm.model, job_cfg(src, out, resume=True, window=4)).run()
    got = read_records(out)
    assert [r.get("custom_id", r["id"]) for r in got] == IDS  # every id exactly once, in input order
    assert [comparable(r) for r in got] == [comparable(r) for r in ref]
    assert stats.started == keep
    assert f"holds {keep} complete records, its state file counted {counted}" in capsys.readouterr().err
    with open(state_path(out)) as f:
        state = json.load(f)
    assert state["complete"] and state["done"] == 12


def test_the_output_is_synced_before_every_state_write(llm, reference, tmp_path, monkeypatch) -> None:
    """Linux only, as every machine this project runs its tests on: names an fd's file through /proc."""
    src, _ = reference
    out = str(tmp_path / "out.jsonl")
    real = os.fsync
    synced = {"size": 0}
    state_writes: list[tuple[int, int]] = []  # (output size, output size at its last fsync)

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path == out:
            synced["size"] = os.fstat(fd).st_size
        elif path.startswith(state_path(out)) and stat.S_ISREG(os.fstat(fd).st_mode):
            state_writes.append((os.path.getsize(out) if os.path.exists(out) else 0, synced["size"]))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    BatchJob(llm.engine, llm.model, job_cfg(src, out, window=4, state_interval_s=0.0)).run()
    monkeypatch.undo()
    assert len(state_writes) >= 4 and state_writes[-1][0] == os.path.getsize(out) > 0
    assert all(size == at_sync for size, at_sync in state_writes), state_writes


class _FailingTokenizer:
    """A tokenizer whose template and encoder raise what no caller foresaw."""

    def encode(self, text: str) -> list[int]:
        raise RuntimeError("encoder crashed")

    def apply_chat_template(self, messages, add_generation_prompt=True, tools=None) -> str:
        raise TypeError("can only concatenate str (not 'NoneType') to str")


DEEP = "[" * 100_000 + "]" * 100_000
HOSTILE = [
    '{"id": "big", "prompt_token_ids": [5, 6], "max_tokens": ' + "9" * 5000 + "}",
    '{"custom_id": "bigb", "url": "/v1/completions", "body": {"prompt": [5], "max_tokens": ' + "7" * 4400 + "}}",
    '{"id": "deep", "prompt_token_ids": ' + DEEP + "}",
    '{"custom_id": "deepb", "url": "/v1/completions", "body": {"prompt": [5], "x": ' + DEEP + "}}",
    '{"id": "chat", "messages": [{"role": "user", "content": "hi"}]}',
    '{"custom_id": "chatb", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hi"}]}}',
    '{"id": "text", "prompt": "hello"}',
    b'{"id": "latin1 \xff"}',
]


def test_parse_line_never_raises() -> None:
    limits = LineLimits(max_model_len=512, vocab_size=1000)
    for i, raw in enumerate(HOSTILE):
        data = raw if isinstance(raw, bytes) else raw.encode()
        item = parse_line(i, i + 1, data, _FailingTokenizer(), limits)
        assert item.error is not None and item.error.message.startswith(f"line {i + 1}: "), item
        assert item.key == line_key(data)
        assert len(item.error.message) < 1000
    chat = parse_line(0, 1, HOSTILE[4].encode(), _FailingTokenizer(), limits)
    assert chat.key == "chat" and "TypeError: can only concatenate" in chat.error.message


def test_every_exception_in_a_line_is_its_own_error_record(llm, tmp_path) -> None:
    ok = '{"id": "ok%d", "prompt_token_ids": [5, 6, 7], "max_tokens": 2}'
    lone = '{"id": "lone \\ud800", "prompt_token_ids": [5], "max_tokens": 1}'
    lines = [ok % 0, *HOSTILE[:4], lone, ok % 1]
    src = write_lines(str(tmp_path / "hostile.jsonl"), lines)
    out = str(tmp_path / "out.jsonl")
    stats = BatchJob(llm.engine, llm.model, job_cfg(src, out, window=4)).run()
    recs = read_records(out)
    assert len(recs) == 7 and stats.errors == 4 and stats.requests == 3
    assert recs[0]["error"] is None and recs[5]["error"] is None and recs[6]["error"] is None
    assert recs[5]["id"] == "lone \ud800"  # written with an ASCII escape, read back the same
    for rec in recs[1:5]:
        assert rec["error"]["code"] == "invalid_json", rec
    assert "Exceeds the limit" in recs[1]["error"]["message"] and "RecursionError" in recs[3]["error"]["message"]
    # the hostile lines do not stop a resume either
    with open(state_path(out)) as f:
        state = json.load(f)
    _lose_tail(out, 2, "torn")
    BatchJob(llm.engine, llm.model, job_cfg(src, out, resume=True, window=4)).run()
    assert [comparable(r) for r in read_records(out)] == [comparable(r) for r in recs] and state["done"] == 7


def test_recover_output_keeps_only_records_that_answer_their_lines(tmp_path) -> None:
    src = write_lines(str(tmp_path / "in.jsonl"), request_lines()[:3])
    index = LineIndex(src)
    out = str(tmp_path / "out.jsonl")
    write_lines(out, [{"id": "r0"}, {"id": "r1"}])
    assert recover_output(out, index.keys(0, 3)) == 2
    write_lines(out, [{"id": "r0"}, {"id": "r9"}])
    with pytest.raises(ResumeError, match="record 2 of .* answers id 'r9', its input request has id 'r1'"):
        recover_output(out, index.keys(0, 3))
    write_lines(out, [{"id": "r0"}, {"id": "r1"}, {"id": "r2"}, {"id": "r3"}])
    with pytest.raises(ResumeError, match="more records than the job has requests"):
        recover_output(out, index.keys(0, 3))
    write_lines(out, [{"id": "r0"}, "[1, 2]", {"id": "r2"}])  # a line that is no record ends the prefix
    assert recover_output(out, index.keys(0, 3)) == 1 and read_records(out) == [{"id": "r0"}]
