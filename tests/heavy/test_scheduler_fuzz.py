"""The scheduler's liveness fuzz at full size (``scheduler_fuzz.py``): every seed of both draws
plans within the budgets, finishes all accepted work and leaves pool and tree invariants intact.
``RADIXFLOW_FUZZ_SEEDS=first:end`` narrows the seeds (default 0:2000)."""

from __future__ import annotations

import os

import pytest

from tests.heavy.scheduler_fuzz import run_seed

pytestmark = pytest.mark.heavy


@pytest.mark.parametrize("draw", ["tiny", "stream"])
def test_every_seed_is_live(draw: str) -> None:
    lo, hi = (int(x) for x in os.environ.get("RADIXFLOW_FUZZ_SEEDS", "0:2000").split(":"))
    totals: dict[str, list[int]] = {"plans": [], "preemptions": [], "slowest": []}
    failures = [f"seed {seed}: {why}" for seed in range(lo, hi) if (why := run_seed(seed, 2000, draw, totals))]
    assert not failures, "\n".join(failures[:20])
    assert len(totals["plans"]) == hi - lo and sum(totals["plans"]) > 0
