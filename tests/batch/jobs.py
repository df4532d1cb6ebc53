"""What the batch test modules share: the engine settings, a twelve-line job over two shared
prefixes, a simulated kill, and reading and comparing output records."""

from __future__ import annotations

import json

from radixflow_jax.batch import JobConfig
from radixflow_jax.llm import LLM

SMALL = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512, warmup=False)
# Two shared prefixes longer than the hybrid checkpoint grid (64 tokens), so they can be reused.
PREFIXES = [list(range(100, 170)), list(range(300, 366))]


def job_cfg(src: str, out: str, **options) -> JobConfig:
    return JobConfig(src, out, model_name="tiny-qwen3.5", progress=False, **options)


class SimulatedKill(BaseException):
    """Stands for SIGKILL: nothing after the raise point runs (BaseException escapes every handler)."""


def request_lines() -> list[dict]:
    """Twelve requests, two shared prefixes interleaved, both line formats, one sampled request."""
    out: list[dict] = []
    for i in range(12):
        prompt = PREFIXES[i % 2] + [60 + i, 61 + i]
        if i % 4 == 3:
            body = {"prompt": prompt, "max_tokens": 3, "temperature": 0}
            out.append({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": body})
        elif i == 6:
            out.append({"id": f"r{i}", "prompt_token_ids": prompt, "max_tokens": 4, "temperature": 0.8, "top_k": 20})
        else:
            out.append({"id": f"r{i}", "prompt_token_ids": prompt, "max_tokens": 4})
    return out


def write_lines(path: str, lines: list) -> str:
    with open(path, "w") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def read_records(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def comparable(rec: dict) -> dict:
    """A record without what legitimately differs between runs: cache hits (a resumed run starts
    with a cold cache) and the response's creation time."""
    rec = json.loads(json.dumps(rec))
    rec.pop("cached_tokens", None)
    body = (rec.get("response") or {}).get("body")
    if body:
        body.pop("created")
        body["usage"].pop("prompt_tokens_details")
    return rec


def reset_engine(llm: LLM) -> None:
    """After a simulated kill: drop the dead run's requests (its cache entries stay, as harmless as
    a warm cache; greedy output is the same with and without hits)."""
    core = llm.engine
    for rid in list(core.scheduler.requests):
        core.abort(rid)
        core.forget(rid)
