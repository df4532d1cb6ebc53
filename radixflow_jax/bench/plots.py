"""Plots for ``radixflow bench --plot``: per-round slot use (real tokens, padding, bubbles) for each
policy, and the end-to-end latency CDFs. Needs matplotlib (``pip install radixflow-jax[plot]``)."""

from __future__ import annotations

from typing import Mapping, Sequence

from radixflow_jax.bench.driver import RunResult
from radixflow_jax.engine.config import RoundRecord


def plot_runs(path: str, runs: Sequence[RunResult], records: Mapping[str, list[RoundRecord]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ValueError("--plot needs matplotlib: pip install 'radixflow-jax[plot]'") from exc
    fig, axes = plt.subplots(len(runs) + 1, 1, figsize=(10, 3 * (len(runs) + 1)))
    for ax, run in zip(axes, runs):
        recs = records[run.policy]
        x = range(len(recs))
        real = [r.num_tokens for r in recs]
        pad = [r.padding_tokens for r in recs]
        bubble = [r.bubble_tokens for r in recs]
        ax.bar(x, real, color="tab:blue", label="real tokens", width=1.0)
        ax.bar(x, pad, bottom=real, color="tab:gray", label="padding", width=1.0)
        ax.bar(x, bubble, bottom=[a + b for a, b in zip(real, pad)], color="tab:red", label="bubble", width=1.0)
        ax.set_title(f"{run.policy}: {run.rounds} rounds, mean latency {run.mean_latency_s:.3f} s")
        ax.set_xlabel("round")
        ax.set_ylabel("token slots")
        ax.legend(loc="upper right")
    cdf = axes[-1]
    for run in runs:
        lat = sorted(run.latencies)
        if lat:
            cdf.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=run.policy)
    cdf.set_xlabel("end-to-end latency (s)")
    cdf.set_ylabel("fraction of requests")
    cdf.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
