"""Starts ``radixflow serve`` as a subprocess on a free loopback port and waits for ``/health``
(tests, ``benchmarks/serve_load.py``). ``stop()`` drains it with SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Sequence

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(
        self,
        args: Sequence[str],
        *,
        api_key: str | None = None,
        startup_timeout: float = 300.0,
        compilation_cache_dir: str | None = None,
    ):
        self.port = free_port()
        self.api_key = api_key
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "radixflow_jax.cli", "serve", "--port", str(self.port), *args]
        if compilation_cache_dir:
            cmd += ["--compilation-cache-dir", compilation_cache_dir]
        if api_key:
            cmd += ["--api-key", api_key]
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above radixflow_jax/
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.log = tempfile.NamedTemporaryFile("w+", prefix="radixflow-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        log = self.output()
        self.stop()
        raise RuntimeError(f"server did not come up in {startup_timeout} s:\n{log}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def terminate(self) -> None:
        """Sends SIGTERM (the drain signal)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 60.0) -> int:
        self.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self.log.close()
            os.unlink(self.log.name)
