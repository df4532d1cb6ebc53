"""The host link of a simulated device: what the host tier's copies (``cache/tiers.py``) cost a round.

The model executor (``runner/hoststates.py``) starts a round's spills (device -> host) without
waiting: they travel while later rounds run. A restore (host -> device) first lands every spill
still in flight, then copies its rows, all before the round's step. :class:`HostLinkTimeline`
charges exactly that on the virtual clock: each direction of the link is one queue of transfers
(``latency_s + bytes / bandwidth`` each, a round's run of moves of one kind being one transfer), the
two directions independent (a PCIe link is full duplex); spills delay nothing but later restores,
and a restore delays its round by the wait for the spills booked before it plus its own transfer.
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
    """The device -> host queue of one simulated executor (see the module docstring). Invariant:
    ``spills_done_at`` is when the last spill booked so far has landed in host memory."""

    def __init__(self, link: HostLink) -> None:
        self.link = link
        self.spills_done_at = 0.0
        self.bytes_out = 0
        self.bytes_in = 0

    def round_delay(self, moves: Sequence[StateMove], now: float) -> float:
        """Books a round's ``moves`` dispatched at ``now``; returns how long they hold its step back."""
        t = now
        for kind, run in itertools.groupby(moves, key=lambda m: m.kind):
            n = sum(1 for _ in run)
            if kind == "spill":
                self.spills_done_at = max(self.spills_done_at, t) + self.link.transfer_s(n)
                self.bytes_out += n * self.link.state_bytes
            elif kind == "restore":
                t = max(t, self.spills_done_at) + self.link.transfer_s(n)
                self.bytes_in += n * self.link.state_bytes
        return t - now
