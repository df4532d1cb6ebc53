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


def test_a_warmup_short_of_the_mapping_cap_stops_and_serving_goes_on(tiny_model) -> None:
    """A budget (``runner/mapbudget.py``, counted here: 100 mappings per live executable) that
    holds three variants: the background warm-up stops with the reason, the guard stays off, and
    requests are still served (compiling what they need, dropping the least recently run)."""
    from radixflow_jax.runner.mapbudget import MARGIN, MapBudget

    model = tiny_model("tiny-qwen3.5")
    model.compiled_variants.clear()
    core = build_engine(model, EC)
    step = core.executor.step
    step.budget = MapBudget(count=lambda: 100 * len(step._compiled), limit=300 + MARGIN, per_compile=100,
                            measured=True)  # fmt: skip
    warmup = BackgroundWarmup(core.executor)
    engine = BackgroundEngine(core, idle=warmup)
    try:
        deadline = time.monotonic() + 600
        while warmup.phase == "warming" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert warmup.phase == "failed" and "vm.max_map_count" in (warmup.failed or "")
        assert warmup.compiled == 3 < warmup.total and not step.strict
        outs = [engine.submit(p, GREEDY).result(timeout=300) for p in PROMPTS]
        assert all(len(o.token_ids) == 4 for o in outs) and len(step._compiled) <= 3
    finally:
        engine.shutdown()


def test_health_names_the_warmup_error() -> None:
    from types import SimpleNamespace

    from radixflow_jax.serve.state import ServerState

    ready = SimpleNamespace(phase="ready", failed=None, compiled=9, total=9)
    stopped = SimpleNamespace(phase="failed", failed="stopped: 61000 of vm.max_map_count 65530", compiled=3, total=9)
    status = ServerState.warmup_status(SimpleNamespace(warmups=[ready, stopped]))  # type: ignore[arg-type]
    assert status == {"phase": "failed", "variants_compiled": 12, "variants": 18,
                      "warmup_error": "stopped: 61000 of vm.max_map_count 65530"}  # fmt: skip
    assert "warmup_error" not in ServerState.warmup_status(SimpleNamespace(warmups=[ready]))  # type: ignore[arg-type]
