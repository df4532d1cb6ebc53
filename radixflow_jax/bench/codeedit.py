"""A code-editing workload for speculative decoding: functions from the Python standard library's
own sources on the machine, shown to a chat model that is asked to repeat one, or to repeat it
renamed (``benchmarks/speculative.py``, the ``code-edit`` workload of ``benchmarks/vs_llamacpp.py``).
Outputs copy their prompts, so drafts looked up in a request's own tokens are often right.

The functions: those of 8-30 lines at the top level of :data:`MODULES`, in file order."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixflow_jax.engine.params import SamplingParams
    from radixflow_jax.llm import LLM

MODULES = ("textwrap", "shlex", "fnmatch", "heapq", "bisect", "colorsys", "posixpath", "string", "glob", "calendar")


def stdlib_functions(limit: int) -> list[tuple[str, str]]:
    """``(name, source)`` of up to ``limit`` functions (the module docstring)."""
    out = []
    for mod in MODULES:
        source = inspect.getsource(importlib.import_module(mod))
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and 8 <= node.end_lineno - node.lineno + 1 <= 30:
                out.append((node.name, ast.get_source_segment(source, node)))
                if len(out) == limit:
                    return out
    return out


def requests_text(limit: int) -> list[str]:
    """The user turns: even ones ask for the function repeated, odd ones renamed (``<name>_v2``)."""
    out = []
    for i, (name, src) in enumerate(stdlib_functions(limit)):
        ask = "Repeat this Python function exactly." if i % 2 == 0 else f"Rename the function to {name}_v2 and repeat it."
        out.append(f"{ask}\n\n```python\n{src}\n```")
    return out


def chatml(user: str) -> str:
    """``user`` as one ChatML turn awaiting the answer (SmolLM2's and Qwen's template, no system turn)."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def run_batches(llm: LLM, prompts: list[list[int]], params: SamplingParams, size: int) -> tuple[float, int, list, list]:
    """``(seconds, output tokens, token ids per prompt, round records)`` of generating ``prompts``
    ``size`` at a time, in order."""
    engine = llm.replicas.engines[0]
    first = len(engine.records)
    start = time.perf_counter()
    outs = []
    for i in range(0, len(prompts), size):
        outs += llm.generate(prompts[i : i + size], params)
    secs = time.perf_counter() - start
    return secs, sum(len(o.token_ids) for o in outs), [tuple(o.token_ids) for o in outs], engine.records[first:]


def chat_prompts(llm: LLM, limit: int) -> list[list[int]]:
    """:func:`requests_text` through the model's chat template, as token ids."""
    tok = llm.replicas.engines[0].tokenizer
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": text}])) for text in requests_text(limit)]


Runs = dict  # (arm, batch size) -> run_batches results, one per repeat


def interleaved(
    arms: Mapping[Any, LLM], prompts: list[list[int]], params: SamplingParams, sizes: Sequence[int], *,
    repeats: int, warmups: int = 2,
) -> tuple[Runs, float, float]:
    """``warmups`` untimed passes of every arm and batch size (compiles, caches the prompts, then
    compiles what a run with them cached plans), then ``repeats`` rounds of every batch size and arm,
    interleaved so that the machine's drift hits every arm alike. Returns the runs and the 1-minute
    load average before and after the timed part."""
    for _ in range(warmups):
        for llm in arms.values():
            for size in sizes:
                run_batches(llm, prompts, params, size)
    before = os.getloadavg()[0]
    runs: Runs = {(arm, size): [] for arm in arms for size in sizes}
    for _ in range(repeats):
        for size in sizes:
            for arm, llm in arms.items():
                runs[(arm, size)].append(run_batches(llm, prompts, params, size))
    return runs, before, os.getloadavg()[0]


def rate_ratio(runs: list, base: list) -> tuple[float, float, list[float]]:
    """Median output tok/s of ``runs`` and of ``base`` (``run_batches`` results of the same repeats),
    and the per-repeat ratios ``runs / base``."""
    rate, base_rate = ([n / s for s, n, _, _ in rs] for rs in (runs, base))
    return statistics.median(rate), statistics.median(base_rate), [x / y for x, y in zip(rate, base_rate)]
