"""Test-wide settings: a persistent XLA compilation cache so engines that build the same step
variants (cache on/off, two policies) compile each one once per test session."""

from __future__ import annotations

import os
import tempfile

import jax

_CACHE_DIR = os.environ.get("RADIXFLOW_TEST_XLA_CACHE") or os.path.join(tempfile.gettempdir(), "radixflow-xla-cache")
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
