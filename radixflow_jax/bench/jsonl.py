"""A user's workload file: one JSON object per line, read through ``grain``.

Each line: ``{"prompt": str}`` or ``{"prompt_token_ids": [int, ...]}``, plus ``"max_tokens"`` (int,
default 16) and optionally ``"arrival_s"`` (float, default 0) and ``"group"`` (int). Text prompts
need the model's tokenizer (``encode``). Errors name the line number.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

from radixflow_jax.bench.workloads import BenchRequest


class WorkloadFileError(ValueError):
    """A malformed workload file; the message names the file and line."""


def _parse(path: str, lineno: int, line: str, encode: Callable[[str], list[int]] | None) -> BenchRequest:
    where = f"{path}:{lineno}"
    try:
        obj: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise WorkloadFileError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise WorkloadFileError(f"{where}: expected a JSON object")
    if "prompt_token_ids" in obj:
        ids = obj["prompt_token_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise WorkloadFileError(f"{where}: prompt_token_ids must be a non-empty list of non-negative ints")
        prompt = tuple(ids)
    elif "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise WorkloadFileError(f"{where}: prompt must be a non-empty string")
        if encode is None:
            raise WorkloadFileError(f"{where}: text prompt but the model has no tokenizer (use prompt_token_ids)")
        prompt = tuple(encode(obj["prompt"]))
    else:
        raise WorkloadFileError(f"{where}: needs 'prompt' or 'prompt_token_ids'")
    max_tokens = obj.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise WorkloadFileError(f"{where}: max_tokens must be an integer >= 1")
    arrival = obj.get("arrival_s", 0.0)
    if not isinstance(arrival, (int, float)) or arrival < 0:
        raise WorkloadFileError(f"{where}: arrival_s must be a number >= 0")
    return BenchRequest(prompt=prompt, max_tokens=max_tokens, arrival_s=float(arrival), group=int(obj.get("group", 0)))


def read_jsonl(path: str, encode: Callable[[str], list[int]] | None = None) -> list[BenchRequest]:
    """All requests of the file, sorted by arrival (stable)."""
    import grain

    try:
        with open(path) as f:
            lines: Sequence[tuple[int, str]] = [(i + 1, l) for i, l in enumerate(f) if l.strip()]
    except OSError as exc:
        raise WorkloadFileError(f"{path}: cannot read ({exc.strerror})") from None
    if not lines:
        raise WorkloadFileError(f"{path}: no requests")
    dataset = grain.MapDataset.source(lines).map(lambda item: _parse(path, item[0], item[1], encode))
    requests = [dataset[i] for i in range(len(dataset))]
    return sorted(requests, key=lambda r: r.arrival_s)


def write_jsonl(path: str, requests: Sequence[BenchRequest]) -> None:
    with open(path, "w") as f:
        for r in requests:
            f.write(
                json.dumps(
                    {
                        "prompt_token_ids": list(r.prompt),
                        "max_tokens": r.max_tokens,
                        "arrival_s": r.arrival_s,
                        "group": r.group,
                    }
                )
                + "\n"
            )
