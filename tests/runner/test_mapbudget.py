"""The memory-mapping budget of compiled steps (``runner/mapbudget.py``): past ``vm.max_map_count``
LLVM aborts the process, so a step drops its least recently run executables before a compile
would pass it (outputs unchanged: a dropped variant compiles again), warm-up stops short instead
of compiling past it, and with nothing left to drop the compile fails with a typed error. The
count is the test's own (100 mappings per live executable), not the process's."""

from __future__ import annotations

import pytest

from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.llm import LLM
from radixflow_jax.runner import mapbudget
from radixflow_jax.runner.mapbudget import MARGIN, MapBudget, MapBudgetError

PROMPTS = [list(range(5, 5 + n)) for n in (3, 20, 40, 70)]
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)
OPTIONS = dict(max_num_seqs=4, max_num_batched_tokens=128)


def test_budget_learns_the_growth_of_a_compile() -> None:
    count = [1000]
    budget = MapBudget(count=lambda: count[0], limit=1000 + 300 + MARGIN)
    assert not budget.room()  # the first guess (1000 per compile) does not fit
    budget.compiling()
    count[0] += 250
    budget.compiled()
    assert budget.per_compile == 250 and budget.measured
    assert not budget.room()  # 1250 + 250 + MARGIN > limit
    count[0] = 1000
    assert budget.room()
    assert MapBudget(count=lambda: None, limit=10).room() and MapBudget(count=lambda: 10**9, limit=None).room()
    assert mapbudget.map_count() is None or mapbudget.map_count() > 0


def _budget(step, live: int) -> MapBudget:
    """Room for compiles while fewer than ``live`` executables are alive."""
    return MapBudget(count=lambda: 100 * len(step._compiled), limit=100 * live + MARGIN, per_compile=100, measured=True)


def test_a_step_drops_its_least_recently_run_variants_and_outputs_stay(tiny_model) -> None:
    model = tiny_model("tiny-qwen3.5")
    want = [o.token_ids for o in LLM(model, **OPTIONS).generate(PROMPTS, PARAMS)]
    llm = LLM(model, **OPTIONS)
    step = llm.replicas.engines[0].executor.step
    step._compiled.clear()  # the shared executables stay in the model's store, taken without a compile
    step._shared = None
    step.budget = _budget(step, live=2)
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS)] == want
    assert step.evicted > 0 and len(step._compiled) <= 2


def test_warmup_stops_short_and_a_compile_with_nothing_to_drop_fails(tiny_model) -> None:
    llm = LLM(tiny_model("tiny-qwen3.5"), **OPTIONS)
    executor = llm.replicas.engines[0].executor
    step = executor.step
    step._compiled.clear()
    step._shared = None
    said: list[str] = []
    executor.progress = said.append
    step.budget = _budget(step, live=0)
    executor.warmup()
    assert not step._compiled and any("warm-up stopped at 1/" in s for s in said)
    with pytest.raises(MapBudgetError, match="vm.max_map_count"):
        step.prime(executor.shapes.variants()[0], executor.model.params, executor.cache)


@pytest.mark.skipif(mapbudget.map_count() is None, reason="needs /proc/self/maps (Linux)")
def test_the_process_count_falls_when_a_step_drops_an_executable(tiny_model) -> None:
    """With the real count: a budget with no room before a compile drops an executable, which gives
    mappings back, and the compile goes on (a drop that gave nothing back would raise)."""
    llm = LLM(tiny_model("tiny-qwen3.5"), **OPTIONS)
    executor = llm.replicas.engines[0].executor
    step = executor.step
    step._compiled.clear()
    step._shared = None
    first, second, third = executor.shapes.variants()[:3]
    for v in (first, second):
        executor.cache = step.prime(v, executor.model.params, executor.cache)
    grew = step.budget.per_compile
    step.budget.limit = mapbudget.map_count() + MARGIN + grew - grew // 8  # one drop of ~an eighth makes room
    executor.cache = step.prime(third, executor.model.params, executor.cache)
    assert step.evicted >= 1 and step.is_compiled(third) and not step.is_compiled(first)
