"""The engine shape and compile cache the server tests start ``radixflow serve`` with."""

from __future__ import annotations

import functools
import os
import tempfile

from radixflow_jax.serve.launch import ServerProcess

# the same engine shape as tests/engine/test_background.py: its step variants are already in the
# persistent XLA cache of the test session when the suite runs in order
SMALL_ENGINE = ("--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--max-model-len", "512", "--no-warmup")
XLA_CACHE = os.environ.get("RADIXFLOW_TEST_XLA_CACHE") or os.path.join(tempfile.gettempdir(), "radixflow-xla-cache")

start_test_server = functools.partial(ServerProcess, compilation_cache_dir=XLA_CACHE)
