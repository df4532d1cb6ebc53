"""The prepared GPU check runs end to end on the CPU (``benchmarks/gpu_check.sh --dry-run``): the
smoke stage, then a row for every ceiling, kernel and step measurement, and no FAILED row, so the
script is known to work before a lent GPU's minutes are spent on it."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_dry_run_prints_every_row(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" not in proc.stdout
    rows = (tmp_path / "gpu_check.tsv").read_text().splitlines()
    names = [line.split("\t")[1] for line in rows]
    assert names == ["jax", "copy", "matmul_bf16", "host_to_device", "device_to_host",
                     "gated_delta_chunked", "ssd_chunked", "paged_attention",
                     "decode", "prefill", "decode_1_row"]  # fmt: skip
    kernels = [line for line in rows if line.startswith("kernels")]
    for line in kernels:  # interpret-mode Pallas against the float32 reference on bf16 inputs
        err = float(line.split("rel_err=")[1].split()[0])
        assert err < 1e-2, line
