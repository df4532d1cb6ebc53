"""``radixflow bench --sweep-rates R1,R2,...``: the same workload at several offered loads, every
policy at each, so latency and rounds can be read against load (executor utilization)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from radixflow_jax.bench.driver import COLUMNS
from radixflow_jax.bench.repeats import Repeated

_BY_FIELD = {column[0]: column for column in COLUMNS}
SWEEP_COLUMNS = tuple(
    _BY_FIELD[f] for f in ("utilization", "rounds", "mean_latency_s", "p99_latency_s", "reuse", "throughput_tok_s")
)


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    rate: float
    runs: tuple[Repeated, ...]  # one per policy, in policy order


def parse_rates(text: str) -> tuple[float, ...]:
    """``"1,2.5,4"`` -> ``(1.0, 2.5, 4.0)``; ``ValueError`` on anything but positive numbers."""
    try:
        rates = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--sweep-rates expects comma-separated numbers, got {text!r}") from None
    if not rates or any(not r > 0 for r in rates):
        raise ValueError(f"--sweep-rates needs positive rates, got {text!r}")
    return rates


def sweep(rates: Sequence[float], run_at: Callable[[float], list[Repeated]]) -> list[SweepPoint]:
    return [SweepPoint(rate, tuple(run_at(rate))) for rate in rates]


def format_sweep(points: Sequence[SweepPoint]) -> str:
    head = ["rate", "policy"] + [c[1] for c in SWEEP_COLUMNS]
    rows = []
    for pt in points:
        for rep in pt.runs:
            r = rep.median
            rows.append([f"{pt.rate:g}", r.policy] + [fmt.format(getattr(r, key)) for key, _, fmt in SWEEP_COLUMNS])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    return "\n".join("  ".join(str(c).rjust(w) for c, w in zip(line, widths)) for line in [head] + rows)


def sweep_json(points: Sequence[SweepPoint]) -> list[dict]:
    return [
        {"rate": pt.rate, "runs": [dict(rep.median.as_dict(), spread=rep.spread) for rep in pt.runs]} for pt in points
    ]


def plot_sweep(path: str, points: Sequence[SweepPoint]) -> None:
    """Mean latency and rounds against the offered rate, one line per policy (native utilization
    written next to each point of the first policy)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ValueError("--plot needs matplotlib: pip install 'radixflow-jax[plot]'") from exc
    fig, (lat, rounds) = plt.subplots(1, 2, figsize=(12, 4))
    policies = [rep.median.policy for rep in points[0].runs] if points else []
    for i, policy in enumerate(policies):
        xs = [pt.rate for pt in points]
        lat.plot(xs, [pt.runs[i].median.mean_latency_s for pt in points], marker="o", label=policy)
        rounds.plot(xs, [pt.runs[i].median.rounds for pt in points], marker="o", label=policy)
    for pt in points:
        if pt.runs:
            first = pt.runs[0].median
            lat.annotate(f"u={first.utilization:.2f}", (pt.rate, first.mean_latency_s), fontsize=7)
    lat.set_xlabel("offered rate (1/s)")
    lat.set_ylabel("mean latency (s)")
    rounds.set_xlabel("offered rate (1/s)")
    rounds.set_ylabel("rounds")
    lat.legend()
    rounds.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
