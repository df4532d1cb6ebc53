"""Conversations whose clients resend the model's answers altered (re-tokenised text, reasoning
stripped by a chat template), many at once under state-slot pressure, on the simulated executor: every
next turn still reuses its previous prompt, whose end is where the resent history leaves the chain the
answer started (``cache/eviction.is_shadowed``: an end past a prompt shadows nothing); and the
running requests' state slots stay in the pool's request band while the ends they leave fill it."""

from __future__ import annotations

import math

import pytest

from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.engine.build import assemble_engine
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.engine.roundcost import LinearRoundCost
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.runner.shapes import ShapeConfig
from radixflow_jax.sim.executor import SimExecutor, VirtualClock

SEQS, PAGE, GRID = 4, 16, 16


def _engine(num_slots: int):
    config = EngineConfig.from_options(max_num_seqs=SEQS, max_num_batched_tokens=64, page_size=PAGE, policy="pair")
    spec = EngineSpec(config=config, hybrid=True, chunk_sizes=(GRID,), num_pages=1 + 64 * math.ceil(512 / PAGE),
                      num_slots=num_slots, max_model_len=512)  # fmt: skip
    clock = VirtualClock()

    def make(shapes: ShapeConfig) -> SimExecutor:
        return SimExecutor(LinearRoundCost((1e-3, 1e-4, 0.0, 0.0, 0.0)), clock, shapes, overlap=False)

    return assemble_engine(spec, make, clock=clock)


def _altered(answer: tuple[int, ...], session: int) -> tuple[int, ...]:
    """What a client resends for ``answer``: other ids, half again as many (as re-tokenising does)."""
    longer = answer + answer[: len(answer) // 2]
    return tuple((7 * t + 11 * session + i) % 200 + 3 for i, t in enumerate(longer))


@pytest.mark.parametrize("num_slots", [40, 200])
def test_altered_resends_reuse_the_previous_prompt(num_slots: int) -> None:
    engine = _engine(num_slots)
    reqs = generate(WorkloadSpec("multiturn", 48, seed=5, arrival="all", vocab=256, max_tokens=6))
    sessions: dict[int, list] = {}
    for r in reqs:
        sessions.setdefault(r.group, []).append(r)
    history = {g: () for g in sessions}
    prev_prompt = {g: 0 for g in sessions}
    turn = {g: 0 for g in sessions}
    live: dict[int, int] = {}  # request id -> session
    hits: list[tuple[int, int]] = []  # (cached tokens, previous prompt length) of turns > 0

    def submit(g: int) -> None:
        r = sorted(sessions[g], key=lambda x: x.turn)[turn[g]]
        prompt = history[g] + r.prompt
        live[engine.add_request(prompt, SamplingParams(max_tokens=r.max_tokens, ignore_eos=True))] = g

    for g in sessions:
        submit(g)
    while engine.has_unfinished():
        outs = engine.step()
        # the running requests' slots stay in the request band (cache/pools.SlotPool): kept ends leave it
        assert all(r.slot <= SEQS for r in engine.scheduler.running if r.slot is not None)
        for out in outs:
            if not out.finished:
                continue
            g = live.pop(out.request_id)
            if turn[g] > 0:
                hits.append((out.cached_tokens, prev_prompt[g]))
            prev_prompt[g] = len(out.prompt_token_ids)
            history[g] = tuple(out.prompt_token_ids) + _altered(tuple(out.token_ids), g)
            turn[g] += 1
            if turn[g] < len(sessions[g]):
                submit(g)
    assert len(hits) == len(reqs) - len(sessions)
    assert all(cached >= prompt for cached, prompt in hits), [h for h in hits if h[0] < h[1]]
