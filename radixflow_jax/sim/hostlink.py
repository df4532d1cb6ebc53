"""The host link of a simulated device: what the host tier's copies (``cache/tiers.py``) cost a round.

The model executor (``runner/hoststates.py``) starts a round's spills (device -> host) without
waiting: they travel while later rounds run. A restore (host -> device) first lands the spills
that wrote the rows it reads (and those before them), then copies its rows, all before the round's
step. :class:`HostLinkTimeline` charges exactly that on the virtual clock: each direction of the
link is one queue of transfers (``latency_s + bytes / bandwidth`` each, a round's run of moves of
one kind being one transfer), the two directions independent (a PCIe link is full duplex); spills
delay nothing but the restores of their rows, and a restore delays its round by the wait for the
spills of its rows plus its own transfer.
The device-side gather and scatter (a few MiB of HBM traffic per checkpoint) are not charged.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from radixflow_jax.cache import StateMove


@dataclasses.dataclass(frozen=True)
class HostLink:
    """One direction's ``bandwidth`` (bytes/s; both directions have it), the fixed ``latency_s`` of
    one transfer, and ``state_bytes``, the size of one checkpoint."""

    bandwidth: float
    latency_s: float
    state_bytes: int

    def __post_init__(self) -> None:
        if not self.bandwidth > 0 or self.latency_s < 0 or self.state_bytes < 1:
            raise ValueError(f"host link needs bandwidth > 0, latency >= 0 and state bytes >= 1, got {self}")

    def transfer_s(self, checkpoints: int) -> float:
        return self.latency_s + checkpoints * self.state_bytes / self.bandwidth


class HostLinkTimeline:
    """The device -> host queue of one simulated executor (see the module docstring). Invariants:
    ``spills_done_at`` is when the last spill booked so far has landed in host memory, and
    ``landed_at[h]`` when the last spill into host slot ``h`` has (queue order: no later)."""

    def __init__(self, link: HostLink) -> None:
        self.link = link
        self.spills_done_at = 0.0
        self.landed_at: dict[int, float] = {}

    def round_delay(self, moves: Sequence[StateMove], now: float) -> float:
        """Books a round's ``moves`` dispatched at ``now``; returns how long they hold its step back."""
        t = now
        for kind, group in itertools.groupby(moves, key=lambda m: m.kind):
            run = list(group)
            if kind == "spill":
                self.spills_done_at = max(self.spills_done_at, t) + self.link.transfer_s(len(run))
                self.landed_at.update((m.dst, self.spills_done_at) for m in run)
            elif kind == "restore":
                ready = max((self.landed_at.get(m.src, 0.0) for m in run), default=0.0)
                t = max(t, ready) + self.link.transfer_s(len(run))
        return t - now
