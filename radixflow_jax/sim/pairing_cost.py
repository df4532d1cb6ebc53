"""What a round with paired consumers (policy ``pair``) costs beyond the same round unpaired, on
each backend, from the structure of the chunked-scan kernels (``kernels/pallas/chunk_scan.py``).

  * ``"gpu"``: rows run in parallel programs (one per row, head and column block), so no program
    can wait for another. A paired round first runs a *pre-pass* call per recurrent layer over only
    the producers' chunks up to their deepest pairing chunk; every other program idles. Its time per
    layer is one more kernel (``kernel_launch_s``) plus the longest of: the serial chunk chain of
    the deepest producer (each chunk a program's work on one SM, ``peak / sm_count``), the pre-pass
    FLOPs over the whole device, and its memory traffic (the producers' chunk inputs read, their
    chunk outputs and f32 chunk states written).
  * ``"tpu"``: the grid scans every chunk of the call in order with one state scratch, so a paired
    round runs the whole call twice: the recurrent work over every token slot once more (FLOPs or
    traffic, whichever is longer) plus the second call's grid steps (``grid_step_s`` each; grid
    ``(heads, 1, chunks)`` per layer).

The weights of the projections are not read again: only the scan runs twice. Plain Python.
"""

from __future__ import annotations

import dataclasses
import math

from radixflow_jax.scheduler.plan import RoundPlan, pairing_spans
from radixflow_jax.sim.specs import DeviceSpec, ModelSpec


@dataclasses.dataclass(frozen=True)
class ScanKind:
    """One kind of recurrent layer: ``layers`` of it, ``heads`` programs per row, its ``chunk``,
    FLOPs per token per head (state update and readout, ``6 * dk * dv``), the intra-chunk width
    (``dk + dv``: the chunk's ``C x C`` products cost ``2 C^2 (dk + dv)`` per head), and bytes per
    token per layer of chunk inputs and outputs."""

    layers: int
    heads: int
    chunk: int
    state_flops: float
    intra_width: float
    io_bytes: float
    state_bytes_per_head: float

    def chunk_flops(self) -> float:
        """One program's FLOPs for one chunk."""
        return self.chunk * self.state_flops + 2.0 * self.chunk**2 * self.intra_width


def _scan_kind(layers: int, heads: int, chunk: int, dk: int, dv: int, io_bytes: float) -> ScanKind:
    """A scan whose per-head state is ``dk x dv`` (float32)."""
    return ScanKind(
        layers=layers,
        heads=heads,
        chunk=chunk,
        state_flops=6.0 * dk * dv,
        intra_width=dk + dv,
        io_bytes=io_bytes,
        state_bytes_per_head=4.0 * dk * dv,
    )


def scan_kinds(m: ModelSpec) -> list[ScanKind]:
    out = []
    if m.gdn:
        io = (2 * m.gdn_k_heads * m.gdn_k_dim + 2 * m.gdn_v_heads * m.gdn_v_dim + 2 * m.gdn_v_heads) * m.dtype_bytes
        out.append(_scan_kind(m.gdn, m.gdn_v_heads, m.gdn_chunk, m.gdn_k_dim, m.gdn_v_dim, io))
    if m.mamba:
        inner = m.mamba_heads * m.mamba_head_dim
        io = (2 * inner + 2 * m.mamba_groups * m.mamba_state + m.mamba_heads) * m.dtype_bytes
        out.append(_scan_kind(m.mamba, m.mamba_heads, m.mamba_chunk, m.mamba_head_dim, m.mamba_state, io))
    return out


def pairing_pass_s(
    plan: RoundPlan, token_slots: int, m: ModelSpec, dev: DeviceSpec, mfu: float | None = None, mbu: float | None = None
) -> float:
    """Seconds a round with paired rows adds for its extra scan (0.0 for a round without any)."""
    spans = pairing_spans(plan.rows)
    if not spans:
        return 0.0
    flop_rate = dev.peak_flops * (mfu if mfu is not None else dev.mfu)
    byte_rate = dev.hbm_bandwidth * (mbu if mbu is not None else dev.mbu)
    total = 0.0
    for kind in scan_kinds(m):
        if dev.backend == "tpu":
            chunks = math.ceil(token_slots / kind.chunk)
            flops = chunks * kind.heads * kind.chunk_flops()
            traffic = token_slots * kind.io_bytes + chunks * kind.heads * kind.state_bytes_per_head
            steps = kind.heads * chunks
            total += kind.layers * (max(flops / flop_rate, traffic / byte_rate) + steps * dev.grid_step_s)
            continue
        chunks = [math.ceil(depth / kind.chunk) for depth in spans.values()]
        serial = max(chunks) * kind.chunk_flops() / (flop_rate / max(dev.sm_count, 1))
        flops = sum(chunks) * kind.heads * kind.chunk_flops()
        traffic = sum(chunks) * (kind.chunk * kind.io_bytes + kind.heads * kind.state_bytes_per_head)
        total += kind.layers * (dev.kernel_launch_s + max(serial, flops / flop_rate, traffic / byte_rate))
    return total
