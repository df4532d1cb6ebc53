"""The admission core's vocabulary: decisions, policies and queue orders (docs/design.md, "Scheduling").

For each waiting request, in queue order, the core answers one :class:`Decision`. The policies
differ in two places. First, the answer for a *consumer* (a request whose best prefix match ends
at a checkpoint another request is still producing): ``native`` ends the scan there (vLLM's
same-step deferral, SGLang's ``break``), ``radixflow`` lets only that request wait and keeps
scanning (the paper's traversal, unchanged), ``pair`` (beyond the paper) admits that consumer into
the producer's own round when the producer writes the checkpoint in the round being planned, and
waits like ``radixflow`` otherwise. Second, the *fill* (requests scanned after such a consumer,
which native would not admit this round): ``pair`` admits a fill only when the round-cost
estimator says it pays (``scheduler/pairing.Pairing.fill_pays``), the others always.
``pair``'s two parts also run alone, under fixed names, for ablation: ``pair-nofill`` (pairing,
every fill admitted) and ``radixflow-fill`` (radixflow's waiting consumer plus the fill rule).
Everything else is the same code.
"""

from __future__ import annotations

import dataclasses
import enum


class Decision(enum.Enum):
    ADMIT = "admit"
    WAIT = "wait_local"  # skip this request, keep scanning
    STOP_ROUND = "stop_round"  # end the scan for this round
    STOP_UNTIL_FREE = "stop_until_free"  # memory exhausted: no admissions until something is released


@dataclasses.dataclass(frozen=True)
class Policy:
    """``consumer``: the answer for a consumer of a pending checkpoint. ``use_cache``: prefix reuse.
    ``pair``: a consumer whose producer writes the checkpoint in the round being planned joins that
    round from the producer's in-round state (a paired reference); other consumers get ``consumer``.
    ``fill``: requests scanned after a skipped or paired consumer pass the cost-aware fill rule."""

    name: str
    consumer: Decision
    use_cache: bool = True
    pair: bool = False
    fill: bool = False

    @property
    def uses_round_cost(self) -> bool:
        """Whether the policy consults the round-cost estimator (pairing and the fill rule do)."""
        return self.pair or self.fill


POLICIES: dict[str, Policy] = {
    "native": Policy("native", Decision.STOP_ROUND),
    "radixflow": Policy("radixflow", Decision.WAIT),
    "pair": Policy("pair", Decision.WAIT, pair=True, fill=True),
    "pair-nofill": Policy("pair-nofill", Decision.WAIT, pair=True),
    "radixflow-fill": Policy("radixflow-fill", Decision.WAIT, fill=True),
    "no-cache": Policy("no-cache", Decision.STOP_ROUND, use_cache=False),
}
QUEUE_ORDERS = ("fcfs", "lpm")


def get_policy(name: str) -> Policy:
    """The policy named ``name``; ``ValueError`` naming the choices otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
