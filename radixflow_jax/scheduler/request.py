"""A request as the scheduler sees it: token ids, budgets, and what it holds in the cache.

Invariants:
  * ``tokens = prompt + output``; the KV and recurrent state of ``tokens[:num_computed]`` are in
    ``pages`` / ``slot``. Each round computes a span ``tokens[num_computed:end]`` and samples the
    next token iff ``end == len(tokens)`` (decode is the one-token case; a recompute after
    preemption is a long prefill that ends in a sample).
  * ``pages`` lists the request's page table; ``own_pages`` the subset it allocated itself and holds
    one reference to (the rest belong to the radix tree and are protected by ``hit_node``'s lock).
  * ``slot`` is the request's own recurrent-state slot (one reference), ``None`` until admitted and
    for attention-only models; ``spare_slot`` (speculative decoding, hybrid models) a second one,
    where a verify row writes its state (``scheduler/drafts.py``).
  * Overlap (a round launched before the previous one committed): ``num_computed`` counts the tokens
    of launched rounds too; ``uncommitted_tokens`` of them are not committed yet. The last
    ``unknown_tokens`` entries of ``output`` are ``UNKNOWN_TOKEN`` (sampled by launched rounds, filled
    in at their commit). ``last_launch``: the launch index of the last round holding a row of the
    request; its pages and slot are released no earlier than that round's commit. ``epoch`` counts
    preemptions and roll-backs (a row of an earlier epoch is stale).
  * Only this module and the allocator (``scheduler/allocator.py``: seating, pages, release) change
    a request's fields, through the methods below (``tests/test_layering.py`` checks it); everything
    else reads them. A request's life: ``Allocator.seat`` -> :meth:`Request.start_running` -> per
    round :meth:`Request.launch` (overlap) and :meth:`Request.commit_span` /
    :meth:`Request.commit_token` -> :meth:`Request.finish`, or back to the queue with
    :meth:`Request.requeue` after ``Allocator.release``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any

from radixflow_jax.scheduler.plan import UNKNOWN_TOKEN


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclasses.dataclass(eq=False)  # identity equality: queues test membership by object
class Request:
    request_id: int
    prompt: tuple[int, ...]
    max_tokens: int
    stop_token_ids: frozenset[int] = frozenset()
    arrival_time: float = 0.0
    output: list[int] = dataclasses.field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    pages: list[int] = dataclasses.field(default_factory=list)
    own_pages: list[int] = dataclasses.field(default_factory=list)
    slot: int | None = None
    num_computed: int = 0
    cached_tokens: int = 0
    hit_node: Any = None
    restore_node: Any = None  # waiting: the node it had restored, locked until it is seated (Allocator.hold_restore)
    consumer_waits: int = 0
    twin_waits: int = 0  # rounds it waited to ride a twin that computed nothing (scheduler/riders.py)
    num_preemptions: int = 0
    num_rollbacks: int = 0  # times its paired producer or twin left before their round committed
    first_token_round: int | None = None
    uncommitted_tokens: int = 0
    unknown_tokens: int = 0
    last_launch: int = -1
    epoch: int = 0
    state_depth: int = 0  # set by finish(): tokens its slot and pages hold once its launched rounds commit
    speculate: bool = False  # its decode rows may carry drafted tokens (scheduler/drafts.py)
    spare_slot: int | None = None  # a verify row's output slot (hybrid models; one reference)
    draft_len: int = 0  # its next draft's length (0: the config's num_draft)
    num_drafted: int = 0
    num_accepted: int = 0
    num_verify_rows: int = 0

    @functools.cached_property
    def prompt_key(self) -> int:
        """``hash(prompt)``, computed once: the key under which requests with identical prompts meet
        (riders, ``scheduler/riders.py``); equal keys are confirmed by comparing the prompts."""
        return hash(self.prompt)

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.prompt + tuple(self.output)

    def token_span(self, start: int, end: int) -> tuple[int, ...]:
        """``tokens[start:end]`` without building the whole sequence (a decode row's one token)."""
        p = len(self.prompt)
        if start >= p:
            return tuple(self.output[start - p : end - p])
        if end <= p:
            return self.prompt[start:end]
        return self.prompt[start:] + tuple(self.output[: end - p])

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def committed_output(self) -> list[int]:
        """``output`` without the tokens of rounds still in flight."""
        return self.output[: len(self.output) - self.unknown_tokens] if self.unknown_tokens else list(self.output)

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next sample."""
        return self.num_tokens - self.num_computed

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


    # ----------------------------------------------------------------- changes (the module docstring)
    def start_running(self) -> None:
        """Admitted: taken off the queue and into the running set (seated by the allocator first)."""
        self.status = RequestStatus.RUNNING

    def count_consumer_wait(self) -> None:
        """One more round waited as a consumer of a pending checkpoint (``max_consumer_wait``)."""
        self.consumer_waits += 1

    def count_twin_wait(self) -> None:
        """One more round waited to ride a twin that computed nothing (``scheduler/riders.py``)."""
        self.twin_waits += 1

    def launch(self, start: int, end: int, *, sample: bool, launch_index: int) -> None:
        """A row computing ``tokens[start:end]`` was launched as round ``launch_index`` (overlap): the
        request advances past it before its result exists; a sampling row appends ``UNKNOWN_TOKEN``."""
        self.num_computed = end
        self.uncommitted_tokens += end - start
        self.last_launch = launch_index
        if sample:
            self.output.append(UNKNOWN_TOKEN)
            self.unknown_tokens += 1

    def commit_span(self, start: int, end: int, *, launched: bool) -> None:
        """The row computing ``tokens[start:end]`` committed: a launched row's tokens stop being
        uncommitted; otherwise the request advances to ``end`` now."""
        if launched:
            self.uncommitted_tokens -= end - start
        else:
            self.num_computed = end

    def commit_token(self, token: int, end: int, *, launched: bool, round_index: int) -> None:
        """The token the row ending at ``end`` sampled, committed in round ``round_index``: a launched
        row's ``UNKNOWN_TOKEN`` at that position is filled in; otherwise the token is appended."""
        if launched:
            self.output[end - len(self.prompt)] = token
            self.unknown_tokens -= 1
        else:
            self.output.append(token)
        if self.first_token_round is None:
            self.first_token_round = round_index

    def commit_verify(
        self, *, start: int, end: int, tokens: tuple[int, ...], computed: int, swap: bool, drafted: int,
        accepted: int, draft_len: int, launched: bool, round_index: int,
    ) -> None:
        """A verify row of ``tokens[start:end]`` (drafts included) committed (``scheduler/drafts.py``):
        it appends ``tokens``, its state covers ``computed`` tokens, and with ``swap`` the spare slot
        (holding the state after the row's last accepted token) becomes the request's slot. A launched row's
        ``UNKNOWN_TOKEN`` (the last entry: nothing is launched behind a verify row) is dropped first."""
        if launched:
            self.uncommitted_tokens -= end - start
            self.output.pop()
            self.unknown_tokens -= 1
        self.num_computed = computed
        self.output.extend(tokens)
        if swap:
            self.slot, self.spare_slot = self.spare_slot, self.slot
        self.num_drafted += drafted
        self.num_accepted += accepted
        self.num_verify_rows += 1
        self.draft_len = draft_len
        if self.first_token_round is None:
            self.first_token_round = round_index

    def truncate_output(self, num_output: int) -> None:
        """Keeps the first ``num_output`` output tokens (a stop string ended the request inside the
        tokens a verify row committed; nothing of it is in flight). Where its state covered tokens
        it drops, ``num_computed`` (and so ``state_depth``) exceeds its tokens, so its release keeps
        no end (``Allocator.release``: only a state within the tokens is kept)."""
        if self.unknown_tokens or not 0 < num_output <= len(self.output):
            raise ValueError(f"request {self.request_id}: cannot keep {num_output} of {len(self.output)} output tokens")
        del self.output[num_output:]

    def drop_uncommitted(self) -> None:
        """Forgets the uncommitted work (overlap): back to the last committed token."""
        if self.unknown_tokens:
            del self.output[-self.unknown_tokens :]
            self.unknown_tokens = 0
        self.num_computed -= self.uncommitted_tokens
        self.uncommitted_tokens = 0

    def requeue(self, *, preempted: bool) -> None:
        """Back to the queue holding nothing (the allocator released it): its uncommitted work is
        dropped, its rows of earlier rounds turn stale (a new epoch), and it recomputes from scratch.
        Counted as a preemption, else as a roll-back (its paired producer or twin left)."""
        self.drop_uncommitted()
        self.epoch += 1
        self.status, self.num_computed, self.cached_tokens = RequestStatus.WAITING, 0, 0
        if preempted:
            self.num_preemptions += 1
        else:
            self.num_rollbacks += 1

    def finish(self, reason: str) -> None:
        """Finished for ``reason``; its uncommitted work is dropped (rounds in flight discard theirs).
        ``state_depth`` records what its slot and pages will hold once those rounds ran: every token
        launched rows fed (overlap: a row in flight may feed the token that ended it), all of them
        known by now (a row feeds only tokens sampled by rounds before it)."""
        self.state_depth = self.num_computed
        self.drop_uncommitted()
        self.status, self.finish_reason = RequestStatus.FINISHED, reason

    def amend_finish_reason(self, reason: str) -> None:
        """A finished request's reason, restated (its last allowed token also ended it another way)."""
        if not self.is_finished:
            raise ValueError(f"request {self.request_id} has not finished")
        self.finish_reason = reason
