"""Where RadixFlow keeps files between runs (no JAX import: the CLI and the simulator use it).

``$RADIXFLOW_CACHE`` (default ``~/.cache/radixflow``) holds ``presets/`` (the tiny models written
as HF directories) and ``xla/`` (compiled step variants, the persistent XLA cache).
"""

from __future__ import annotations

import os


def cache_root() -> str:
    return os.environ.get("RADIXFLOW_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "radixflow"))


def xla_cache_dir() -> str:
    """Where compiled step variants persist across processes."""
    return os.path.join(cache_root(), "xla")
