"""Several processes and replica device groups.

* Two processes on loopback (``jax.distributed``, gloo CPU collectives), each one engine replica
  with its own scheduler: the union of their outputs equals one process's, for ``LLM`` prompts
  (``generate_across_processes``) and for a ``radixflow batch`` job split into shares (process 0
  merges the parts in input order; an id repeated across shares is still refused).
* A batch job's shares resume after a kill and merge into the one-process output (in-process: a
  barrier in one process is a no-op).
* ``LLM(data_parallel_size=2, tensor_parallel_size=2)``: replica i on local devices [2i, 2i+2),
  greedy outputs equal one device's.

Cheap by construction: the tiny preset with one step variant per engine, a handful of requests,
and a persistent XLA cache shared by this process and its two subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import jax
import pytest

from radixflow_jax.batch import BatchJob, JobConfig
from radixflow_jax.batch.output import ResumeError, state_path
from radixflow_jax.batch.parts import part_path, run_share
from radixflow_jax.replicas.distributed import DistributedConfig, free_port, process_share
from radixflow_jax.llm import LLM
from radixflow_jax.engine.params import SamplingParams

# one step variant per engine ("fixed" buckets): each process compiles once
ENGINE = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512, warmup=False, warmup_progress=False,
              bucket_mode="fixed")  # fmt: skip
PREFIXES = [list(range(100, 170)), list(range(300, 366))]
PROMPTS = [PREFIXES[i % 2] + [60 + i, 61 + i] for i in range(4)]
# six requests: shares [0, 3) and [3, 6) of two processes; "r0" again in the second share
LINES = [{"id": f"r{i}", "prompt_token_ids": p, "max_tokens": 3} for i, p in enumerate(PROMPTS)]
LINES += [{"id": "r0", "prompt_token_ids": [5, 6, 7], "max_tokens": 2},
          {"id": "r5", "prompt_token_ids": [8, 9], "max_tokens": 2}]  # fmt: skip


class SimulatedKill(BaseException):
    """Stands for SIGKILL (see tests/batch/jobs.py)."""


def _read(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def _comparable(records: list[dict]) -> list[dict]:
    """Records without cache hits (each process has its own cache)."""
    return [{k: v for k, v in r.items() if k != "cached_tokens"} for r in records]


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield d


@pytest.fixture(scope="module")
def cache_dir() -> str:
    return os.environ.get("RADIXFLOW_TEST_XLA_CACHE") or os.path.join(tempfile.gettempdir(), "radixflow-xla-cache")


@pytest.fixture(scope="module")
def llm(cache_dir: str) -> LLM:
    return LLM("tiny-qwen3.5", compilation_cache_dir=cache_dir, **ENGINE)


@pytest.fixture(scope="module")
def reference(llm: LLM, workdir: str) -> tuple[str, list[dict], list[list[int]]]:
    """One process: the batch job's output and the prompts' greedy tokens."""
    src = os.path.join(workdir, "in.jsonl")
    with open(src, "w") as f:
        f.writelines(json.dumps(line) + "\n" for line in LINES)
    out = os.path.join(workdir, "ref.jsonl")
    BatchJob(llm.engine, llm.model, JobConfig(src, out, model_name="tiny-qwen3.5", progress=False, window=4)).run()
    generated = [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=3))]
    return src, _read(out), generated


def test_process_share_is_a_contiguous_partition() -> None:
    for n in range(0, 9):
        for k in range(1, 5):
            shares = [process_share(n, p, k) for p in range(k)]
            assert [i for s in shares for i in s] == list(range(n))
            assert max(len(s) for s in shares) - min(len(s) for s in shares) <= 1
    with pytest.raises(ValueError, match="process_id"):
        DistributedConfig("127.0.0.1:1234", 2, 2)
    with pytest.raises(ValueError, match="host:port"):
        DistributedConfig("localhost", 2, 0)


def test_two_processes_on_loopback_equal_one_process(reference, workdir: str, cache_dir: str) -> None:
    src, ref_records, ref_generated = reference
    assert ref_records[4]["error"]["code"] == "duplicate_id"  # the one-process job refuses the repeated id
    out = os.path.join(workdir, "two.jsonl")
    job = {"model": "tiny-qwen3.5", "engine": {**ENGINE, "compilation_cache_dir": cache_dir}, "prompts": PROMPTS,
           "max_tokens": 3, "input": src, "output": out, "window": 4}  # fmt: skip
    with open(os.path.join(workdir, "job.json"), "w") as f:
        json.dump(job, f)
    worker = os.path.join(os.path.dirname(__file__), "process_worker.py")
    coordinator = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen([sys.executable, worker, coordinator, str(p), "2", workdir], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        for p in range(2)
    ]
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=600)[0].decode(errors="replace"))
        finally:
            if proc.poll() is None:
                proc.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    seen = [json.load(open(os.path.join(workdir, f"process-{p}.json"))) for p in range(2)]
    for p, s in enumerate(seen):
        assert (s["process_index"], s["process_count"], s["global_devices"], s["local_devices"]) == (p, 2, 2, 1)
        assert s["generated"] == ref_generated  # every process got every prompt's output back, in order
        assert s["request_ids"] == list(range(len(PROMPTS)))
    assert seen[0]["model_devices"] != seen[1]["model_devices"]  # each replica on its own process's device
    assert [s["share_requests"] for s in seen] == [3, 3]  # the repeated id of share 1 is refused at the merge
    assert seen[0]["merged"] == len(LINES)
    assert _comparable(_read(out)) == _comparable(ref_records)
    with open(state_path(out)) as f:
        assert json.load(f)["complete"]
    assert not os.path.exists(part_path(out, 0, 2)) and not os.path.exists(part_path(out, 1, 2))


def test_batch_shares_resume_after_a_kill_and_merge(llm: LLM, reference, tmp_path) -> None:
    src, ref_records, _ = reference
    out = str(tmp_path / "out.jsonl")

    def cfg(resume: bool) -> JobConfig:
        return JobConfig(src, out, resume=resume, model_name="tiny-qwen3.5", progress=False, window=2)

    def kill(where: str, at: int) -> None:
        if where == "mid_write" and at >= 1:
            raise SimulatedKill(where)

    share0 = JobConfig(src, part_path(out, 0, 2), model_name="tiny-qwen3.5", progress=False, window=2, first=0, end=3)
    job = BatchJob(llm.engine, llm.model, share0, crash_hook=kill)
    with pytest.raises(SimulatedKill):
        job.run()
    for rid in list(llm.engine.scheduler.requests):
        llm.engine.abort(rid)
        llm.engine.forget(rid)
    assert 1 <= len(open(part_path(out, 0, 2), "rb").read().split(b"\n")) - 1 < 3
    # share 1 never started: its --resume starts it from the beginning; only process 0 merges
    assert run_share(llm.engine, llm.model, cfg(True), 1, 2).merged is None
    result = run_share(llm.engine, llm.model, cfg(True), 0, 2)
    assert result.stats is not None and result.stats.started > 0 and result.merged == len(LINES)
    assert _comparable(_read(out)) == _comparable(ref_records)
    assert run_share(llm.engine, llm.model, cfg(True), 0, 2).stats is None  # complete: nothing left to do
    with pytest.raises(ResumeError, match="exists"):
        run_share(llm.engine, llm.model, cfg(False), 0, 2)


def test_replicas_on_separate_device_groups(llm: LLM) -> None:
    assert len(jax.local_devices()) >= 4
    prompts = PROMPTS[:3]
    params = SamplingParams(max_tokens=3)
    grouped = LLM(llm.model, data_parallel_size=2, tensor_parallel_size=2, **ENGINE)
    groups = [sorted(d.id for d in m.mesh.devices.flat) for m in grouped.replica_models]
    assert groups == [[0, 1], [2, 3]]
    leaf = jax.tree.leaves(grouped.replica_models[1].params)[0]
    assert sorted(d.id for d in leaf.devices()) == [2, 3]
    got = grouped.generate(prompts, params)
    assert sorted(grouped.replicas.router.routed) == [1, 2]  # both replicas ran requests
    assert [o.token_ids for o in got] == [o.token_ids for o in llm.generate(prompts, params)]
