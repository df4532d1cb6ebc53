"""The soak at a reduced size (``tests/heavy/soak.py`` runs 100k requests): random arrivals over
shared prefixes, random aborts (between rounds and while a round runs), random failed steps of
every kind, small pools with a host tier below the state slots and the page pool (demotions and restores); invariants audited after every round, every checkpoint read
checked, every completed output equal to the cold run, conversations resending their history. Nothing is lost: every request completes,
is aborted, or ends with a clear error, and no page or slot leaks."""

from __future__ import annotations

import logging

import pytest

from radixflow_jax.reliability.soak import SoakConfig, run_soak
from radixflow_jax.scheduler.admission import get_policy
from tests.reliability.scenarios import CACHING_POLICIES


@pytest.mark.parametrize("policy", CACHING_POLICIES)
def test_soak(policy: str, caplog) -> None:
    caplog.set_level(logging.CRITICAL)  # the failed steps are planned
    r = run_soak(SoakConfig(requests=3000, policy=policy, seed=1, fault_rate=0.005))
    assert r["completed"] + r["aborted"] + r["errors"] + r["refused"] == r["requests"] == 3000 + r["turns"]
    assert r["turns"] > 800  # conversations resent their history, each output equal to the cold run too
    # the pools are small and the queue long: most turns find their end evicted (the exact-depth
    # reuse itself is checked under a light load in test_conversations.py)
    assert r["turns_at_exact_end"] >= 1
    assert r["refused"] == 0 and r["outputs_equal_cold"] == r["completed"] > 2400
    assert 150 < r["aborted"] < 450
    assert r["failed_steps"] >= 3 and r["pool_rebuilds"] == r["failed_steps"]
    assert r["preemptions"] > 0 and r["consumer_waits"] > 0 and r["checkpoint_reads_checked"] > 100
    assert r["invariant_audits"] == r["ticks"] and r["rounds"] <= r["ticks"]  # after every round
    assert r["leaked_pages"] == 0 and r["leaked_slots"] == 0
    assert r["host_restores"] > 20 and r["host_spills"] >= r["host_restores"]  # the host tier under all of it
    assert r["host_kv_restores"] > 100 and r["host_kv_spills"] >= r["host_kv_restores"]  # its KV pages too
    assert r["reuse"] > 0.1
    assert r["riders"] > 20  # resent prompts ride the first one's last round, outputs still equal cold
    assert (r["paired_reads_checked"] > 20) if get_policy(policy).pair else r["paired_reads_checked"] == 0
