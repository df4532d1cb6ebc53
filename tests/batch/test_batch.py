"""``radixflow batch``: kill-and-resume equality, bad input, and the engine request path.

One module-scoped engine (tiny-qwen3.5, the small settings the engine tests use, lazily compiled)
serves every in-process run. A kill inside the process is simulated by a hook that raises at the
points where a real kill can land (before/while/after an output append, after a state write): the
writer appends with raw ``os.write`` calls, so the files on disk are exactly what a SIGKILL there
would leave. One real SIGKILL of a ``radixflow batch`` subprocess checks the same from outside.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from radixflow_jax.batch import BatchJob, JobStopped
from radixflow_jax.batch.output import ResumeError, state_path
from radixflow_jax.llm import LLM
from radixflow_jax.engine.params import SamplingParams
from tests.batch.jobs import (
    PREFIXES,
    SMALL,
    SimulatedKill,
    comparable,
    job_cfg,
    read_records,
    request_lines,
    reset_engine,
    write_lines,
)


@pytest.fixture(scope="module")
def llm(tiny_model) -> LLM:
    return LLM(tiny_model("tiny-qwen3.5"), **SMALL)


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield d


@pytest.fixture(scope="module")
def reference(llm, workdir) -> tuple[str, list[dict]]:
    src = write_lines(os.path.join(workdir, "in.jsonl"), request_lines())
    out = os.path.join(workdir, "ref.jsonl")
    BatchJob(llm.engine, llm.model, job_cfg(src, out, window=4)).run()
    return src, read_records(out)


def test_uninterrupted_run_answers_in_input_order(llm, reference) -> None:
    src, ref = reference
    assert [r.get("custom_id", r["id"]) for r in ref] == [f"r{i}" for i in range(12)]
    assert all(r["error"] is None for r in ref)
    plain = [r for r in ref if "custom_id" not in r]
    assert all(len(r["token_ids"]) == 4 and r["finish_reason"] == "length" for r in plain)
    assert sum(r["cached_tokens"] for r in plain) > 0  # the interleaved prefixes were grouped and reused
    batch = [r for r in ref if "custom_id" in r]
    assert all(r["response"]["status_code"] == 200 and r["response"]["body"]["object"] == "text_completion" for r in batch)
    # the engine's own path: the same greedy tokens as LLM.generate
    greedy = llm.generate([PREFIXES[0] + [60, 61]], SamplingParams(max_tokens=4))[0]
    assert ref[0]["token_ids"] == greedy.token_ids


KILLS = [("after_state", 0), ("mid_write", 5), ("after_write", 7), ("mid_write", 11)]


@pytest.mark.parametrize("point, line", KILLS)
def test_kill_then_resume_equals_uninterrupted(llm, reference, tmp_path, point: str, line: int) -> None:
    src, ref = reference
    out = str(tmp_path / "out.jsonl")

    def hook(where: str, at: int) -> None:
        if where == point and at >= line:
            raise SimulatedKill(f"{where}@{at}")

    with pytest.raises(SimulatedKill):
        BatchJob(llm.engine, llm.model, job_cfg(src, out, window=4), crash_hook=hook).run()
    reset_engine(llm)
    data = open(out, "rb").read() if os.path.exists(out) else b""  # the state file comes first
    if point == "mid_write":
        assert not data.endswith(b"\n")  # a torn line is on disk
    stats = BatchJob(llm.engine, llm.model, job_cfg(src, out, resume=True, window=4)).run()
    got = read_records(out)
    assert [r.get("custom_id", r["id"]) for r in got] == [f"r{i}" for i in range(12)]  # each id exactly once
    assert [comparable(r) for r in got] == [comparable(r) for r in ref]
    assert stats.started == data.count(b"\n")
    with open(state_path(out)) as f:
        state = json.load(f)
    assert state["complete"] and state["done"] == 12


def test_sigkill_of_the_cli_then_resume(llm, reference, tmp_path) -> None:
    """A real SIGKILL of `radixflow batch` once its output has records, then --resume."""
    src, ref = reference
    out = str(tmp_path / "out.jsonl")
    cache = os.environ.get("RADIXFLOW_TEST_XLA_CACHE") or os.path.join(tempfile.gettempdir(), "radixflow-xla-cache")
    cmd = [sys.executable, "-m", "radixflow_jax.cli", "batch", "--model", "tiny-qwen3.5", "--input", src,
           "--output", out, "--window", "4", "--max-num-seqs", "4", "--max-num-batched-tokens", "64",
           "--max-model-len", "512", "--no-warmup", "--no-progress", "--compile-cache", cache]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.exists(out) and open(out, "rb").read().count(b"\n") >= 2:
            break
        time.sleep(0.005)
    killed = proc.poll() is None
    proc.send_signal(signal.SIGKILL) if killed else None
    proc.wait()
    assert killed, proc.stderr.read().decode()[-2000:]
    before = open(out, "rb").read().count(b"\n")
    assert 2 <= before < 12
    BatchJob(llm.engine, llm.model, job_cfg(src, out, resume=True, window=4)).run()
    got = read_records(out)
    assert [comparable(r) for r in got] == [comparable(r) for r in ref]


BAD = [
    '{"id": "ok1", "prompt_token_ids": [5, 6, 7], "max_tokens": 2}',
    '{"id": "broken", "prompt_token_ids": [5, 6',
    '{"custom_id": "u", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}',
    '{"id": "noprompt", "max_tokens": 2}',
    '{"id": "long", "prompt_token_ids": [5, 6, 7], "max_tokens": 600}',
    '{"custom_id": "longb", "method": "POST", "url": "/v1/completions", "body": {"prompt": [5, 6], "max_tokens": 600}}',
    '{"id": "badparam", "prompt_token_ids": [5, 6], "max_tokens": 2, "beam_width": 3}',
    '{"id": "ok1", "prompt_token_ids": [8, 9], "max_tokens": 2}',
    "",
    '{"custom_id": "ok2", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}}',
]  # fmt: skip


def test_bad_lines_become_error_records_with_line_numbers(llm, tmp_path) -> None:
    src = write_lines(str(tmp_path / "bad.jsonl"), BAD)
    out = str(tmp_path / "out.jsonl")
    stats = BatchJob(llm.engine, llm.model, job_cfg(src, out, window=4)).run()
    recs = read_records(out)
    assert len(recs) == 9  # the blank line is not a request
    errors = {r["error"]["line"]: (r["error"]["code"], r["error"]["message"]) for r in recs if r["error"]}
    assert errors[2][0] == "invalid_json" and errors[2][1].startswith("line 2: not valid JSON")
    assert errors[3][0] == "invalid_url" and "unknown url '/v1/embeddings'" in errors[3][1]
    assert errors[4][0] == "missing_prompt"
    assert errors[5][0] == "context_length_exceeded" and "max_model_len=512" in errors[5][1]
    assert errors[6][0] == "context_length_exceeded" and recs[5]["response"] is None
    assert errors[7][0] == "invalid_parameter" and "beam_width" in errors[7][1]
    assert errors[8][0] == "duplicate_id"
    assert sorted(errors) == [2, 3, 4, 5, 6, 7, 8] and stats.errors == 7 and stats.requests == 2
    assert recs[0]["error"] is None and recs[-1]["response"]["body"]["object"] == "chat.completion"


def test_several_samples_echo_and_prompt_logprobs_are_refused_per_line(llm, tmp_path) -> None:
    lines = [
        '{"custom_id": "n", "method": "POST", "url": "/v1/completions", "body": {"prompt": [5, 6], "max_tokens": 2, "n": 2}}',
        '{"custom_id": "e", "method": "POST", "url": "/v1/completions", "body": {"prompt": [5, 6], "max_tokens": 2, "echo": true}}',
        '{"id": "p", "prompt_token_ids": [5, 6], "max_tokens": 2, "prompt_logprobs": 1}',
        '{"id": "b", "prompt_token_ids": [5, 6], "max_tokens": 2, "best_of": 2}',
        '{"custom_id": "t", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", '
        '"content": "hi"}], "max_tokens": 2, "tools": [{"type": "function", "function": {"name": "f"}}]}}',
    ]  # fmt: skip
    src = write_lines(str(tmp_path / "many.jsonl"), lines)
    out = str(tmp_path / "out.jsonl")
    stats = BatchJob(llm.engine, llm.model, job_cfg(src, out, window=4)).run()
    messages = [r["error"]["message"] for r in read_records(out)]
    assert stats.errors == 5 and stats.requests == 0
    assert "n: several samples" in messages[0] and "echo: not available" in messages[1]
    assert "prompt_logprobs: not available" in messages[2] and "n: several samples" in messages[3]
    assert "tools: not available" in messages[4]


def test_on_error_fail_stops_after_a_completed_prefix(llm, tmp_path) -> None:
    src = write_lines(str(tmp_path / "bad.jsonl"), BAD)
    out = str(tmp_path / "out.jsonl")
    with pytest.raises(JobStopped, match="line 2: not valid JSON"):
        BatchJob(llm.engine, llm.model, job_cfg(src, out, on_error="fail", window=4)).run()
    recs = read_records(out)
    assert [r["id"] for r in recs] == ["ok1"] and recs[0]["error"] is None


def test_resume_of_a_job_that_wrote_nothing_starts_over(llm, reference, tmp_path, capsys) -> None:
    src, ref = reference
    out = str(tmp_path / "out.jsonl")
    open(out, "w").close()  # killed before its first record: an empty output, no state file
    reset_engine(llm)
    BatchJob(llm.engine, llm.model, job_cfg(src, out, window=4, resume=True)).run()
    assert "starting from the beginning" in capsys.readouterr().err
    assert [comparable(r) for r in read_records(out)] == [comparable(r) for r in ref]


def test_resume_refuses_a_different_input_or_model(llm, reference, tmp_path) -> None:
    src, _ = reference
    out = str(tmp_path / "out.jsonl")
    BatchJob(llm.engine, llm.model, job_cfg(src, out, window=4)).run()
    other = write_lines(str(tmp_path / "other.jsonl"), request_lines()[:5])
    with pytest.raises(ResumeError, match="is not the input this job started with"):
        BatchJob(llm.engine, llm.model, job_cfg(other, out, resume=True)).run()
    with pytest.raises(ResumeError, match="exists: pass --resume"):
        BatchJob(llm.engine, llm.model, job_cfg(src, out)).run()
    with open(state_path(out)) as f:
        state = json.load(f)
    state["model"] = "0" * 64
    with open(state_path(out), "w") as f:
        json.dump(state, f)
    with pytest.raises(ResumeError, match="the model .* differs"):
        BatchJob(llm.engine, llm.model, job_cfg(src, out, resume=True)).run()
    os.remove(state_path(out))
    with pytest.raises(ResumeError, match="no state file"):
        BatchJob(llm.engine, llm.model, job_cfg(src, out, resume=True)).run()


def test_cli_refuses_a_bad_start_before_loading_the_model(tmp_path, capsys) -> None:
    from radixflow_jax import cli

    src = write_lines(str(tmp_path / "in.jsonl"), request_lines()[:2])
    out = str(tmp_path / "out.jsonl")
    base = ["batch", "--model", "no-such-model", "--input", src, "--output", out]
    assert cli.main(base + ["--resume"]) == 2  # nothing written yet: it starts over, then finds no model
    err = capsys.readouterr().err
    assert "no records and no state file yet; starting from the beginning" in err and "no-such-model" in err
    write_lines(out, [{"id": "r0"}])
    assert cli.main(base) == 2
    assert "exists: pass --resume" in capsys.readouterr().err
    assert cli.main(base[:-4] + ["--input", str(tmp_path / "missing.jsonl"), "--output", out]) == 2
    assert "no such file" in capsys.readouterr().err


def test_structured_output_lines(llm, tmp_path) -> None:
    """Constrained lines run through the server's validation: a choice and a schema are honoured,
    an invalid regex is an error record naming its field."""
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    chat = {"messages": [{"role": "user", "content": "ok?"}], "max_tokens": 16, "temperature": 0}
    lines = [json.dumps(x) for x in (
        {"custom_id": "s", "url": "/v1/chat/completions",
         "body": {**chat, "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}},
        {"custom_id": "r", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 4, "guided_regex": "a[b"}},
        {"id": "c", "prompt": "pick", "max_tokens": 8, "structured_outputs": {"choice": ["up", "down"]}},
    )]  # fmt: skip
    src = write_lines(str(tmp_path / "structured.jsonl"), lines)
    out = str(tmp_path / "out.jsonl")
    stats = BatchJob(llm.engine, llm.model, job_cfg(src, out, window=4)).run()
    recs = read_records(out)
    assert stats.errors == 1 and "guided_regex" in recs[1]["error"]["message"]
    msg = recs[0]["response"]["body"]["choices"][0]
    assert msg["finish_reason"] == "stop" and json.loads(msg["message"]["content"]) in ({"ok": True}, {"ok": False})
    assert recs[2]["finish_reason"] == "stop" and recs[2]["text"] in ("up", "down"), recs[2]
