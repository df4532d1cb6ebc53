"""Overlap (``EngineConfig.overlap``): the engine plans and launches round r+1 while the device runs
round r. Greedy outputs equal the synchronous engine's, with EOS / stop strings ending a request
whose next row is already launched, with aborts arriving while rounds run (freed at the commit fence
of the last round holding them, never before), and with failed rounds (a failed round voids the one
launched after it). All engines share one model executor (tiny-qwen3.5, the engine shape of
tests/engine/test_engine.py), so the module compiles its step variants once."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import pytest

from radixflow_jax.reliability.audit import assert_drained
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.reliability.faults import Fault, FaultyExecutor
from radixflow_jax.engine.build import build_engine
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.engine.build import assemble_engine
from tests.engine.workloads import GUARDED, shared_prefix_prompts

# fine buckets of the compile guard's shape: its warm-up compiled every variant
CONFIG = EngineConfig.from_options(**GUARDED)
LONG = SamplingParams(max_tokens=8, ignore_eos=True)


class AngleTokenizer:
    """Token ``i`` reads ``<i>``: a stop string names exactly one token."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"<{i}>" for i in ids)


@pytest.fixture(scope="module")
def base(tiny_model) -> EngineCore:
    return build_engine(tiny_model("tiny-qwen3.5"), CONFIG)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return shared_prefix_prompts(num_prefixes=2, per_prefix=3, prefix_len=150, suffix_len=10, vocab=500)


def _engine(base: EngineCore, *, overlap: bool, faults=(), on_execute=None) -> EngineCore:
    config = dataclasses.replace(CONFIG, overlap=overlap)
    spec = dataclasses.replace(base.spec, config=config, tokenizer=AngleTokenizer())
    base.executor.reset()  # zeroed pools, the same compiled variants
    core = assemble_engine(spec, lambda shapes: FaultyExecutor(base.executor, faults, on_execute=on_execute))
    assert core.overlap is overlap
    return core


def _run(core: EngineCore, prompts, params) -> list:
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [core.add_request(p, sp) for p, sp in zip(prompts, params)]
    core.run_until_done()
    assert_drained(core)
    return [core.output(i) for i in ids]


@pytest.fixture(scope="module")
def reference(base, prompts) -> list[list[int]]:
    return [o.token_ids for o in _run(_engine(base, overlap=False), prompts, LONG)]


def test_overlap_equals_sync_with_eos_and_stop_strings(base, prompts, reference) -> None:
    # requests 0-1 end on a stop token id, 2-3 on a stop string, mid-way: their next decode row is
    # launched before the round that samples the stop token is committed
    params = [
        SamplingParams(max_tokens=8, stop_token_ids=[reference[0][2]]),
        SamplingParams(max_tokens=8, stop_token_ids=[reference[1][4]]),
        SamplingParams(max_tokens=8, stop=[f"<{reference[2][3]}>"], ignore_eos=True),
        SamplingParams(max_tokens=8, stop=[f"<{reference[3][1]}>"], ignore_eos=True),
        LONG,
        SamplingParams(max_tokens=3, ignore_eos=True),
    ]
    fenced: list[int] = []
    sync = _run(_engine(base, overlap=False), prompts, params)
    core = _engine(base, overlap=True, on_execute=lambda plan: fenced.append(len(core.scheduler.fenced)))
    over = _run(core, prompts, params)
    assert [(o.token_ids, o.finish_reason, o.text) for o in over] == [(o.token_ids, o.finish_reason, o.text) for o in sync]
    assert [o.finish_reason for o in over[:4]] == ["stop"] * 4
    assert over[0].token_ids == reference[0][: reference[0].index(reference[0][2]) + 1]
    assert over[4].token_ids == reference[4] and over[5].token_ids == reference[5][:3]
    assert sum(r.overlapped for r in core.records) >= len(core.records) // 2
    assert all(r.host_s == 0.0 for r in core.records if r.overlapped)
    assert max(fenced) >= 1  # a finished request waited for the fence of a round still holding its row


def test_abort_while_rounds_run_is_freed_at_the_fence(base, prompts, reference) -> None:
    seen: dict[str, object] = {}

    def abort_in_flight(plan) -> None:
        sched = core.scheduler
        if "rid" in seen or sched.num_in_flight < 2:
            return  # wait for a launch with the previous round still in flight (and this one planned)
        planned = {row.request_id for row in plan.rows}
        req = next((r for r in sched.running if r.uncommitted_tokens and r.request_id in planned), None)
        if req is None:
            return
        pages = list(req.own_pages)
        core.abort(req.request_id)
        seen.update(rid=req.request_id, pages=pages, fence=req.last_launch)
        assert req in sched.fenced and all(sched.memory.pages.refcount(p) > 0 for p in pages)

    def check_fence(core: EngineCore) -> None:
        if "rid" in seen and "freed_at" not in seen and core.scheduler.round_index > seen["fence"]:
            seen["freed_at"] = core.scheduler.round_index
            assert not any(r.request_id == seen["rid"] for r in core.scheduler.fenced)

    core = _engine(base, overlap=True, on_execute=abort_in_flight)
    ids = [core.add_request(p, LONG) for p in prompts]
    while core.has_unfinished():
        if "rid" in seen and "freed_at" not in seen:  # not released before the fence of its last round
            assert any(r.request_id == seen["rid"] for r in core.scheduler.fenced) == (core.scheduler.round_index <= seen["fence"])
        core.step()
        check_fence(core)
    assert_drained(core)
    assert "freed_at" in seen
    for rid, ref in zip(ids, reference):
        out = core.output(rid)
        if rid == seen["rid"]:
            assert out.finish_reason == "abort" and out.token_ids == ref[: len(out.token_ids)]
        else:
            assert out.token_ids == ref


@pytest.mark.parametrize("faults", [(Fault(3, "donated"), Fault(7, "after"), Fault(10, "before"))])
def test_failed_round_voids_the_round_launched_after_it(base, prompts, reference, faults) -> None:
    core = _engine(base, overlap=True, faults=faults)
    core.step_retries = 2
    outs = _run(core, prompts, LONG)
    assert core.num_step_failures == len(faults) and core.executor.resets == len(faults)
    assert [o.token_ids for o in outs] == reference
