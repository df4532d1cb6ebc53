"""The reliability soak at full size (``soak.py``): 100k requests per policy through the shadow
executor with aborts and failed steps (``run_soak`` raises on the first violated invariant or wrong
output), and the model-executor soak on ``tiny-qwen3.5``; nothing leaks after the final flush.
``RADIXFLOW_SOAK_REQUESTS`` sets the shadow soak's size (default 100000)."""

from __future__ import annotations

import os

import pytest

from radixflow_jax.reliability.soak import SoakConfig, run_soak
from tests.heavy.soak import model_soak

pytestmark = pytest.mark.heavy
POLICIES = ["radixflow", "native", "pair"]


@pytest.mark.parametrize("policy", POLICIES)
def test_shadow_soak(policy: str) -> None:
    requests = int(os.environ.get("RADIXFLOW_SOAK_REQUESTS", "100000"))
    report = run_soak(SoakConfig(requests=requests, policy=policy, seed=0, abort_rate=0.1, fault_rate=0.002))
    assert report["requests"] == requests
    assert report["leaked_pages"] == 0 and report["leaked_slots"] == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_model_soak(policy: str) -> None:
    report = model_soak(60, policy, seed=0)
    assert report["outputs_equal_cold"] == report["completed"] > 0
    assert report["leaked_pages"] == 0 and report["leaked_slots"] == 0
