"""Conversations at exact depth (docs/design.md, "Exact depth"): every turn resends the whole
history (prompt, the answer, a new message) once the turn before finished. Each turn must start at
the exact end of the one before (every token its state consumed) and compute only the new tokens
plus the last sampled one; every read is checked by the shadow executor, the engine is audited after
every round, and every output equals the cold run."""

from __future__ import annotations

import random

import pytest

from radixflow_jax.reliability.harness import Harness, shadow_engine
from radixflow_jax.reliability.soak import cold_tokens
from tests.reliability.scenarios import BASE, CACHING_POLICIES, GREEDY, check_run, engine, tokens

SESSIONS, TURNS = 6, 4


@pytest.mark.parametrize("policy", CACHING_POLICIES)
def test_each_turn_starts_at_the_exact_end_of_the_one_before(policy: str) -> None:
    rng = random.Random(3)
    h = Harness(engine(policy, num_pages=200, num_slots=40))
    system = tokens(rng, 37)  # shared by every session: off the page grid (pages of 8)
    turn_of: dict[int, int] = {}
    exact_end: dict[int, int] = {}
    starts: list[tuple[int, int]] = []  # (cached tokens, the previous turn's exact end) per later turn

    def finished(key: int, out) -> None:
        prompt = h.subs[key].prompt
        assert out.finish_reason == "length" and out.token_ids == cold_tokens(prompt, GREEDY.max_tokens, 1000)
        if key in exact_end:
            starts.append((out.cached_tokens, exact_end[key]))
        if turn_of[key] + 1 < TURNS:
            message = tokens(rng, rng.choice([1, 5, 19, 45]))  # 45 > the 32-token budget: cut on the grid
            nxt = h.follow_up(prompt + out.token_ids + message, GREEDY)
            turn_of[nxt] = turn_of[key] + 1
            exact_end[nxt] = len(prompt) + len(out.token_ids) - 1  # the last sampled token was never fed

    h.on_finished.append(finished)
    for s in range(SESSIONS):
        turn_of[h.submit(system + tokens(rng, rng.randint(1, 30)), GREEDY, at_round=s)] = 0
    report = h.run()
    cold = [cold_tokens(sub.prompt, GREEDY.max_tokens, 1000) for sub in h.subs]
    check_run(h, report, cold)
    assert len(starts) == SESSIONS * (TURNS - 1)
    assert all(cached == end for cached, end in starts), starts


@pytest.mark.parametrize("policy", CACHING_POLICIES)
def test_turns_come_back_from_the_host_tier_across_failed_steps(policy: str) -> None:
    """A state pool of two checkpoints below a host tier: most turns find their exact end demoted
    and read it back from host memory. The first two rounds that carry host copies fail (before the
    step, as a device error would): recovery voids them and flushes both tiers (their spills never
    landed), the turns recompute, every read is still checked and every output equals cold."""
    rng = random.Random(5)
    core = shadow_engine(BASE.with_options(policy=policy), num_pages=200, num_slots=1 + 4 + 2,
                         max_model_len=BASE.max_model_len, num_host_slots=32)  # fmt: skip
    failed: list[int] = []
    for name in ("execute", "launch"):  # the synchronous and the overlapped engine
        real = getattr(core.executor, name)

        def fail_host_rounds(plan, *args, real=real):
            if len(failed) < 2 and any(m.kind == "restore" for m in plan.state_moves):
                failed.append(len(core.records))
                raise RuntimeError("injected: a round with host copies failed")
            return real(plan, *args)

        setattr(core.executor, name, fail_host_rounds)
    h = Harness(core)
    turn_of: dict[int, int] = {}

    def finished(key: int, out) -> None:
        if turn_of[key] + 1 < TURNS:
            nxt = h.follow_up(h.subs[key].prompt + out.token_ids + tokens(rng, rng.choice([1, 5, 19])), GREEDY)
            turn_of[nxt] = turn_of[key] + 1

    h.on_finished.append(finished)
    for s in range(SESSIONS):
        turn_of[h.submit(tokens(rng, rng.randint(20, 40)), GREEDY, at_round=s)] = 0
    report = h.run()
    check_run(h, report, [cold_tokens(sub.prompt, GREEDY.max_tokens, 1000) for sub in h.subs])
    assert len(failed) == 2 and report.step_failures == 2 and report.by_reason()["length"] == SESSIONS * TURNS
    assert sum(r.restored for r in core.records) > 5  # host copies read back after the failures too
