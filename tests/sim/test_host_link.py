"""The host tier on the simulator (``sim/hostlink.py``, ``sim/engines.sim_host_tier``): spills travel
while later rounds run, a restore waits for the spills of the rows it reads and holds its round
back by its own transfer; conversations that return after think times restore their checkpoints and
reuse far more than without the tier, under every policy, with no bubble under radixflow and pair;
a device without a published host link refuses a tier. KV pages the same way (``kv_spill`` /
``kv_restore``, charged by ``page_bytes``, their own host ids), sharing the spill queue."""

from __future__ import annotations

import pytest

from radixflow_jax.bench.run import BenchConfig, sim_runner
from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.cache import StateMove
from radixflow_jax.engine.build import default_host_cache_gb, host_tier_sizes
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.sim.engines import build_sim_engine, sim_host_tier
from radixflow_jax.sim.hostlink import HostLink, HostLinkTimeline
from radixflow_jax.sim.specs import DEVICE_SPECS, MODEL_SPECS

LINK = HostLink(bandwidth=1e9, latency_s=1e-3, state_bytes=10**6)  # 2 ms a checkpoint with its latency


def test_spills_overlap_and_restores_wait_for_them() -> None:
    line = HostLinkTimeline(LINK)
    spill, restore = StateMove("spill", 5, 1), StateMove("restore", 1, 6)
    assert line.round_delay([spill, spill], now=0.0) == 0.0  # spills hold nothing back
    assert line.spills_done_at == pytest.approx(3e-3)
    # a restore at 1 ms waits for the spills (until 3 ms), then takes 2 ms: its round starts at 5 ms
    assert line.round_delay([restore], now=1e-3) == pytest.approx(4e-3)
    assert line.round_delay([restore, restore], now=10e-3) == pytest.approx(3e-3)  # one transfer of two
    assert line.round_delay([StateMove("copy", 5, 7)], now=20e-3) == 0.0
    # a restore waits only for the spills of the rows it reads: not for a queue of others
    assert line.round_delay([StateMove("spill", 4, 2)] * 5, now=30e-3) == 0.0  # lands at 30 + 1 + 5 = 36 ms
    assert line.round_delay([restore], now=31e-3) == pytest.approx(2e-3)  # row 1 landed long ago
    assert line.round_delay([StateMove("restore", 2, 6)], now=31e-3) == pytest.approx(7e-3)  # 36 ms + 2
    with pytest.raises(ValueError, match="bandwidth"):
        HostLink(bandwidth=0.0, latency_s=0.0, state_bytes=1)


def test_kv_pages_charge_page_bytes_and_wait_for_their_own_spills() -> None:
    link = HostLink(bandwidth=1e9, latency_s=1e-3, state_bytes=10**6, page_bytes=10**5)  # 1.1 ms a page
    line = HostLinkTimeline(link)
    spill, kv_spill = StateMove("spill", 5, 1), StateMove("kv_spill", 5, 1)
    assert line.round_delay([kv_spill] * 10, now=0.0) == 0.0  # one transfer of ten pages: lands at 2 ms
    assert line.pages_landed_at == {1: pytest.approx(2e-3)} and not line.landed_at
    assert line.round_delay([spill], now=0.0) == 0.0  # queued behind the pages: lands at 2 + 2 = 4 ms
    assert line.landed_at[1] == pytest.approx(4e-3)
    # host page 1 landed at 2 ms, not at host slot 1's 4 ms: then 1 ms + two pages
    assert line.round_delay([StateMove("kv_restore", 1, 6)] * 2, now=1e-3) == pytest.approx(2.2e-3)
    # in one round: a state restore (waits until 4 ms, + 2 ms), then pages after it (+ 1.1 ms)
    moves = [StateMove("restore", 1, 6), StateMove("kv_restore", 1, 6), StateMove("copy", 1, 2)]
    assert line.round_delay(moves, now=1e-3) == pytest.approx(6.1e-3)
    # a kv_spill and a kv_restore of its page in one list: the restore waits for that spill
    assert line.round_delay([StateMove("kv_spill", 3, 2), StateMove("kv_restore", 2, 3)], now=10e-3) == pytest.approx(
        2.2e-3
    )
    states_only = HostLinkTimeline(LINK)
    with pytest.raises(ValueError, match="no page size"):
        states_only.round_delay([kv_spill], now=0.0)
    pages_only = HostLinkTimeline(HostLink(bandwidth=1e9, latency_s=0.0, state_bytes=0, page_bytes=1))
    with pytest.raises(ValueError, match="no state size"):
        pages_only.round_delay([spill], now=0.0)
    with pytest.raises(ValueError, match="state or page bytes"):
        HostLink(bandwidth=1e9, latency_s=0.0, state_bytes=0)


def _returning(host_gb: float, policies: tuple[str, ...]) -> dict:
    requests = generate(WorkloadSpec("multiturn", 96, seed=2, turns=3, arrival="all", think_time=0.5, article_len=1500))
    ec = EngineConfig.from_options(
        max_num_seqs=8, max_num_batched_tokens=2048, num_state_slots=1 + 8 + 3, host_cache_gb=host_gb,
        host_kv_fraction=0.0,  # the KV pool is never short here: the whole tier for checkpoints
    )
    run = sim_runner(MODEL_SPECS["qwen3.5-9b"], DEVICE_SPECS["h200"], requests, BenchConfig(policies, ec))
    return {p: run(p)[0] for p in policies}


def test_returning_conversations_restore_their_checkpoints() -> None:
    policies = ("native", "radixflow", "pair")
    without, tiered = _returning(0.0, policies), _returning(8.0, policies)
    for p in policies:
        off, on = without[p], tiered[p]
        assert off.host_restores == off.host_spills == 0 and on.completed == off.completed == 96
        assert on.host_restores > 0 and on.host_spills > 0  # a host copy may be read more than once
        assert on.reuse > off.reuse + 0.2, (p, on.reuse, off.reuse)  # 32 conversations, 3 checkpoint slots
        assert on.mean_ttft_s < off.mean_ttft_s, p
    assert tiered["radixflow"].bubble_tokens == tiered["pair"].bubble_tokens == 0


def test_tier_sizes_and_devices_without_a_link() -> None:
    spec, h200 = MODEL_SPECS["qwen3.5-9b"], DEVICE_SPECS["h200"]
    page = spec.kv_bytes_per_token * 64

    def tier(ec: EngineConfig, model=spec) -> tuple[int, int]:
        return sim_host_tier(model, h200, ec, pages=300, slots=100, page_bytes=model.kv_bytes_per_token * 64)

    assert tier(EngineConfig()) == (0, 0)  # a simulated host has no RAM to size from
    kv_share = 300 * page / (300 * page + 100 * spec.state_bytes)  # the device pools' split by bytes
    slots, pages = tier(EngineConfig(host_cache_gb=1.0))
    assert slots == int(2**30 * (1 - kv_share) // spec.state_bytes) and pages == int(2**30 * kv_share // page)
    assert tier(EngineConfig(host_cache_gb=1.0, host_kv_fraction=0.0)) == (2**30 // spec.state_bytes, 0)
    assert tier(EngineConfig(num_host_slots=7)) == (7, 0) and tier(EngineConfig(num_host_pages=5)) == (0, 5)
    qwen3 = MODEL_SPECS["qwen3-8b"]  # no recurrent state: all of it for pages
    assert tier(EngineConfig(host_cache_gb=1.0), qwen3) == (0, 2**30 // (qwen3.kv_bytes_per_token * 64))
    with pytest.raises(ValueError, match="host_cache_gb.*tpu-v6e"):
        build_sim_engine(MODEL_SPECS["qwen3.5-4b"], DEVICE_SPECS["tpu-v6e"], EngineConfig(host_cache_gb=1.0))
    with pytest.raises(ValueError, match="host_cache_gb"):
        EngineConfig(host_cache_gb=-1.0)
    with pytest.raises(ValueError, match="host_kv_fraction"):
        EngineConfig(host_kv_fraction=1.5)
    # the rule both engines share (engine/build.py): the model engine's default is RAM / 8, at most 4 GiB
    assert default_host_cache_gb(ram_bytes=16 * 2**30) == 2.0 and default_host_cache_gb(ram_bytes=2**40) == 4.0
    sizes = dict(slot_bytes=2**20, page_bytes=2**10, device_state_bytes=3 * 2**20, device_kv_bytes=2**20)
    assert host_tier_sizes(**sizes, ec=EngineConfig(), default_gb=2.0) == (1536, 512 * 2**10)
    assert host_tier_sizes(**sizes, ec=EngineConfig(num_host_slots=9), default_gb=2.0) == (9, 0)
    assert host_tier_sizes(**dict(sizes, slot_bytes=0), ec=EngineConfig(num_host_slots=9), default_gb=2.0) == (0, 0)
    with pytest.raises(ValueError, match="num_host_slots"):
        EngineConfig(num_host_slots=-1)


def test_a_returning_request_restores_into_its_own_slot() -> None:
    from radixflow_jax.engine.params import SamplingParams

    ec = EngineConfig.from_options(max_num_seqs=2, max_num_batched_tokens=512, max_model_len=1024,
                                   num_state_slots=4, num_host_slots=32)  # fmt: skip
    core = build_sim_engine(MODEL_SPECS["qwen3.5-9b"], DEVICE_SPECS["h200"], ec)
    plans = []
    execute = core.executor.execute  # the synchronous engine
    core.executor.execute = lambda plan, sampling: plans.append(plan) or execute(plan, sampling)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    prompts = [[10 + s] + [20 + (5 * s + i) % 400 for i in range(127)] for s in range(4)]
    for p in prompts:  # one at a time: each end is kept, then demoted by the next ones (one free slot)
        core.add_request(p, params)
        core.run_until_done()
    assert core.scheduler.memory.cache.demoted > 0
    rid = core.add_request(prompts[0] + [1, 1, 7], params)  # the simulator samples token 1
    plans.clear()
    core.run_until_done()
    first = plans[0]
    (row,) = [r for r in first.rows if r.request_id == rid]
    restored = {m.dst for m in first.state_moves if m.kind == "restore"}
    assert row.slot in restored and row.copy_from is None and row.start >= 128  # straight into its slot
    assert not first.restores  # no pending restore, no checkpoint slot: the host copy stays
    assert sum(r.consumers_waiting + r.consumers_blocked for r in core.records[-len(plans):]) == 0
