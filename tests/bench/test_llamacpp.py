"""The llama.cpp peer's plumbing without building llama.cpp: extraction from the sdist, the
reuse of a finished build, the server command, a child server's start-up failure, and the HTTP
driver against a llama-server-like peer (``/tokenize`` reading ``content``, stale keep-alives)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import tarfile

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from radixflow_jax.bench import llamacpp
from radixflow_jax.bench.http import run_requests
from radixflow_jax.bench.workloads import BenchRequest


def _sdist(path: str) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in (("vendor/llama.cpp/convert_hf_to_gguf.py", "print(1)\n"),
                           ("vendor/llama.cpp/CMakeLists.txt", "project(x)\n"),
                           ("vendor/llama.cpp/conversion/base.py", "X = 1\n"),
                           ("llama_cpp/__init__.py", "")):  # fmt: skip
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-0.3.36/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_extract_takes_the_vendored_tree_or_only_the_named_parts(tmp_path) -> None:
    sdist = _sdist(str(tmp_path / "s.tar.gz"))
    whole = llamacpp.extract(sdist, str(tmp_path / "whole"))
    assert sorted(os.listdir(whole)) == ["CMakeLists.txt", "conversion", "convert_hf_to_gguf.py"]
    part = llamacpp.extract(sdist, str(tmp_path / "part"), only=("convert_hf_to_gguf.py", "conversion/"))
    assert sorted(os.listdir(part)) == ["conversion", "convert_hf_to_gguf.py"]
    os.remove(sdist)  # extracted once: a second call does not open the sdist
    assert llamacpp.extract(sdist, str(tmp_path / "part"), only=("convert_hf_to_gguf.py",)) == part


def test_a_finished_build_is_reused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path))
    for t in llamacpp.TARGETS:
        os.makedirs(os.path.dirname(llamacpp.binary(t)), exist_ok=True)
        open(llamacpp.binary(t), "w").close()
    logged: list[str] = []
    paths = llamacpp.build("/no/such/sdist.tar.gz", log=logged.append)
    assert paths == {t: os.path.join(str(tmp_path), "llamacpp", llamacpp.VERSION, "build", "bin", t) for t in llamacpp.TARGETS}
    assert logged == []


def test_the_build_turns_on_only_the_isa_extensions_the_cpu_reports() -> None:
    avx2_only = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c bmi2 amx_tile amx_int8\n"
    flags = dict(f[2:].split("=") for f in llamacpp.cpu_isa_flags(avx2_only))
    assert {k for k, v in flags.items() if v == "ON"} == {"GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"}
    assert flags["GGML_AVX512"] == "OFF" and flags["GGML_AVX512_VNNI"] == "OFF"  # would be SIGILL on this CPU
    assert all(v == "OFF" for v in dict(f[2:].split("=") for f in llamacpp.cpu_isa_flags("no flags line")).values())
    assert "-DGGML_AMX_INT8=OFF" in llamacpp.BASE_CMAKE_FLAGS and "-DGGML_NATIVE=OFF" in llamacpp.BASE_CMAKE_FLAGS


def test_the_server_command_states_slots_context_and_threads() -> None:
    cmd = llamacpp.llama_server_cmd("/bin/llama-server", "m.gguf", 9000, slots=8, ctx=16384, threads=2, extra=["-ub", "64"])
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert flags["-m"] == "m.gguf" and flags["-np"] == "8" and flags["-c"] == "16384"
    assert flags["-t"] == flags["-tb"] == "2" and flags["--port"] == "9000" and cmd[-2:] == ["-ub", "64"]


def test_a_server_that_exits_at_start_up_raises_with_its_log(tmp_path) -> None:
    cmd = [sys.executable, "-c", "print('cannot load the model'); raise SystemExit(3)"]
    with pytest.raises(RuntimeError, match="(?s)exited with 3:.*cannot load the model"):
        with llamacpp.ChildServer("peer", cmd, 1, str(tmp_path / "log")):
            pass


def _llama_like_peer() -> tuple[FastAPI, list[dict]]:
    """A peer that streams two tokens, tokenizes ``content`` one id per character, and drops the
    first /tokenize connection as a server closing an idle keep-alive does."""
    app, seen = FastAPI(), []
    dropped = [False]

    @app.post("/v1/completions")
    async def completions(request: Request) -> StreamingResponse:
        body = await request.json()
        seen.append(body)
        events = [{"choices": [{"text": "ab", "finish_reason": None}]},
                  {"choices": [{"text": "", "finish_reason": "length"}]},
                  {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 2},
                   "timings": {"prompt_n": 3, "prompt_ms": 1.5}}]  # fmt: skip
        lines = [f"data: {json.dumps(e)}\n\n" for e in events] + [": keep-alive\n\n", "data: [DONE]\n\n"]
        return StreamingResponse(iter(lines), media_type="text/event-stream")

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        body = await request.json()
        if not dropped[0]:
            dropped[0] = True
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return {"tokens": [ord(c) for c in body["content"]]}

    return app, seen


def test_a_conversation_against_a_llama_server_like_peer(monkeypatch) -> None:
    app, seen = _llama_like_peer()
    real = httpx.AsyncClient

    def client(**kw):
        kw.pop("limits", None)
        return real(transport=httpx.ASGITransport(app=app, raise_app_exceptions=True), **kw)

    monkeypatch.setattr(httpx, "AsyncClient", client)
    turns = [BenchRequest((5, 6), 2, group=0, turn=0), BenchRequest((7,), 2, group=0, turn=1)]
    results, _ = asyncio.run(run_requests("http://peer", turns))
    assert all(r.complete for r in results), [r.error for r in results]
    assert seen[1]["prompt"] == [5, 6, ord("a"), ord("b"), 7]  # the answer re-tokenised by the peer's content key
    assert results[0].timings == {"prompt_n": 3, "prompt_ms": 1.5}
