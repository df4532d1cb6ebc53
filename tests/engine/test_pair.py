"""Policy ``pair`` end to end on the model executor: greedy outputs equal cold (no-cache) outputs,
with consumers that pair at a grid depth *inside* the producer's span (a chunk boundary, not its
end) and with a producer aborted between planning and commit (its partners roll back and recompute).

CI runs the Gated DeltaNet preset (pairing lives in the one routine GDN and Mamba2 share,
``models/mixers/recurrent.py``); ``RADIXFLOW_TEST_ALL_PRESETS=1`` runs every hybrid preset."""

from __future__ import annotations

import os

import pytest

from radixflow_jax import LLM, SamplingParams
from tests.engine.workloads import shared_prefix_prompts

# budget 512: the producer's first span covers its whole 150-token prefix and more, so the branch
# checkpoint at 128 (grid 64 = lcm(page 16, chunk 64)) is a chunk boundary inside that span. Fixed
# buckets: the cold and the pair engines of a preset run one step variant (pairing is scheduling and
# the in-step checkpoint copy, whatever the bucket; tests/engine/test_engine.py covers the buckets)
OPTIONS = dict(max_num_seqs=4, max_num_batched_tokens=512, page_size=16, max_model_len=512, warmup=False, bucket_mode="fixed")
PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)
ALL = ["tiny-qwen3.5", "tiny-qwen3-next", "tiny-bamba", "tiny-nemotron-h", "tiny-granite-4.0-h", "tiny-falcon-h1"]
PRESETS = ALL if os.environ.get("RADIXFLOW_TEST_ALL_PRESETS") == "1" else ["tiny-qwen3.5"]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return shared_prefix_prompts(num_prefixes=1, per_prefix=4, prefix_len=150, suffix_len=10, vocab=500)


def _paired_rows(llm: LLM) -> int:
    return sum(r.consumers_paired for r in llm.engine.records)


@pytest.mark.parametrize("model", PRESETS)
def test_pair_equals_cold_and_aborted_producer_rolls_back(model: str, prompts, tiny_model) -> None:
    cold = [o.token_ids for o in LLM(tiny_model(model), policy="no-cache", **OPTIONS).generate(prompts, PARAMS)]
    llm = LLM(tiny_model(model), policy="pair", **OPTIONS)
    outs = llm.generate(prompts, PARAMS)
    assert [o.token_ids for o in outs] == cold
    assert _paired_rows(llm) == 3  # three consumers ran in their producer's first round
    assert all(o.cached_tokens == 128 for o in outs[1:])  # from the in-span branch point
    # the same prompts again, on a fresh engine: abort the producer after planning, before the step
    llm = LLM(llm.model, policy="pair", **OPTIONS)
    engine = llm.engine
    launch = engine.executor.launch  # the engine launches every round (overlap on or off)
    aborted: list[int] = []

    def abort_producer_mid_round(plan, sampling, prev=None):
        paired = [r for r in plan.rows if r.pair_slot is not None]
        if paired and not aborted:
            producer = next(r for r in plan.rows if any(slot == paired[0].pair_slot for _, slot in r.emits))
            aborted.append(producer.request_id)
            engine.abort(producer.request_id)
        return launch(plan, sampling, prev)

    engine.executor.launch = abort_producer_mid_round
    rids = [engine.add_request(p, PARAMS) for p in prompts]
    engine.run_until_done()
    assert aborted == [rids[0]]
    got = {rid: engine.output(rid) for rid in rids}
    assert got[rids[0]].finish_reason == "abort"
    assert [got[rid].token_ids for rid in rids[1:]] == cold[1:]
    assert all(engine.scheduler.requests[rid].num_rollbacks == 1 for rid in rids[1:])
    engine.scheduler.memory.flush()
    assert engine.scheduler.memory.pages.num_used == 0 and engine.scheduler.memory.slots.num_used == 0
