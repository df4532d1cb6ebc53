"""Riders: a waiting request whose prompt is identical to a running request's rides the round that
completes that prompt, and computes none of it. No JAX here.

The case is ``n > 1`` / ``best_of`` (``engine/siblings.py``: the samples of one prompt are sibling
requests queued together), and any client that sends the same prompt twice. Prefix matching alone
leaves each further sibling the tokens past the deepest checkpoint (less than one grid step) to
compute, since checkpoints lie on the grid and the tree holds full pages only. A rider instead
takes, in the producer's round:

  * its first token, sampled from the producer row's last-position logits with its own sampling
    settings and seed (a row of no tokens whose ``logits_index`` is the producer's last token);
  * the producer's state after the whole prompt, which the producer row emits at its span end into
    the rider's own slot (hybrid models);
  * the producer's full prompt pages, shared (the rider takes its own reference on each), and its
    own copy of the partial last page, which the executor copies after the step
    (``RoundPlan.page_copies``).

So ``n`` samples of a prompt of ``P`` tokens compute ``P`` prompt tokens in all, and each rider
reports all ``P`` as cached. From its next round a rider is an ordinary running request.

Rules:
  * A producer is a running request with no output yet whose row in this round ends its prompt and
    samples (not a rider itself); a rider is a waiting request with nothing computed and no output
    (a preempted request that already generated tokens recomputes as usual).
  * While its twin is still computing its prompt in earlier rounds, a request waits (``WAIT``)
    instead of pairing with or reading the twin's grid checkpoints, which would compute part of the
    prompt again; it then rides the twin's last prompt round, so waiting costs it no latency. A
    round in which no twin computes counts against ``max_consumer_wait`` (``Request.twin_waits``,
    apart from the consumer waits), so a request never waits forever on a stalled twin.
  * Riders are rolled back with their producer as paired consumers are (``running.py``): until the
    producer's round commits, a producer that leaves sends its riders back to the head of the queue.
    A rider whose row leaves the plan before launch takes its emit and page copy with it
    (``RoundBuilder.build``).
  * Riders need the prefix cache on (not under policy ``no-cache``; they are a form of prefix reuse) and
    ``SchedulerConfig.riders``; they are the same under every policy.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixflow_jax.cache.partners import Partners
from radixflow_jax.scheduler.admission import Decision
from radixflow_jax.scheduler.allocator import Allocator
from radixflow_jax.scheduler.builder import RoundBuilder
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.plan import RowPlan
from radixflow_jax.scheduler.request import Request


class Riders:
    """Finds a waiting request's twin and boards it (the module docstring). ``of``: producer id ->
    ids of its riders whose round has not committed yet (``cache/partners.py``; the running set
    takes them to roll them back, and drops a rider that leaves)."""

    def __init__(self, config: SchedulerConfig, memory: Allocator):
        self._config = config
        self._memory = memory
        self.by_producer = Partners()

    @property
    def enabled(self) -> bool:
        return self._config.riders and self._memory.cache is not None

    def decide(self, req: Request, round_: RoundBuilder, running: Iterable[Request], *, wait: bool) -> Decision | None:
        """``ADMIT`` (``req`` boarded its twin's round), ``WAIT`` (its twin computes the prompt
        in a later round; only with ``wait``: a policy whose consumers wait, not ``native``, whose
        consumer stops the scan as before) or ``None`` (no twin, or boarding is not possible now:
        the usual admission path decides)."""
        if not self.enabled or req.output or req.num_computed:
            return None
        twins = round_.prompt_twins(req, running)  # running requests: never ``req``, which waits
        if not twins:
            return None
        progressing = False
        for twin in twins:
            row = round_.row_of(twin.request_id)
            if row is not None and row.sample and not row.is_rider and row.start + len(row.tokens) == len(req.prompt):
                if self._board(req, twin, row, round_):
                    return Decision.ADMIT
                return None  # no slot or page for it now: admitted (or deferred) as usual
            progressing = progressing or (row is not None and not row.is_rider)
        if not wait:
            return None
        if not progressing:  # no twin computes this round: such waits are bounded
            if req.twin_waits >= self._config.max_consumer_wait:
                return None
            req.count_twin_wait()
        round_.stats.riders_waiting += 1
        return Decision.WAIT

    def _board(self, req: Request, producer: Request, row: RowPlan, round_: RoundBuilder) -> bool:
        memory, page = self._memory, self._config.page_size
        length = len(req.prompt)
        shared = producer.pages[: length // page]
        if not memory.seat(req, computed=length, end=length, shared_pages=shared, slot=self._config.hybrid):
            return False  # no slot, or no page for a partial last page
        copies = ((producer.pages[length // page], req.pages[length // page]),) if length % page else ()
        round_.add_rider(req, row, copies)
        self.by_producer.add(producer.request_id, req.request_id)
        round_.stats.riders += 1
        return True

    def committed(self, rows: Iterable[RowPlan]) -> None:
        """The round holding these rows committed: its riders no longer depend on their producers."""
        for row in rows:
            if row.twin_id is not None:
                self.by_producer.discard(row.twin_id, row.request_id)
