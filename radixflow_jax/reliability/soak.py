"""The soak: a long random run through the reliability harness, nothing lost.

Requests share prefixes (``articles``), arrive a few per round, and are aborted at random (before a
round, or while the round that runs them executes); some open conversations whose next turn resends
the whole history (prompt, the answer, a new message) as soon as the turn before it finished, which
then should start at that turn's exact end (docs/design.md, "Exact depth"); random rounds fail (every fault kind); the
pools are small, so eviction and preemption are constant. After every round the harness audits
the engine (docs/design.md, "Radix cache with recurrent checkpoints" and exact ownership); every checkpoint a round reads is checked to
be committed; the shadow executor checks every context and state read; every completed greedy
output is compared with the cold output (the shadow model's next-token function applied to the
prompt, which is what a cache-off run computes: ``tests/reliability`` checks that equality on real
cold runs). ``tests/heavy/soak.py`` is the command line; ``tests/reliability/test_soak.py`` runs a
reduced size in CI. No JAX here.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.reliability.faults import FAULT_KINDS, Fault
from radixflow_jax.reliability.harness import Harness, shadow_engine, shadow_of
from radixflow_jax.engine.params import RequestOutput, SamplingParams
from radixflow_jax.reliability.shadow import token_for


@dataclasses.dataclass(frozen=True)
class SoakConfig:
    requests: int = 100_000
    policy: str = "pair"
    seed: int = 0
    per_round: float = 1.2  # mean arrivals per round
    abort_rate: float = 0.1  # share of requests aborted at a random later round
    mid_round_share: float = 0.5  # of those, aborted while their round runs
    fault_rate: float = 0.002  # share of rounds whose step fails (kinds drawn at random)
    articles: int = 16
    article_len: tuple[int, int] = (16, 160)
    question_len: tuple[int, int] = (1, 24)
    max_tokens: tuple[int, int] = (1, 12)
    num_pages: int = 112
    num_slots: int = 40
    num_host_slots: int = 24  # the host tier: demoted checkpoints come back by restores
    num_host_pages: int = 64  # and demoted KV pages by promotions
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 128
    page_size: int = 8
    max_model_len: int = 256
    vocab: int = 1000
    repeat_share: float = 0.1  # share of requests that resend one of the last 8 prompts (n > 1, retries: riders)
    conversation_share: float = 0.2  # share of requests that open a conversation
    more_turns: tuple[int, int] = (1, 4)  # further turns of a conversation, each sent when the one before finished
    message_len: tuple[int, int] = (1, 12)  # new tokens a turn appends after the answer before it
    speculative: bool = False  # n-gram drafts verified in one row (the shadow executor verifies them)


def cold_tokens(prompt: list[int], max_tokens: int, vocab: int) -> list[int]:
    """The shadow model's greedy output without any cache."""
    seq, out = list(prompt), []
    for _ in range(max_tokens):
        seq.append(token_for(seq, vocab))
        out.append(seq[-1])
    return out


def _soak_engine(cfg: SoakConfig, rng: random.Random, expected_rounds: int) -> EngineCore:
    """The shadow engine of the soak, with its faults drawn from ``rng`` over ``expected_rounds``."""
    ec = EngineConfig.from_options(
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens, page_size=cfg.page_size,
        max_model_len=cfg.max_model_len, policy=cfg.policy, warmup=False,
        speculative="ngram" if cfg.speculative else None,
    )
    faults = tuple(
        Fault(r, rng.choice(FAULT_KINDS)) for r in range(expected_rounds) if rng.random() < cfg.fault_rate
    )  # a fault is counted in step calls; calls past the last planned fault simply succeed
    return shadow_engine(
        ec, num_pages=cfg.num_pages, num_slots=cfg.num_slots, max_model_len=cfg.max_model_len, vocab=cfg.vocab,
        faults=faults, num_host_slots=cfg.num_host_slots, num_host_pages=cfg.num_host_pages,
    )


class _Outcomes:
    """Checks every finished request against the cold run, counts the outcomes, and sends the next
    turn of a conversation once the turn before it completed (``conversation_share`` of the
    submitted requests open one; its turns are drawn from a second generator seeded ``seed + 1``)."""

    def __init__(self, cfg: SoakConfig, h: Harness, prompts: dict[int, tuple[list[int], int]]):
        self.cfg, self.h, self.prompts = cfg, h, prompts
        kinds = ("completed", "aborted", "errors", "prompt_tokens", "cached_tokens", "checked")
        self.counts = dict.fromkeys((*kinds, "turns", "turns_at_exact_end"), 0)
        self.talk = random.Random(cfg.seed + 1)
        opens = (k for k in prompts if self.talk.random() < cfg.conversation_share)
        self.turns_left = {k: self.talk.randint(*cfg.more_turns) for k in opens}
        self.exact_end: dict[int, int] = {}

    def finished(self, key: int, out: RequestOutput) -> None:
        prompt, max_tokens = self.prompts.pop(key)
        at_end, counts = self.exact_end.pop(key, None), self.counts
        if out.finish_reason in ("abort", "error"):
            counts["aborted" if out.finish_reason == "abort" else "errors"] += 1
            self.turns_left.pop(key, None)  # the conversation ends with it
            return
        if out.token_ids != cold_tokens(prompt, max_tokens, self.cfg.vocab):
            raise AssertionError(f"request {key}: output {out.token_ids} differs from the cold run")
        counts["completed"] += 1
        counts["checked"] += 1
        counts["prompt_tokens"] += len(prompt)
        counts["cached_tokens"] += out.cached_tokens
        counts["turns_at_exact_end"] += at_end is not None and out.cached_tokens >= at_end
        self._next_turn(key, prompt, out)

    def _next_turn(self, key: int, prompt: list[int], out: RequestOutput) -> None:
        """The conversation's next turn, sent now: the history, the answer and a new message."""
        cfg, talk = self.cfg, self.talk
        left = self.turns_left.pop(key, 0)
        message = [talk.randrange(3, cfg.vocab) for _ in range(talk.randint(*cfg.message_len))]
        history, max_tokens = prompt + out.token_ids + message, talk.randint(*cfg.max_tokens)
        if left <= 0 or len(history) + max_tokens > cfg.max_model_len:
            return
        nxt = self.h.follow_up(history, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        self.prompts[nxt] = (history, max_tokens)
        self.turns_left[nxt] = left - 1
        self.exact_end[nxt] = len(prompt) + len(out.token_ids) - 1  # every token the turn before fed
        self.counts["turns"] += 1


def _submit_all(cfg: SoakConfig, h: Harness, rng: random.Random) -> dict[int, tuple[list[int], int]]:
    """Submits the soak's requests (prompts over shared articles, repeats, aborts); returns each
    submission's prompt and ``max_tokens``."""
    articles = [
        [rng.randrange(3, cfg.vocab) for _ in range(rng.randint(*cfg.article_len))] for _ in range(cfg.articles)
    ]
    arrival = 0.0
    prompts: dict[int, tuple[list[int], int]] = {}
    recent: list[list[int]] = []
    for _ in range(cfg.requests):
        arrival += rng.expovariate(cfg.per_round)
        prompt = rng.choice(articles) + [rng.randrange(3, cfg.vocab) for _ in range(rng.randint(*cfg.question_len))]
        max_tokens = rng.randint(*cfg.max_tokens)
        if recent and rng.random() < cfg.repeat_share:
            prompt = list(rng.choice(recent))  # an identical prompt soon after: it may ride the first
        prompt = prompt[: cfg.max_model_len - max_tokens]
        recent = (recent + [prompt])[-8:]
        abort_at, mid = None, False
        if rng.random() < cfg.abort_rate:
            abort_at, mid = int(arrival) + rng.randrange(0, 24), rng.random() < cfg.mid_round_share
        key = h.submit(
            prompt,
            SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            at_round=int(arrival),
            abort_at=abort_at,
            mid_round=mid,
        )
        prompts[key] = (prompt, max_tokens)
    return prompts


def run_soak(cfg: SoakConfig) -> dict[str, Any]:
    """Runs the soak; raises on the first violated invariant or wrong output; returns the report."""
    rng = random.Random(cfg.seed)
    expected_rounds = int(cfg.requests / cfg.per_round * 4) + 100
    core = _soak_engine(cfg, rng, expected_rounds)
    h = Harness(core, audit_before=False, keep_outputs=False)  # audited after every round
    outcomes = _Outcomes(cfg, h, _submit_all(cfg, h, rng))
    counts = outcomes.counts
    h.on_finished.append(outcomes.finished)
    start = time.perf_counter()
    report = h.run(max_ticks=expected_rounds * 4)
    wall = time.perf_counter() - start
    shadow = shadow_of(core)
    return {
        "policy": cfg.policy,
        "requests": cfg.requests + counts["turns"],
        "turns": counts["turns"],
        "turns_at_exact_end": counts["turns_at_exact_end"],
        "completed": counts["completed"],
        "aborted": counts["aborted"],
        "errors": counts["errors"],
        "refused": len(report.refused),
        "outputs_equal_cold": counts["checked"],
        "rounds": report.rounds,
        "ticks": report.ticks,
        "failed_steps": report.step_failures,
        "pool_rebuilds": report.resets,
        "preemptions": report.preemptions,
        "consumer_waits": sum(r.consumers_waiting + r.consumers_blocked for r in core.records),
        "riders": sum(r.riders for r in core.records),
        "invariant_audits": report.audits,
        "checkpoint_reads_checked": h.checkpoint_reads,
        "rows_checked_by_shadow": shadow.rows_checked,
        "paired_reads_checked": shadow.pair_reads,  # policy pair: in-round producer states taken
        "reuse": counts["cached_tokens"] / max(1, counts["prompt_tokens"]),
        "leaked_pages": core.scheduler.memory.pages.num_used,
        "leaked_slots": core.scheduler.memory.slots.num_used if core.scheduler.memory.slots else 0,
        "host_spills": sum(r.spilled for r in core.records),
        "host_restores": sum(r.restored for r in core.records),
        "host_kv_spills": sum(r.kv_spilled for r in core.records),
        "host_kv_restores": sum(r.kv_restored for r in core.records),
        "drafted_tokens": sum(r.drafted_tokens for r in core.records),
        "accepted_tokens": sum(r.accepted_tokens for r in core.records),
        "wall_s": wall,
    }
