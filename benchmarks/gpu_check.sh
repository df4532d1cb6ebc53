#!/usr/bin/env bash
# The prepared GPU check (issue 35 part 2): about 5 minutes on one H200, one row per measurement
# printed as soon as it is measured (and appended to $OUT/gpu_check.tsv when OUT is set).
#   bash benchmarks/gpu_check.sh             # on the GPU machine, from the repository root
#   bash benchmarks/gpu_check.sh --dry-run   # the same stages on this CPU at toy sizes
# Runs from the source tree (no install: the GPU machine has no package index) and imports only
# kernels/, models/ and runner/. A stage that fails prints a FAILED row and the next one runs;
# the whole check stops after 9 minutes with the rows it has.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DRY=()
if [[ "${1:-}" == "--dry-run" ]]; then
  DRY=(--dry-run); export JAX_PLATFORMS=cpu
fi
PY="${PYTHON:-python3}"
# stage 0: the jax version and devices (Python 3.12 / jax 0.11.x there, 3.11 / 0.10.x here)
timeout 120 "$PY" - <<'PYEOF' || { echo "smoke test failed: jax does not run here"; exit 1; }
import sys, jax, jax.numpy as jnp
major, minor = (int(x) for x in jax.__version__.split(".")[:2])
print(f"python {sys.version.split()[0]}  jax {jax.__version__}  backend {jax.default_backend()}  devices {jax.devices()}")
assert (major, minor) >= (0, 10), f"jax {jax.__version__} is older than the 0.10 this project supports"
x = jnp.arange(64.0)
assert float((x @ x)) == float(sum(i * i for i in range(64))), "a device dot product is wrong"
import flax  # the models need flax.nnx
print(f"flax {flax.__version__}")
PYEOF
# the stages in one process (the measured ceilings feed the later rows); a failing stage prints a
# FAILED row and the next one runs
timeout 540 "$PY" benchmarks/gpu_check.py "${DRY[@]}" --stages ceilings,kernels,step
