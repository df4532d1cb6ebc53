"""KV pages in the host tier on the model (``cache/hostkv.py``, ``runner/hoststates.py``): many
conversations whose KV needs more than the device page pool. With host pages, evicted nodes are
spilled there and copied back when their conversation returns; every greedy output equals the cold
run's (cache off; one session may part at a near-tie, checked on the cold engine's
log-probabilities), fewer prompt tokens are computed than without host pages, and the audit finds
nothing leaked. A hybrid model (checkpoints and pages both in the tier) and an attention-only one."""

from __future__ import annotations

import pytest

from radixflow_jax.llm import LLM
from radixflow_jax.reliability.audit import assert_drained
from tests.engine.test_host_tier import OPTIONS, _conversations, assert_cold_or_near_tie

# 4 running requests need up to 4 x 4 pages of 16 tokens; 8 sessions of ~55 tokens do not fit in 24
PAGES = dict(OPTIONS, num_kv_pages=24, num_state_slots=24, max_model_len=128)


@pytest.mark.parametrize("model", ["tiny-qwen3.5", "tiny-bamba", "tiny-qwen3"])  # the other presets: test_host_tier
def test_host_pages_come_back_to_cold_outputs_and_save_prompt_tokens(model: str, tiny_model) -> None:
    loaded = tiny_model(model)
    cold_llm = LLM(loaded, policy="no-cache", **PAGES)
    cold, _, _ = _conversations(cold_llm)
    without, without_computed, _ = _conversations(LLM(loaded, num_host_slots=64, num_host_pages=0, **PAGES))
    assert_cold_or_near_tie(cold_llm, cold, without)
    for policy in ("native", "pair") if model == "tiny-qwen3.5" else ("radixflow",):  # every policy, one preset each
        llm = LLM(loaded, policy=policy, num_host_slots=64, num_host_pages=96, **PAGES)
        tiered, computed, _ = _conversations(llm)
        engine = llm.replicas.engines[0]
        cache = engine.scheduler.memory.cache
        assert_cold_or_near_tie(cold_llm, cold, tiered)
        assert cache.kv_demoted > 0 and cache.kv_restored > 0, (policy, cache.kv_demoted, cache.kv_restored)
        assert computed < without_computed, (policy, computed, without_computed)
        records = engine.records  # what /metrics counts (host_kv_spills, host_kv_restores)
        assert sum(r.kv_spilled for r in records) == cache.kv_demoted
        assert_drained(engine)
