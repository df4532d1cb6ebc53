"""Test-wide settings: a persistent XLA compilation cache so engines that build the same step
variants (cache on/off, two policies) compile each one once per test session, and XLA:CPU compiles
at backend optimisation level 0 (about half the compile time of a step variant; the tiny test
models spend almost nothing running). ``RADIXFLOW_TEST_XLA_OPT=1`` keeps XLA's default level."""

from __future__ import annotations

import os
import tempfile

_flags = os.environ.get("XLA_FLAGS", "")
if os.environ.get("RADIXFLOW_TEST_XLA_OPT") != "1" and "xla_backend_optimization_level" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_backend_optimization_level=0".strip()  # read at backend start

import jax  # noqa: E402

_CACHE_DIR = os.environ.get("RADIXFLOW_TEST_XLA_CACHE") or os.path.join(tempfile.gettempdir(), "radixflow-xla-cache")
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
