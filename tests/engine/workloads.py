"""Small seeded prompt sets and the shared engine shapes of the engine tests.

Engine shapes are shared on purpose (``tests/README.md``): a step variant compiles once per cold
run (the persistent XLA cache) for every module that builds the same shape. ``SMALL`` is the shape
of the engine, reliability and runner tests; ``SMALL_FIXED`` is the same shape in the fixed bucket
mode (one step variant per engine: ``runner/shapes.py``), for tests whose subject is not bucketing;
``GUARDED`` is the shape whose every variant the compile guard compiles, for a test that needs rounds
of many shapes (fine buckets) of tiny-qwen3.5 late in a run."""

from __future__ import annotations

import numpy as np

SMALL = dict(max_num_seqs=4, max_num_batched_tokens=128, page_size=16, max_model_len=1024, warmup=False)
SMALL_FIXED = {**SMALL, "bucket_mode": "fixed"}
# the server's shape (tests/serve/server_proc.py's SMALL_ENGINE): tests/engine/test_compile_guard.py
# compiles every fine variant of it for tiny-qwen3.5 at warm-up, early in a run (conftest.HEAVY_FIRST)
GUARDED = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512, warmup=False)


def shared_prefix_prompts(
    num_prefixes: int, per_prefix: int, prefix_len: int, suffix_len: int, vocab: int, seed: int = 0
) -> list[list[int]]:
    """``num_prefixes`` groups of ``per_prefix`` prompts; group-interleaved order."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(3, vocab, prefix_len).tolist() for _ in range(num_prefixes)]
    prompts = []
    for j in range(per_prefix):
        for p in prefixes:
            prompts.append(p + rng.integers(3, vocab, suffix_len + j % 3).tolist())
    return prompts
