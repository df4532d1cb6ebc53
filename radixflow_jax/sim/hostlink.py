"""The host link of a simulated device: what the host tier's copies (``cache/tiers.py``) cost a round.

The model executor (``runner/hoststates.py``) starts a round's spills (device -> host: checkpoints,
``spill``, and KV pages, ``kv_spill``) without waiting: they travel while later rounds run. A
restore (host -> device: ``restore``, ``kv_restore``) first lands the spills that wrote the host
rows it reads (and those before them), then copies its rows, all before the round's step.
:class:`HostLinkTimeline` charges exactly that on the virtual clock: each direction of the link is
one queue of transfers (``latency_s + bytes / bandwidth`` each, a round's run of moves of one kind
being one transfer: checkpoints times ``state_bytes``, or pages times ``page_bytes``), the two
directions independent (a PCIe link is full duplex); spills of both kinds share the device -> host
queue and delay nothing but the restores of their rows, and a restore delays its round by the wait
for the spills of its rows plus its own transfer. Host slots and host pages are separate id spaces.
The device-side gather and scatter (a few MiB of HBM traffic per checkpoint or run of pages) are
not charged.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from radixflow_jax.cache import StateMove


@dataclasses.dataclass(frozen=True)
class HostLink:
    """One direction's ``bandwidth`` (bytes/s; both directions have it), the fixed ``latency_s`` of
    one transfer, ``state_bytes``, the size of one checkpoint, and ``page_bytes``, of one KV page
    over every attention layer (K and V). Either size may be 0 (that kind of move is refused), not
    both."""

    bandwidth: float
    latency_s: float
    state_bytes: int
    page_bytes: int = 0

    def __post_init__(self) -> None:
        sizes_ok = self.state_bytes >= 0 and self.page_bytes >= 0 and self.state_bytes + self.page_bytes >= 1
        if not self.bandwidth > 0 or self.latency_s < 0 or not sizes_ok:
            raise ValueError(
                f"host link needs bandwidth > 0, latency >= 0 and state or page bytes >= 1 (neither < 0), got {self}"
            )

    def transfer_s(self, checkpoints: int = 0, pages: int = 0) -> float:
        """One transfer of ``checkpoints`` checkpoints and ``pages`` KV pages."""
        return self.latency_s + (checkpoints * self.state_bytes + pages * self.page_bytes) / self.bandwidth


class HostLinkTimeline:
    """The device -> host queue of one simulated executor (see the module docstring). Invariants:
    ``spills_done_at`` is when the last spill (of either kind) booked so far has landed in host
    memory, ``landed_at[h]`` when the last spill into host slot ``h`` has and ``pages_landed_at[h]``
    when the last ``kv_spill`` into host page ``h`` has (queue order: no later)."""

    def __init__(self, link: HostLink) -> None:
        self.link = link
        self.spills_done_at = 0.0
        self.landed_at: dict[int, float] = {}
        self.pages_landed_at: dict[int, float] = {}

    def round_delay(self, moves: Sequence[StateMove], now: float) -> float:
        """Books a round's ``moves`` dispatched at ``now``; returns how long they hold its step back.
        ``ValueError`` for a kind of move the link has no size for."""
        t = now
        for kind, group in itertools.groupby(moves, key=lambda m: m.kind):
            run = list(group)
            if kind == "copy":
                continue
            pages = run[0].of_pages
            if (self.link.page_bytes if pages else self.link.state_bytes) == 0:
                raise ValueError(f"{kind}: this host link has no {'page' if pages else 'state'} size")
            cost = self.link.transfer_s(pages=len(run)) if pages else self.link.transfer_s(len(run))
            landed = self.pages_landed_at if pages else self.landed_at
            if run[0].to_host:
                self.spills_done_at = max(self.spills_done_at, t) + cost
                landed.update((m.dst, self.spills_done_at) for m in run)
            else:
                ready = max((landed.get(m.src, 0.0) for m in run), default=0.0)
                t = max(t, ready) + cost
        return t - now
