"""A request as the scheduler sees it: token ids, budgets, and what it holds in the cache.

Invariants:
  * ``tokens = prompt + output``; the KV and recurrent state of ``tokens[:num_computed]`` are in
    ``pages`` / ``slot``. Each round computes a span ``tokens[num_computed:end]`` and samples the
    next token iff ``end == len(tokens)`` (decode is the one-token case; a recompute after
    preemption is a long prefill that ends in a sample).
  * ``pages`` lists the request's page table; ``own_pages`` the subset it allocated itself and holds
    one reference to (the rest belong to the radix tree and are protected by ``hit_node``'s lock).
  * ``slot`` is the request's own recurrent-state slot (one reference), ``None`` until admitted and
    for attention-only models.
  * Overlap (a round launched before the previous one committed): ``num_computed`` counts the tokens
    of launched rounds too; ``in_flight`` of them are not committed yet. The last ``unresolved``
    entries of ``output`` are ``UNKNOWN_TOKEN`` (sampled by launched rounds, filled in at their
    commit). ``fence``: the launch index of the last round holding a row of the request; its pages
    and slot are released no earlier than that round's commit. ``epoch`` counts preemptions and
    roll-backs (a row of an earlier epoch is stale).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any


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
    consumer_waits: int = 0
    twin_waits: int = 0  # rounds it waited to ride a twin that computed nothing (scheduler/riders.py)
    num_preemptions: int = 0
    rolled_back: int = 0  # times its paired producer left before their round committed (policy pair)
    first_token_round: int | None = None
    in_flight: int = 0
    unresolved: int = 0
    fence: int = -1
    epoch: int = 0

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
        return self.output[: len(self.output) - self.unresolved] if self.unresolved else list(self.output)

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next sample."""
        return self.num_tokens - self.num_computed

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


def drop_in_flight(req: Request) -> None:
    """Forgets the uncommitted work of ``req`` (overlap): back to its last committed token."""
    if req.unresolved:
        del req.output[-req.unresolved :]
        req.unresolved = 0
    req.num_computed -= req.in_flight
    req.in_flight = 0
