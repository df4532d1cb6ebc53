"""``radixflow bench --url``: a workload sent to a running server over HTTP with streaming.

Each request is a streamed ``/v1/completions`` call with token-id prompts, ``ignore_eos`` and
``stream_options.include_usage``, sent at its workload arrival time (optionally under a concurrency
cap). Reported as ``vllm bench serve`` does: request and token throughput, and mean / median / p99
of TTFT, TPOT ``(latency - ttft) / (output_tokens - 1)``, ITL (gaps between streamed chunks) and
end-to-end latency; plus the prefix-cache hit rate from ``usage.prompt_tokens_details``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import numpy as np

from radixflow_jax.bench.workloads import BenchRequest

T = TypeVar("T")


@dataclasses.dataclass
class HttpResult:
    """One request as the client saw it. ``complete``: a well-formed stream that ended with a
    finish reason, a usage chunk and ``[DONE]``; ``dropped``: the client hung up on purpose."""

    status: int
    ttft: float | None = None
    latency: float | None = None
    itl: list[float] = dataclasses.field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    complete: bool = False
    dropped: bool = False
    error: str | None = None
    text: str = ""
    timings: dict[str, float] | None = None  # llama-server's per-request ``timings`` object, when sent


def sse_data(line: str) -> str | None:
    """The payload of an SSE ``data`` field line, or None for any other line the event-stream format
    allows (a ``:`` comment such as llama-server's keep-alives, an ``event``/``id``/``retry`` field,
    a field name alone). ``data:`` may or may not be followed by one space, which is not part of the
    payload."""
    name, sep, value = line.partition(":")
    if name != "data" or not sep:
        return None
    return value[1:] if value.startswith(" ") else value


async def stream_completion(client: Any, body: dict[str, Any], *, drop_after: int | None = None) -> HttpResult:
    """Sends one streamed completion; ``drop_after``: disconnect after that many data chunks. An
    HTTP error before the response starts propagates; one after it is the result's ``error``."""
    import httpx

    start = time.perf_counter()
    last = start
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")
            return HttpResult(r.status_code, error=text[:500])
        res, chunks, done = HttpResult(200), 0, False
        try:  # an error mid-stream ends this request (it is not sent again: the server has it)
            async for line in r.aiter_lines():
                data = sse_data(line)
                if data is None:
                    continue
                if done:
                    res.error = f"data after [DONE]: {line[:80]!r}"
                    return res
                if data == "[DONE]":
                    done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    res.error = event["error"].get("message")
                    return res
                now = time.perf_counter()
                if event.get("choices"):
                    if res.ttft is None:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
                    res.finish_reason = event["choices"][0].get("finish_reason") or res.finish_reason
                    res.text += event["choices"][0].get("text") or ""
                if isinstance(event.get("timings"), dict):
                    res.timings = event["timings"]
                if event.get("usage"):
                    u = event["usage"]
                    res.prompt_tokens, res.output_tokens = u["prompt_tokens"], u["completion_tokens"]
                    res.cached_tokens = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                chunks += 1
                if drop_after is not None and chunks >= drop_after:
                    res.dropped = True
                    return res
        except httpx.HTTPError as exc:
            res.error = f"{type(exc).__name__} mid-stream: {exc}"
            return res
        res.latency = time.perf_counter() - start
        res.complete = done and res.finish_reason is not None and res.output_tokens > 0
        return res


def request_body(model: str | None, req: BenchRequest, history: Sequence[int] = ()) -> dict[str, Any]:
    body = {
        "prompt": list(history) + list(req.prompt),
        "max_tokens": req.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    return body


async def run_requests(
    url: str, requests: Sequence[BenchRequest], *, model: str | None = None, api_key: str | None = None,
    concurrency: int | None = None, drop_every: int = 0, drop_after: int = 2, timeout: float = 600.0,
) -> tuple[list[HttpResult], float]:
    """Sends every request at its arrival time; returns the results (in request order) and the wall
    time. ``drop_every = k > 0``: every k-th client disconnects after ``drop_after`` chunks.
    Multi-turn conversations (``turn > 0``) go after the previous turn finished, with the previous
    prompt and the answer (re-tokenised by the server's ``/tokenize``) in front of their text."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max(len(requests), 1), max_keepalive_connections=max(len(requests), 1))
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout, limits=limits) as client:
        start = time.perf_counter()

        async def stale_retry(call: Callable[[], Awaitable[T]]) -> T:
            """``call()``, once more when a kept-alive connection turned out closed before any answer
            (llama-server closes idle ones after 5 s; the request never reached it)."""
            try:
                return await call()
            except httpx.RemoteProtocolError:
                return await call()

        async def send(i: int, req: BenchRequest, history: Sequence[int]) -> HttpResult:
            drop = drop_after if drop_every and i % drop_every == drop_every - 1 else None
            body = request_body(model, req, history)
            try:
                if sem is None:
                    return await stale_retry(lambda: stream_completion(client, body, drop_after=drop))
                async with sem:
                    return await stale_retry(lambda: stream_completion(client, body, drop_after=drop))
            except httpx.HTTPError as exc:
                return HttpResult(0, error=f"{type(exc).__name__}: {exc}")

        async def tokens_of(text: str) -> list[int] | None:
            """The server's ids of ``text`` (vLLM's and ours read "prompt", llama-server's "content")."""
            try:
                r = await stale_retry(lambda: client.post("/tokenize", json={"prompt": text, "content": text}))
                return list(r.json()["tokens"]) if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError, KeyError):
                return None

        follow: dict[int, list[tuple[int, BenchRequest]]] = {}
        for i, r in enumerate(requests):
            if r.turn > 0:
                follow.setdefault(r.group, []).append((i, r))
        results: list[HttpResult | None] = [None] * len(requests)

        async def conversation(i: int, req: BenchRequest) -> None:
            delay = req.arrival_s - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            results[i] = res = await send(i, req, ())
            history = list(req.prompt)
            for j, nxt in sorted(follow.get(req.group, []) if req.turn == 0 else [], key=lambda x: x[1].turn):
                if not res.complete:  # the conversation stops with a failed or dropped turn
                    break
                answer = await tokens_of(res.text) if res.text else []
                if answer is None:  # the answer could not be re-tokenised: the conversation stops
                    break
                history += answer
                results[j] = res = await send(j, nxt, history)
                history += list(nxt.prompt)

        await asyncio.gather(*(conversation(i, r) for i, r in enumerate(requests) if r.turn == 0))
        done = [r if r is not None else HttpResult(0, error="not sent: an earlier turn failed") for r in results]
        return done, time.perf_counter() - start


def _stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    a = np.asarray(values, float) * 1000.0
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p99": float(np.percentile(a, 99))}


def summarize(results: Sequence[HttpResult], wall_s: float) -> dict[str, Any]:
    """``vllm bench serve``'s report (times in ms) over completed requests, plus the cache hit rate."""
    ok = [r for r in results if r.complete]
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1 and r.ttft is not None]
    return {
        "completed": len(ok),
        "failed": sum(1 for r in results if not r.complete and not r.dropped),
        "dropped": sum(1 for r in results if r.dropped),
        "status_5xx": sum(1 for r in results if r.status >= 500),
        "duration_s": wall_s,
        "request_throughput": len(ok) / wall_s if wall_s else 0.0,
        "output_throughput": out_tokens / wall_s if wall_s else 0.0,
        "total_token_throughput": (out_tokens + prompt_tokens) / wall_s if wall_s else 0.0,
        "ttft_ms": _stats([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": _stats(tpot),
        "itl_ms": _stats([g for r in ok for g in r.itl]),
        "e2el_ms": _stats([r.latency for r in ok if r.latency is not None]),
        "cache_hit_rate": sum(r.cached_tokens for r in ok) / prompt_tokens if prompt_tokens else 0.0,
        "prompt_tokens": prompt_tokens,
        "output_tokens": out_tokens,
    }


def format_report(s: dict[str, Any]) -> str:
    lines = [
        f"completed {s['completed']}  failed {s['failed']}  dropped {s['dropped']}  5xx {s['status_5xx']}  "
        f"duration {s['duration_s']:.2f} s",
        f"request throughput {s['request_throughput']:.2f} req/s   output {s['output_throughput']:.1f} tok/s   "
        f"total {s['total_token_throughput']:.1f} tok/s   cache hit rate {s['cache_hit_rate']:.1%}",
        f"{'ms':>6} {'mean':>10} {'median':>10} {'p99':>10}",
    ]
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2E")):
        v = s[key]
        lines.append(f"{name:>6} {v['mean']:10.1f} {v['median']:10.1f} {v['p99']:10.1f}")
    return "\n".join(lines)


def run_url(args: argparse.Namespace, requests: list[BenchRequest]) -> int:
    """The ``radixflow bench --url`` entry point (requests already generated from the workload)."""
    try:
        import httpx  # noqa: F401  (the test extra installs it)
    except ImportError:
        raise ValueError("radixflow bench --url needs httpx: pip install httpx") from None
    results, wall = asyncio.run(
        run_requests(
            args.url.rstrip("/"),
            requests,
            model=args.served_model_name,
            api_key=args.api_key,
            concurrency=args.concurrency,
        )
    )
    summary = summarize(results, wall)
    print(format_report(summary))
    errors = [r.error for r in results if r.error]
    if errors:
        print(f"first error: {errors[0]}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"url": args.url, "workload": args.workload, "num_requests": len(requests), **summary}, f, indent=2)
    return 0 if summary["failed"] == 0 else 1
