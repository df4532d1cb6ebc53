"""``n`` samples and ``best_of`` candidates of one prompt as sibling requests.

A request whose :class:`SamplingParams` ask for more than one sample (``n > 1`` or ``best_of``)
runs as ``num_samples`` sibling requests of the same prompt (``EngineCore.add_group``). The
siblings are queued together on one engine, so the prompt is computed once: the first sibling to
run computes it, and the others ride the round that completes it (``scheduler/riders.py``): each
samples its first token from the same last-position logits with its own seed, takes the end state
and the prompt's pages, and computes none of the prompt (``cached_tokens`` is the prompt length).

Invariants:
  * :func:`expand` gives every sibling ``n == 1`` and no ``best_of``; sibling ``i`` has ``seed + i``
    when a seed is given (else the engine's per-request default seed, which differs per request id).
  * Ranked groups (``best_of > n``) need each candidate's cumulative logprob, so a candidate asks for
    logprobs (0 alternatives) even when the caller did not; :func:`choose` strips them again.
  * :func:`choose` returns ``n`` outputs: the best by cumulative logprob (best first, ties by
    index) when ranked, else every sample in index order; each carries its ``index`` in the result.
No JAX here.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from radixflow_jax.engine.params import RequestOutput, SamplingParams


@dataclasses.dataclass(frozen=True)
class SampleGroup:
    """What one request with ``num_samples > 1`` runs as: the members' params (index order), how
    many outputs it returns (``n``), and whether candidates are ranked (``best_of > n``)."""

    members: tuple[SamplingParams, ...]
    n: int
    ranked: bool
    strip_logprobs: bool  # logprobs were turned on for ranking only


def is_group(params: SamplingParams) -> bool:
    """True when ``params`` ask for more than one sample or for ranked candidates."""
    return params.num_samples > 1


def expand(params: SamplingParams) -> SampleGroup:
    """The sibling params of ``params`` (see the module docstring)."""
    ranked = params.best_of is not None and params.best_of > params.n
    strip = ranked and params.logprobs is None
    members = []
    for i in range(params.num_samples):
        seed = None if params.seed is None else params.seed + i
        logprobs = 0 if strip else params.logprobs
        members.append(dataclasses.replace(params, n=1, best_of=None, seed=seed, logprobs=logprobs))
    return SampleGroup(tuple(members), params.n, ranked, strip)


def choose(group: SampleGroup, outputs: Sequence[RequestOutput]) -> list[RequestOutput]:
    """The ``n`` outputs of the group (copies; ``index`` set to their place in the result)."""
    if len(outputs) != len(group.members):
        raise ValueError(f"{len(outputs)} outputs for a group of {len(group.members)}")
    order = list(range(len(outputs)))
    if group.ranked:
        order.sort(key=lambda i: (-_score(outputs[i]), i))
    chosen = []
    for place, i in enumerate(order[: group.n]):
        out = dataclasses.replace(outputs[i], index=place)
        if group.strip_logprobs:
            out.logprobs = None
        chosen.append(out)
    return chosen


def _score(out: RequestOutput) -> float:
    score = out.cumulative_logprob
    return float("-inf") if score is None else score
