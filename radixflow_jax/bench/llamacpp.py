"""llama.cpp as a peer: its build from the ``llama-cpp-python`` sdist, its converter, its quantiser
and its server as a child process (``benchmarks/vs_llamacpp.py`` and ``gguf_layout_check.py``).

Invariants:
  * Nothing is downloaded but the sdist itself (``pip download --no-deps --no-binary :all:``); the
    vendored tree is extracted once to ``$RADIXFLOW_CACHE/llamacpp/<version>/src`` and built with
    cmake + ninja into ``.../build`` (the recipe of ../shared/REFERENCES.md section 8). A finished
    build is reused; a build is finished when every wanted binary exists.
  * The converter runs unmodified, through a wrapper that patches three things only in its own
    process (the BPE pre-tokenizer name, the missing ``tokenizer.model``, Nemotron-H's raw config):
    the tiny presets' tokenizer is not one the converter knows by hash.
  * A :class:`ChildServer` is started and stopped by its context manager; on exit the child and
    its log file are gone whatever happened inside.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from typing import Any, Callable, Sequence

from radixflow_jax.paths import cache_root

VERSION = "0.3.36"
VENDOR = "vendor/llama.cpp"
TARGETS = ("llama-server", "llama-quantize")
# not GGML_NATIVE: on a CPU that reports AMX, the native build died with SIGILL on Q8_0 files
# (2026-12-02, Intel Xeon); the ISA extensions are turned on one by one from what the CPU reports
# (cpu_isa_flags) and AMX stays off
BASE_CMAKE_FLAGS = (
    "-G",
    "Ninja",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
)
# ggml's CMake option -> the /proc/cpuinfo flag that must be present for it
ISA_OPTIONS = (
    ("GGML_AVX", "avx"),
    ("GGML_AVX2", "avx2"),
    ("GGML_FMA", "fma"),
    ("GGML_F16C", "f16c"),
    ("GGML_BMI2", "bmi2"),
    ("GGML_AVX512", "avx512f"),
    ("GGML_AVX512_VBMI", "avx512vbmi"),
    ("GGML_AVX512_VNNI", "avx512_vnni"),
    ("GGML_AVX512_BF16", "avx512_bf16"),
    ("GGML_AVX_VNNI", "avx_vnni"),
)


def cpu_isa_flags(cpuinfo: str | None = None) -> tuple[str, ...]:
    """``-DGGML_<ISA>=ON|OFF`` for each of :data:`ISA_OPTIONS`, ON exactly when the CPU's ``flags``
    line (``/proc/cpuinfo``, or ``cpuinfo`` as given) names the extension. Where no flags line can be
    read (not Linux x86), every option is OFF except what ggml turns on by itself."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith("flags")), "")
    have = set(line.partition(":")[2].split())
    return tuple(f"-D{opt}={'ON' if flag in have else 'OFF'}" for opt, flag in ISA_OPTIONS)


# the architectures whose conversion asserts MTP layers unless told there are none
_NO_MTP = ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM")

CONVERTER_WRAPPER = """
import json, pathlib, runpy, sys
root = sys.argv[1]
sys.path.insert(0, root)
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
def _no_sentencepiece(self):
    raise FileNotFoundError("no tokenizer.model")
base.TextModel._create_vocab_sentencepiece = _no_sentencepiece
config = json.loads((pathlib.Path(sys.argv[2]) / "config.json").read_text())
if config.get("architectures") == ["NemotronHForCausalLM"]:
    def _raw_config(dir_model, is_mistral_format):
        cfg = json.loads((pathlib.Path(dir_model) / "config.json").read_text())
        cfg.setdefault("num_hidden_layers", len(cfg["hybrid_override_pattern"]))
        return cfg
    base.ModelBase.load_hparams = staticmethod(_raw_config)
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(root + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def home(version: str = VERSION) -> str:
    """``$RADIXFLOW_CACHE/llamacpp/<version>``: ``src/`` (the vendored tree), ``build/``, logs."""
    return os.path.join(cache_root(), "llamacpp", version)


def binary(name: str, version: str = VERSION) -> str:
    return os.path.join(home(version), "build", "bin", name)


def fetch_sdist(directory: str, version: str = VERSION) -> str:
    """The sdist in ``directory``, downloaded there by pip when it is missing."""
    path = os.path.join(directory, f"llama_cpp_python-{version}.tar.gz")
    if not os.path.exists(path):
        os.makedirs(directory, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"llama-cpp-python=={version}",
            "-d",
            directory,
        ]
        subprocess.run(cmd, check=True)
    return path


def extract(sdist: str, dest: str, only: Sequence[str] = ()) -> str:
    """Extracts the sdist's vendored llama.cpp to ``dest`` (``only``: just these paths inside it,
    e.g. the converter) unless it is there; returns ``dest``."""
    marker = os.path.join(dest, only[0] if only else "CMakeLists.txt")
    if os.path.exists(marker):
        return dest
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        prefix = f"{top}/{VENDOR}/"
        members = []
        for m in tar.getmembers():
            if m.name.startswith(prefix) and (not only or m.name[len(prefix):].startswith(tuple(only))):
                m.name = m.name[len(prefix):]
                members.append(m)
        tar.extractall(dest, members=members, filter="data")
    return dest


_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")


def build(sdist: str, *, jobs: int = 2, version: str = VERSION, log: Callable[[str], None] = print) -> dict[str, str]:
    """Builds :data:`TARGETS` once; returns ``{target: path}``. Progress (ninja's ``[k/n]``) is
    logged every 10 %; the full output goes to ``build.log`` beside the tree, and a failure raises
    with its tail."""
    paths = {t: binary(t, version) for t in TARGETS}
    if all(os.path.exists(p) for p in paths.values()):
        return paths
    root = home(version)
    src = extract(sdist, os.path.join(root, "src"))
    out = os.path.join(root, "build")
    logfile = os.path.join(root, "build.log")
    started = time.perf_counter()
    with open(logfile, "w") as f:
        for cmd in (
            ["cmake", "-S", src, "-B", out, *BASE_CMAKE_FLAGS, *cpu_isa_flags()],
            ["cmake", "--build", out, f"-j{jobs}", "--target", *TARGETS],
        ):
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            shown = -1
            assert proc.stdout is not None
            for line in proc.stdout:
                f.write(line)
                m = _PROGRESS.match(line)
                if m and int(m.group(1)) * 10 // int(m.group(2)) > shown:
                    shown = int(m.group(1)) * 10 // int(m.group(2))
                    log(f"llama.cpp build: step {m.group(1)}/{m.group(2)} after {time.perf_counter() - started:.0f} s")
            if proc.wait() != 0:
                f.flush()
                with open(logfile) as g:
                    raise RuntimeError(f"llama.cpp build failed ({' '.join(cmd[:3])}):\n{g.read()[-3000:]}")
    log(f"llama.cpp built in {time.perf_counter() - started:.0f} s: {out}/bin")
    return paths


def _has_mtp(model_dir: str) -> bool:
    from radixflow_jax.models.mtp import mtp_layer_count
    from radixflow_jax.models.safetensors_io import SafetensorsDir

    return mtp_layer_count(SafetensorsDir(model_dir)) > 0


def convert(src: str, model_dir: str, out: str, outtype: str = "f32") -> str:
    """``model_dir`` (a HF directory) converted by llama.cpp's own ``convert_hf_to_gguf.py`` (the
    wrapper of the module docstring) to ``out``; returns ``out``. Skipped when ``out`` exists; ``out``
    appears only once the converter has finished (it writes ``out.part``, then renames it)."""
    if os.path.exists(out):
        return out
    with open(os.path.join(model_dir, "config.json")) as f:
        architectures = json.load(f).get("architectures") or []
    part = out + ".part"  # renamed when complete: an interrupted run never leaves a truncated ``out``
    args = [sys.executable, "-c", CONVERTER_WRAPPER, src, model_dir, "--outtype", outtype, "--outfile", part]
    if set(architectures) & set(_NO_MTP) and not _has_mtp(model_dir):
        args.append("--no-mtp")  # its MTP export needs MTP tensors (models/mtp.py)
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama.cpp's converter failed on {model_dir}:\n{proc.stderr[-3000:]}")
    os.replace(part, out)
    return out


def quantize(quantizer: str, src: str, out: str, qtype: str) -> str:
    """``llama-quantize src out qtype`` unless ``out`` exists (written whole or not at all); returns ``out``."""
    if not os.path.exists(out):
        part = out + ".part"
        proc = subprocess.run([quantizer, src, part, qtype], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"llama-quantize {qtype} failed on {src}:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        os.replace(part, out)
    return out


class ChildServer:
    """A server child process (llama-server, or our own server in a head to head) on
    ``127.0.0.1:port``: started by ``__enter__``, which waits until ``ready(health_json)`` holds for
    ``GET /health`` (or raises with the log's tail when the child exits or ``timeout`` passes);
    stopped by ``__exit__`` (SIGTERM, then SIGKILL after 20 s)."""

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        port: int,
        log_path: str,
        *,
        timeout: float = 1800.0,
        ready: Callable[[dict[str, Any]], bool] = lambda h: True,
        env: dict[str, str] | None = None,
    ):
        self.name, self.cmd, self.port, self.log_path = name, list(cmd), port, log_path
        self.timeout, self.ready, self.env = timeout, ready, env
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s = 0.0

    def __enter__(self) -> ChildServer:
        import httpx

        start = time.perf_counter()
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.perf_counter() - start > self.timeout:
                self.__exit__(None, None, None)
                raise TimeoutError(f"{self.name} not ready after {self.timeout:.0f} s:\n{self.log_tail()}")
            try:
                r = httpx.get(self.url + "/health", timeout=5.0)
                if r.status_code == 200 and self.ready(r.json()):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        self.startup_s = time.perf_counter() - start
        return self

    def log_tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def llama_server_cmd(
    server: str, model: str, port: int, *, slots: int, ctx: int, threads: int, extra: Sequence[str] = ()
) -> list[str]:
    """llama-server on one GGUF file: ``slots`` parallel sequences sharing ``ctx`` tokens of KV,
    ``threads`` for both generation and prompt batches."""
    return [
        server,
        "-m",
        model,
        "-np",
        str(slots),
        "-c",
        str(ctx),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-webui",
        *extra,
    ]
