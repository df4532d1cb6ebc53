"""Speculative decoding on the host (``scheduler/drafts.py``), without a model: n-gram drafts, the
greedy acceptance rule, and what a verify row plans and commits (state slot, computed tokens,
output), checked against the allocator's books."""

from __future__ import annotations

import pytest

from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.drafts import (
    SpeculativeConfig,
    accepted_length,
    next_draft_len,
    ngram_draft,
    verified_tokens,
)
from radixflow_jax.scheduler.request import Request
from radixflow_jax.scheduler.scheduler import Scheduler


def test_ngram_draft_takes_the_most_recent_longest_match() -> None:
    tokens = (1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 2, 3)
    assert ngram_draft(tokens, 3, max_n=4, min_n=2) == (5, 6, 7)  # "2 3" last seen before 5 6 7
    assert ngram_draft(tokens, 1, max_n=4, min_n=2) == (5,)
    assert ngram_draft((1, 2, 3, 1, 2, 3), 4, max_n=3, min_n=2) == (1, 2, 3)  # the 3-gram "1 2 3" at 0
    assert ngram_draft((1, 2, 3, 4), 4, max_n=3, min_n=2) == ()
    assert ngram_draft((7, 7), 2, max_n=2, min_n=2) == ()  # the suffix itself is no earlier match


def test_ngram_draft_prefers_an_occurrence_that_k_tokens_follow() -> None:
    assert ngram_draft((1,) * 6, 3, max_n=3, min_n=2) == (1, 1, 1)  # not the one token after the latest
    tokens = (5, 6, 1, 2, 3, 9, 5, 6, 7, 5, 6)
    assert ngram_draft(tokens, 4, max_n=2, min_n=2) == (1, 2, 3, 9)  # 3 tokens follow the latest "5 6"
    assert ngram_draft(tokens, 3, max_n=2, min_n=2) == (7, 5, 6)  # the latest, when k tokens follow it


def test_greedy_rule() -> None:
    assert accepted_length((5, 6, 7), (5, 6, 7)) == 3
    assert accepted_length((5, 6, 7), (5, 9, 7)) == 1
    assert verified_tokens((5, 6, 7), (5, 6, 7), bonus=8) == (5, 6, 7, 8)
    assert verified_tokens((5, 6, 7), (5, 9, 7), bonus=8) == (5, 9)  # the correction, not the bonus
    assert verified_tokens((5,), (4,), bonus=8) == (4,)
    assert next_draft_len(4, 4, 4) == 4 and next_draft_len(4, 1, 4) == 2 and next_draft_len(2, 0, 4) == 1


def test_config_checks() -> None:
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig(method="eagle")
    with pytest.raises(ValueError, match="num_draft"):
        SpeculativeConfig(num_draft=0)
    assert SchedulerConfig(speculative="ngram").speculative == SpeculativeConfig()
    assert SchedulerConfig(speculative={"num_draft": 2}).speculative.num_draft == 2


def _scheduler(hybrid: bool) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=64, page_size=16, grid=16, hybrid=hybrid,
        speculative=SpeculativeConfig(num_draft=3),
    )  # fmt: skip
    return Scheduler(config, num_pages=64, num_slots=16)


def _decode_until_verify(sched: Scheduler, req: Request, outputs: list[int]):
    """Runs rounds sampling ``outputs`` with no draft, then returns the next round's plan: a verify row."""
    for token in outputs:
        plan = sched.schedule()
        assert not plan.rows[0].num_draft
        sched.commit(plan, {req.request_id: token})
    plan = sched.schedule()
    assert plan.rows[0].num_draft
    return plan


@pytest.mark.parametrize("hybrid", [True, False])
@pytest.mark.parametrize("answer", ["all", "one", "none"])
def test_a_verify_row_commits_the_greedy_tokens_and_the_right_state(hybrid: bool, answer: str) -> None:
    sched = _scheduler(hybrid)
    prompt = (3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
    req = Request(0, prompt, max_tokens=20, speculate=True)
    sched.add(req)
    plan = _decode_until_verify(sched, req, [20, 3, 4])  # "3 4" repeats the prompt's start: draft 5 6 7
    row = plan.rows[0]
    assert row.num_draft == 3 and row.tokens[-3:] == (5, 6, 7) and row.emits == ()
    start, slot, spare = row.start, req.slot, req.spare_slot
    if hybrid:  # reads the request's state, writes its spare slot
        assert row.copy_from == slot and row.slot == spare and spare not in (None, slot)
    verified = {"all": (5, 6, 7), "one": (5, 9, 9), "none": (2, 2, 2)}[answer]
    sched.commit(plan, {req.request_id: 42}, {req.request_id: verified})
    expected = {"all": [5, 6, 7, 42], "one": [5, 9], "none": [2]}[answer]
    assert req.output == [20, 3, 4] + expected
    accepted = {"all": 3, "one": 1, "none": 0}[answer]
    # hybrid: the spare slot holds the state after the last accepted token (runner/rollback.py);
    # attention only: the KV of every accepted token stays
    assert req.num_computed == row.known_end + accepted == start + 1 + accepted
    if hybrid:
        assert (req.slot, req.spare_slot) == (spare, slot)
    assert req.num_computed <= req.num_tokens - 1
    assert (req.num_drafted, req.num_accepted) == (3, accepted)
    nxt = sched.schedule().rows[0]
    assert nxt.start == req.num_computed and nxt.known_end == req.num_tokens
    assert nxt.known_end - nxt.start == 1  # only the token the verify row sampled: nothing recomputed


def test_a_stop_token_inside_the_accepted_draft_ends_the_request_there() -> None:
    sched = _scheduler(hybrid=True)
    req = Request(0, (3, 4, 5, 6, 7, 8, 9, 10), max_tokens=20, stop_token_ids=frozenset({6}), speculate=True)
    sched.add(req)
    plan = _decode_until_verify(sched, req, [20, 3, 4])
    finished = sched.commit(plan, {req.request_id: 42}, {req.request_id: (5, 6, 7)})
    assert finished == [req] and req.output == [20, 3, 4, 5, 6] and req.finish_reason == "stop"
    assert req.state_depth == plan.rows[0].start  # a cut: not the state after the dropped draft tokens
    sched.memory.flush()
    assert sched.memory.slots.num_used == 0 and sched.memory.pages.num_used == 0


def test_max_tokens_cuts_the_draft() -> None:
    sched = _scheduler(hybrid=False)
    req = Request(0, (3, 4, 5, 6, 7, 8, 9, 10), max_tokens=5, speculate=True)
    sched.add(req)
    plan = _decode_until_verify(sched, req, [20, 3, 4])
    assert plan.rows[0].num_draft == 1  # room for one drafted token and the model's next
    sched.commit(plan, {req.request_id: 42}, {req.request_id: (5,)})
    assert req.output == [20, 3, 4, 5, 42] and req.finish_reason == "length"


def test_drafts_fill_the_padding_of_the_variant() -> None:
    """A request whose draft length dropped (a rejection) drafts that much into a round's paid
    slots; where the variant the round runs in has padding slots, its draft grows into them, up
    to ``num_draft`` (``RunningSet.fill_drafts``)."""
    sched = _scheduler(hybrid=True)
    req = Request(0, tuple(range(3, 20)) * 2, max_tokens=30, speculate=True)
    sched.add(req)
    sched.commit(sched.schedule(), {0: 3})  # "19 3" occurred in the prompt: drafts 4 5 6 next
    req.draft_len = 1  # as after a rejected draft (next_draft_len)
    assert sched.schedule().rows[0].tokens[-1:] == (4,)
    sched.pad_tokens = lambda plan: 16  # the round runs in a variant of 16 token slots
    row = sched.schedule().rows[0]
    assert row.num_draft == 3 and row.tokens[-3:] == (4, 5, 6) and len(row.pages) * 16 >= row.start + len(row.tokens)


def test_a_hybrid_request_drafts_only_behind_one_known_token() -> None:
    """The step keeps a verify row's state per drafted position only for a row that feeds one known
    token (``runner/rollback.py``): a hybrid prompt's last chunk samples without a draft, where an
    attention-only model's drafts behind it."""
    prompt = tuple(range(10, 80)) + (3, 4, 5, 6, 7, 3, 4)  # "3 4" occurred: 5 6 7 drafts behind it
    for hybrid, drafts in ((True, 0), (False, 3)):
        sched = _scheduler(hybrid)
        sched.add(Request(0, prompt, max_tokens=20, speculate=True))
        sched.commit(sched.schedule(), {})  # the prompt's first 64 tokens (the round's budget)
        row = sched.schedule().rows[0]
        assert len(row.tokens) - row.num_draft == len(prompt) - 64 and row.num_draft == drafts


def test_a_model_drafter_replaces_the_lookup() -> None:
    """``Scheduler.drafter`` (a draft model, ``engine/drafter.py``) proposes the drafts: asked with
    the request's tokens and the draft length, cut to that length."""
    sched = _scheduler(hybrid=True)
    asked = []
    sched.drafter = lambda tokens, k: asked.append((tuple(tokens), k)) or (7, 8, 9, 10, 11)
    req = Request(0, (3, 4, 5, 6), max_tokens=20, speculate=True)
    sched.add(req)
    sched.commit(sched.schedule(), {0: 30})
    row = sched.schedule().rows[0]
    assert row.tokens == (30, 7, 8, 9) and row.num_draft == 3 and asked == [((3, 4, 5, 6, 30), 3)]


def test_a_model_drafter_drafts_the_round_at_once() -> None:
    """A drafter with ``prefetch`` (``engine/drafter.ModelDrafter``) gets every running request that
    will speculate before the round is planned, in one call."""

    class Batched:
        def __init__(self) -> None:
            self.batches: list[list[tuple[int, ...]]] = []

        def prefetch(self, requests) -> None:
            self.batches.append([tuple(t) for t in requests])

        def __call__(self, tokens, k):
            return (7, 8, 9)[:k]

    sched, drafter = _scheduler(hybrid=True), Batched()
    sched.drafter = drafter
    for i in range(2):
        sched.add(Request(i, (3, 4, 5 + i), max_tokens=20, speculate=True))
    sched.commit(sched.schedule(), {0: 30, 1: 31})
    plan = sched.schedule()
    assert drafter.batches[-1] == [(3, 4, 5, 30), (3, 4, 6, 31)]
    assert all(row.num_draft == 3 for row in plan.rows)
