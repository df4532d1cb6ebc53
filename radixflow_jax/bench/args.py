"""The shared-prefix workload of the benchmark scripts and its command-line flags.

``benchmarks/vs_transformers.py`` and the ``tools/perf`` scripts that replay its workload
(``overlap``, ``padding``, ``pairing_prep``, ``round_ablation``, ``round_profile``) take the same
five flags; :func:`add_workload_args` adds them to a parser and :func:`workload_from_args` reads them
back over a script's own defaults. No JAX here: ``--help`` stays instant.

A workload is ``requests`` prompts over ``prefixes`` shared prefixes: request ``i`` is prefix
``i % prefixes`` (``prefix_len`` ids) followed by ``suffix_len`` ids of its own, and generates
``output_len`` tokens (greedy, EOS ignored, so the rounds do not depend on the sampled ids).
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class PrefixWorkload:
    """A shared-prefix workload. Invariant: every field is a non-negative count; ``prompts`` of one
    workload and vocabulary are the same on every call (seeded by ``seed``)."""

    requests: int = 64
    prefixes: int = 8
    prefix_len: int = 256
    suffix_len: int = 32
    output_len: int = 32
    seed: int = 0

    @property
    def prompt_len(self) -> int:
        return self.prefix_len + self.suffix_len

    @property
    def max_len(self) -> int:
        """Prompt plus output tokens: the longest sequence a request reaches."""
        return self.prompt_len + self.output_len

    def prompts(self, vocab: int) -> list[list[int]]:
        """Random ids in ``[1, vocab)`` (0 stays free as a padding id): ``prefixes`` drawn first, then
        every request's suffix, from one generator seeded by ``seed``."""
        rng = np.random.default_rng(self.seed)
        prefixes = rng.integers(1, vocab, size=(self.prefixes, self.prefix_len)).tolist()
        suffixes = rng.integers(1, vocab, size=(self.requests, self.suffix_len)).tolist()
        return [prefixes[i % self.prefixes] + suffixes[i] for i in range(self.requests)]


_COUNTS = ("requests", "prefixes", "prefix_len", "suffix_len", "output_len")
_HELP = {
    "requests": "prompts in the workload",
    "prefixes": "shared prefixes (request i uses prefix i %% prefixes)",
    "prefix_len": "ids per shared prefix",
    "suffix_len": "ids of each request's own after its prefix",
    "output_len": "output tokens per request",
}


def add_workload_args(
    parser: argparse.ArgumentParser,
    defaults: PrefixWorkload = PrefixWorkload(),
    quick: PrefixWorkload | None = None,
    *,
    seed: bool = True,
) -> None:
    """Adds ``--requests --prefixes --prefix-len --suffix-len --output-len`` (and ``--seed`` unless
    ``seed=False``, for a script whose prompts are not random), defaulting to ``defaults``. With a
    ``quick`` workload (a script's ``--quick``) the counts parse to ``None`` when not given instead,
    so :func:`workload_from_args` fills them from whichever base the script picks."""
    group = parser.add_argument_group("workload")
    for name in _COUNTS:
        hint = f"default {getattr(defaults, name)}"
        if quick is not None:
            hint += f", {getattr(quick, name)} with --quick"
        default = None if quick is not None else getattr(defaults, name)
        group.add_argument("--" + name.replace("_", "-"), type=int, default=default, help=f"{_HELP[name]} ({hint})")
    if seed:
        group.add_argument("--seed", type=int, default=defaults.seed, help=f"random seed (default {defaults.seed})")


def workload_from_args(args: argparse.Namespace, base: PrefixWorkload = PrefixWorkload()) -> PrefixWorkload:
    """``base`` with every count given on the command line (and ``--seed``, when the parser has it)."""
    given = {name: getattr(args, name) for name in _COUNTS if getattr(args, name, None) is not None}
    if getattr(args, "seed", None) is not None:
        given["seed"] = args.seed
    return dataclasses.replace(base, **given)
