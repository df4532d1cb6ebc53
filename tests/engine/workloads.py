"""Small seeded prompt sets for engine tests: long shared prefixes with short suffixes."""

from __future__ import annotations

import numpy as np


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
