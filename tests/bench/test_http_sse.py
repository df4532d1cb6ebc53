"""``radixflow bench --url`` reads a stream by the SSE format: comment lines (``:``, llama-server's
keep-alives), other fields and ``data:`` without a space are valid and must not fail a request."""

from __future__ import annotations

import asyncio
import json

import httpx
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from radixflow_jax.bench.http import sse_data, stream_completion


def test_sse_data_takes_only_data_fields() -> None:
    assert sse_data("data: {}") == "{}"
    assert sse_data("data:{}") == "{}"
    assert sse_data("data:  x") == " x"  # only the one space after the colon is dropped
    for other in (": keep-alive", ":", "event: completion", "id: 7", "retry: 100", "data", ""):
        assert sse_data(other) is None


def _app(lines: list[str]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions() -> StreamingResponse:
        return StreamingResponse(iter(line + "\n" for line in lines), media_type="text/event-stream")

    return app


def _run(lines: list[str]):
    async def go():
        transport = httpx.ASGITransport(app=_app(lines))
        async with httpx.AsyncClient(transport=transport, base_url="http://peer") as client:
            return await stream_completion(client, {"prompt": [1, 2], "max_tokens": 2, "stream": True})

    return asyncio.run(go())


def test_a_stream_with_comments_and_fields_completes() -> None:
    chunk = {"choices": [{"text": "a", "finish_reason": None}]}
    last = {"choices": [{"text": "b", "finish_reason": "length"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2}}
    res = _run([": ping", "", "event: completion", f"data: {json.dumps(chunk)}", "", ":", f"data:{json.dumps(last)}",
                "", f"data: {json.dumps(usage)}", "", "data: [DONE]", "", ": bye"])  # fmt: skip
    assert res.error is None and res.complete
    assert res.text == "ab" and res.output_tokens == 2 and res.finish_reason == "length"


def test_data_after_done_is_an_error() -> None:
    res = _run(["data: [DONE]", 'data: {"choices": []}'])
    assert res.error is not None and "after [DONE]" in res.error and not res.complete
