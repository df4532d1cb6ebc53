"""Warm-up in the background (``replicas/warmup.py``): the engine serves requests while the step
variants compile in its idle moments, finishes every variant, then turns the compile guard on, and
outputs equal a lazily compiled engine's."""

from __future__ import annotations

import time

from radixflow_jax.engine.build import build_engine
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.replicas.background import BackgroundEngine
from radixflow_jax.replicas.warmup import BackgroundWarmup

EC = EngineConfig.from_options(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=128, warmup=False,
                               warmup_progress=False)  # fmt: skip
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
GREEDY = SamplingParams(max_tokens=4, ignore_eos=True)


def test_serves_while_warming_then_guards(tiny_model) -> None:
    model = tiny_model("tiny-qwen3.5")
    lazy = build_engine(model, EC)
    ids = [lazy.add_request(p, GREEDY) for p in PROMPTS]
    lazy.run_until_done()
    want = [lazy.output(i).token_ids for i in ids]
    model.compiled_variants.clear()  # the background engine compiles its variants itself
    core = build_engine(model, EC)
    warmup = BackgroundWarmup(core.executor)
    assert warmup.phase == "warming" and warmup.total == len(core.executor.shapes.variants())
    engine = BackgroundEngine(core, idle=warmup)
    try:
        first = engine.submit(PROMPTS[0], GREEDY).result(timeout=300)  # served during the warm-up
        assert first.token_ids == want[0]
        deadline = time.monotonic() + 600
        while warmup.phase == "warming" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert warmup.phase == "ready" and warmup.compiled == warmup.total
        step = core.executor.step
        assert step.strict and all(step.is_compiled(v) for v in core.executor.shapes.variants())
        compiles = step.num_compiles
        assert engine.submit(PROMPTS[1], GREEDY).result(timeout=60).token_ids == want[1]
        assert step.num_compiles == compiles  # nothing compiled after the warm-up
        scorer = core.executor.scorer  # prompt scoring was warmed with the variants
        assert scorer.is_compiled and scorer.num_compiles == 1
        scored = engine.submit(PROMPTS[0] * 9, SamplingParams(max_tokens=1, prompt_logprobs=2)).result(timeout=60)
        assert scored.prompt_logprobs is not None and len(scored.prompt_logprobs) == 54
        assert step.num_compiles == compiles and scorer.num_compiles == 1
    finally:
        engine.shutdown()
