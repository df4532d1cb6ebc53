"""Overlap inside the scheduler: the host side of a launched round, the rounds in flight and the
requests fenced until their commit. A mixin of :class:`~radixflow_jax.scheduler.scheduler.Scheduler`
(it uses the scheduler's config, memory, requests, running list and look-ahead), kept apart so the
admission scan and the commit fence read on their own; the rules are in the scheduler's module
docstring ("Overlap"). No JAX here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixflow_jax.scheduler.lookahead import WaitingIndex, placements
from radixflow_jax.scheduler.plan import UNKNOWN_TOKEN, RoundPlan
from radixflow_jax.scheduler.request import Request, RequestStatus

if TYPE_CHECKING:
    from radixflow_jax.scheduler.scheduler import Scheduler

    _Base = Scheduler
else:
    _Base = object


class OverlapMixin(_Base):
    def launch(self, plan: RoundPlan) -> None:
        """The host side of a round whose result is not known yet (overlap, see the module docstring):
        each row's request advances past its span and a sampling row appends ``UNKNOWN_TOKEN``.
        ``commit(plan, ...)`` must follow, in launch order."""
        fence = self.round_index + len(self._in_flight)
        for row in plan.rows:  # nothing may change the scheduler between a plan and its launch
            req = self.requests[row.request_id]
            if req.status is not RequestStatus.RUNNING or row.epoch != req.epoch:
                raise ValueError(f"launch of a stale plan: request {req.request_id} left or restarted after planning")
            self._publish_in_flight_kv(req, row.start, row.start + len(row.tokens))
            req.num_computed = row.start + len(row.tokens)
            req.in_flight += len(row.tokens)
            req.fence = fence
            if row.sample:
                req.output.append(UNKNOWN_TOKEN)
                req.unresolved += 1
        self._in_flight.append(plan)

    def _publish_in_flight_kv(self, req: Request, start: int, end: int) -> None:
        """Attention-only models: the full pages a launched row writes become pending KV of ``req``
        until its commit, so a request planned while the round runs (overlap) that shares them is a
        consumer (it waits for the commit and then hits) instead of computing the prefix cold. A
        hybrid's rows publish theirs when their checkpoints are planted. Without overlap the round
        commits before the next plan, so nothing planned ever sees this pending KV; the round being
        planned never does (it is published at launch). Only a row that fills a new page publishes
        (most decode rows do not), so the tree is walked rarely."""
        cache, p = self.memory.cache, self.config.page_size
        if cache is None or self.config.hybrid:
            return
        depth = min(end, req.num_tokens - req.unresolved) // p * p
        if depth > start // p * p:
            cache.plant_pending(req.tokens[:depth], depth, None, req.request_id, req.pages)

    @property
    def num_in_flight(self) -> int:
        """Rounds launched and not committed."""
        return len(self._in_flight)

    @property
    def fenced(self) -> tuple[Request, ...]:
        """Finished requests whose pages and slot wait for the commit fence of a round in flight."""
        return tuple(req for req, _ in self._fenced)

    def plants_on_unknown(self) -> bool:
        """Whether some running request's next decode row would plant a checkpoint on a path that ends
        in a token a round in flight samples (the engine then commits that round before planning)."""
        g = self.config.grid
        for req in self.running:
            q = req.num_computed
            if req.unresolved and req.remaining == 1 and (q + 1) % g == 0:
                if placements(self._lookahead, req, q, q + 1, None, WaitingIndex(g)):
                    return True
        return False

    def drop_in_flight(self) -> None:
        """A launched round failed: every round in flight is void. Releases the fenced requests; the
        caller requeues the running ones (``requeue_running``), which drops their uncommitted work."""
        self._in_flight.clear()
        fenced, self._fenced = self._fenced, []
        for req, _ in fenced:
            self.memory.release(req, keep_prefix=False)
