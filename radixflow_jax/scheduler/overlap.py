"""The launched rounds: rounds launched and not committed, and finished requests fenced until the
commit of the last launched round that holds a row of them. No JAX here.

Overlap (the engine plans round r+1 while the device runs round r): :meth:`LaunchedRounds.launch` applies
the host side of a round before its result exists (``Request.launch``: ``num_computed`` advances, a
sampling row appends ``UNKNOWN_TOKEN``), so the next ``schedule()`` plans from there; ``Scheduler.commit`` then fills in
the sampled tokens, in launch order. Round r's checkpoints stay pending for the plan of r+1 (they
commit at r's fence, depth by depth).

Invariants:
  * Rounds commit in launch order: :meth:`LaunchedRounds.retire` accepts only the oldest round in flight
    (or, with none in flight, a round that was never launched).
  * A request that finishes or is aborted while a launched round still holds a row of it (its
    ``last_launch`` is that round's launch index) is released at that round's commit fence, never before
    (:meth:`LaunchedRounds.release`, :meth:`LaunchedRounds.release_due`). A preempted or rolled-back request is
    released at once: its rows in flight are stale (skipped at commit by their epoch), and a page or
    slot given to another row can only be written by a later round, which the device runs after the
    rounds in flight (the pools are threaded from one step into the next).
  * Attention-only models: the full pages a launched row writes are pending KV of its request until
    the commit (:meth:`LaunchedRounds.launch`), so a request planned meanwhile that shares them waits for
    that commit and then hits, instead of computing the prefix cold.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping

from radixflow_jax.scheduler.allocator import Allocator
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.lookahead import WaitingIndex, placements
from radixflow_jax.scheduler.plan import RoundPlan
from radixflow_jax.scheduler.request import Request, RequestStatus


class LaunchedRounds:
    def __init__(self, config: SchedulerConfig, memory: Allocator):
        self._config = config
        self._memory = memory
        self._rounds: collections.deque[RoundPlan] = collections.deque()  # launched, not committed
        self._fenced: list[tuple[Request, bool]] = []  # (finished request, keep_prefix), released at a fence

    def __len__(self) -> int:
        """Rounds launched and not committed."""
        return len(self._rounds)

    @property
    def restores(self) -> tuple[int, ...]:
        """Restore ids (``cache/tiers.py``) of the rounds launched and not committed."""
        return tuple(rid for plan in self._rounds for rid in plan.restores)

    @property
    def fenced(self) -> tuple[Request, ...]:
        """Finished requests whose pages and slot wait for the commit fence of a round in flight."""
        return tuple(req for req, _ in self._fenced)

    def launch(self, plan: RoundPlan, requests: Mapping[int, Request], round_index: int) -> None:
        """The host side of ``plan``, launched after ``round_index`` rounds committed: each row's
        request advances past its span and a sampling row appends ``UNKNOWN_TOKEN``."""
        launch_index = round_index + len(self._rounds)
        for row in plan.rows:  # nothing may change the scheduler between a plan and its launch
            req = requests[row.request_id]
            if req.status is not RequestStatus.RUNNING or row.epoch != req.epoch:
                raise ValueError(f"launch of a stale plan: request {req.request_id} left or restarted after planning")
            self._publish_kv(req, row.start, row.start + len(row.tokens))
            req.launch(row.start, row.start + len(row.tokens), sample=row.sample, launch_index=launch_index)
        self._rounds.append(plan)

    def _publish_kv(self, req: Request, start: int, end: int) -> None:
        """Attention-only models: publishes the full pages of ``[start, end)`` as pending KV of ``req``
        (module docstring). A hybrid's rows publish theirs when their checkpoints are planted.
        Without overlap the round commits before the next plan, so nothing planned ever sees this
        pending KV; the round being planned never does (it is published at launch). Only a row that
        fills a new page publishes (most decode rows do not), so the tree is walked rarely."""
        cache, p = self._memory.cache, self._config.page_size
        if cache is None or self._config.hybrid:
            return
        depth = min(end, req.num_tokens - req.unknown_tokens) // p * p
        if depth > start // p * p:
            cache.plant_pending(req.tokens[:depth], depth, None, req.request_id, req.pages)

    def retire(self, plan: RoundPlan) -> bool:
        """``plan`` commits: whether it was launched (it leaves the record). ``ValueError`` if rounds
        are in flight and ``plan`` is not the oldest."""
        if self._rounds and self._rounds[0] is plan:
            self._rounds.popleft()
            return True
        if self._rounds:
            raise ValueError("commit of a plan that is not the oldest round in flight")
        return False

    def release(self, req: Request, round_index: int, *, keep_prefix: bool) -> None:
        """A finished ``req`` gives up its pages and slot: now, or at the fence of the launched round
        that still uses them (``round_index``: rounds committed)."""
        if req.last_launch >= round_index:
            self._fenced.append((req, keep_prefix))
        else:
            self._memory.release(req, keep_prefix=keep_prefix)

    def release_due(self, round_index: int) -> None:
        """After a commit (``round_index`` rounds committed): releases the fenced requests whose last
        launched round has committed."""
        if not self._fenced:
            return
        fenced, self._fenced = self._fenced, []
        for req, keep_prefix in fenced:
            if req.last_launch < round_index:
                self._memory.release(req, keep_prefix=keep_prefix)
            else:
                self._fenced.append((req, keep_prefix))

    def drop(self) -> None:
        """A launched round failed: every round in flight is void, and the fenced requests are
        released (their rounds will never commit)."""
        self._rounds.clear()
        fenced, self._fenced = self._fenced, []
        for req, _ in fenced:
            self._memory.release(req, keep_prefix=False)

    def plants_on_unknown(self, running: Iterable[Request]) -> bool:
        """Whether some running request's next decode row would plant a checkpoint on a path that ends
        in a token a round in flight samples (the engine then commits that round before planning)."""
        g = self._config.grid
        for req in running:
            q = req.num_computed
            on_grid = req.unknown_tokens and req.remaining == 1 and (q + 1) % g == 0
            if on_grid and placements(self._config, req, q, q + 1, None, WaitingIndex(g)):
                return True
        return False
