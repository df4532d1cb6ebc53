"""The soak with speculative decoding (``SoakConfig.speculative``): verify rows under random
arrivals, aborts (also while a round runs), failed steps of every kind, preemption, riders, the
host tier and conversations, every read checked by the shadow executor (which verifies drafts with
its own model), invariants audited after every round, every completed output equal to the cold
run, nothing leaked.

The drafts are an oracle's, not n-gram lookups (the shadow model's tokens are hashes, which an
n-gram lookup almost never guesses): the shadow model's true continuation, one token of it altered
on a fixed pattern, so drafts are accepted whole, in part and not at all."""

from __future__ import annotations

import logging

import pytest

from radixflow_jax.reliability.shadow import token_for
from radixflow_jax.reliability.soak import SoakConfig, run_soak
from radixflow_jax.scheduler import running
from tests.reliability.scenarios import CACHING_POLICIES

VOCAB = SoakConfig().vocab


def _oracle(tokens, k, *, max_n, min_n):  # noqa: ARG001 - ngram_draft's signature
    seq, draft = list(tokens), []
    for _ in range(k):
        draft.append(token_for(seq + draft, VOCAB))
    if len(tokens) % 3 == 0 and draft:  # altered: rejected from there
        at = (len(tokens) // 3) % len(draft)
        draft[at] = 3 + (draft[at] - 2) % (VOCAB - 3)
    return tuple(draft)


@pytest.mark.parametrize("policy", CACHING_POLICIES)
def test_soak_with_speculation(policy: str, monkeypatch, caplog) -> None:
    caplog.set_level(logging.CRITICAL)  # the failed steps are planned
    monkeypatch.setattr(running, "ngram_draft", _oracle)
    r = run_soak(SoakConfig(requests=1500, policy=policy, seed=3, fault_rate=0.01, speculative=True))
    assert r["completed"] + r["aborted"] + r["errors"] + r["refused"] == r["requests"] == 1500 + r["turns"]
    assert r["refused"] == 0 and r["outputs_equal_cold"] == r["completed"] > 1200
    # aborts land on requests in flight: 24-30 over the policies at seed 3 since eviction keeps nodes
    # whose pages a running request holds and pages go to the host tier (requests finish sooner:
    # 40-58 before that, 101-121 before a partly accepted draft stopped costing a row of recomputation)
    assert r["failed_steps"] >= 3 and r["aborted"] > 15 and r["host_restores"] > 50 and r["riders"] > 5
    assert 0 < r["accepted_tokens"] < r["drafted_tokens"]  # whole, partial and rejected drafts
    assert r["leaked_pages"] == 0 and r["leaked_slots"] == 0
