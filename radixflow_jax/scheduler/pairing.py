"""Policy ``pair`` inside the scheduler: paired admission and the cost-aware fill rule, both judged
by the executor's round cost model, which :class:`Pairing` owns (``round_cost``, set by the engine
builder through ``Scheduler.round_cost``). It plans into the round's
:class:`~radixflow_jax.scheduler.builder.RoundBuilder` and keeps no state of its own between rounds.
The roll-back of a leaving producer's partners is the running set's (``running.py``). No JAX here.

Invariants: a paired consumer starts at the producer's pending depth inside the same round (the step
runs its producer first), and only from a producer row of this round that emits that checkpoint
and is not paired itself; the consumer takes its own reference on every producer page it shares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from radixflow_jax.scheduler.admission import Decision
from radixflow_jax.scheduler.allocator import Allocator
from radixflow_jax.scheduler.builder import RoundBuilder, grid_span
from radixflow_jax.scheduler.config import SchedulerConfig
from radixflow_jax.scheduler.plan import RowPlan
from radixflow_jax.scheduler.request import Request


class Pairing:
    """``round_cost``: seconds a round of these rows takes (the executor's round cost model); ``None``:
    no cost model wired, pair fills like radixflow."""

    def __init__(self, config: SchedulerConfig, memory: Allocator):
        self._config = config
        self._memory = memory
        self.round_cost: Callable[[Sequence[RowPlan]], float] | None = None

    def pair(self, req: Request, match, producer: Request | None, round_: RoundBuilder) -> Decision | None:
        """Admits consumer ``req`` into the round being planned when its ``producer`` has an unpaired
        row in it that emits the pending checkpoint ``match`` ends at (so the step computes that state
        before the consumer's rows need it). ``None``: no pairing possible, or the pairing rule
        declines it; the caller waits as in ``radixflow``. The consumer takes its own reference on
        the producer's first ``depth / page`` pages (paired pending KV) and a paired reference in the
        cache (rolled back if the producer is aborted or preempted before its round commits)."""
        cache, memory, cfg = self._memory.cache, self._memory, self._config
        node, depth = match.checkpoint_node, match.checkpoint_depth
        if cache is None or node is None or producer is None or depth % cfg.page_size:
            return None
        slot_of = node.checkpoint.held_slot
        prow = round_.row_of(producer.request_id)
        if prow is None or prow.pair_slot is not None or (depth - prow.start, slot_of) not in prow.emits:
            return None  # planted by an earlier, uncommitted round, or the producer is paired itself
        span = round_.span(depth, req.num_tokens - depth)
        if span == 0 or depth >= req.num_tokens:
            return None
        candidate = RowPlan(
            request_id=req.request_id,
            tokens=req.tokens[depth : depth + span],
            start=depth,
            pages=(),
            slot=0,
            copy_from=None,
            emits=(),
            sample=True,
            pair_slot=slot_of,
        )
        if not self._pairing_pays(req, candidate, round_):
            round_.stats.pairs_declined += 1
            return None
        shared = producer.pages[: depth // cfg.page_size]
        if not memory.seat(req, computed=depth, end=depth + span, shared_pages=shared, slot=True):
            return Decision.STOP_UNTIL_FREE
        pair_slot = cache.pair(node, req.request_id)
        branch_len = cache.shared_len(req.tokens) if cfg.branch_checkpoints else None
        round_.add(req, span, None, branch_len, pair_slot=pair_slot)
        round_.stats.consumers_paired += 1
        return Decision.ADMIT

    def _pairing_pays(self, req: Request, row: RowPlan, round_: RoundBuilder) -> bool:
        """The fill rule's test for a paired consumer (it, too, is work native would not admit this
        round). Pairing that fits the round's padding costs nothing. Otherwise pair when the time the
        consumer's row adds to the round, paid by every request already in it, is smaller than the
        round of waiting (this round's time) it saves: the consumer's own (unlike a fill, it is
        *blocked*: under radixflow it waits one round) and its waiting siblings' (they pair with it,
        or read its checkpoints, a round earlier). Declined, it waits as in radixflow."""
        rows = round_.rows
        if not rows or self.round_cost is None:
            return True
        base = self.round_cost(rows)
        cost = self.round_cost([*rows, row])
        if cost <= base:
            return True
        return _pays(base, cost, len(rows), 1 + sum(1 for _ in round_.waiting_index.siblings(req)))

    def fill_pays(self, req: Request, round_: RoundBuilder, following: Sequence[Request]) -> bool:
        """Policy pair's cost-aware fill rule, for a request scanned after a consumer was skipped or
        paired (a *fill*: native would not admit it this round), from the executor's round cost.

        A fill that fits the round's padding costs nothing and is admitted. One that grows the round
        to a larger shape opens slack that the fill requests behind it ride: its *group* is it plus
        the following non-consumers, in queue order, while each keeps or lowers the group's cost per
        token (judged alone, a request would carry the whole jump of the shape though the slack it
        buys is used). Admit it when the time the group adds, paid by every request already in the
        round, is smaller than the round of waiting (this round's time) it saves each request it
        serves: the followers (they ride the slack it opens) and the waiting siblings of every member
        (sharing a first grid of tokens, they pair with it or read its checkpoints a round earlier).
        The fill's own earlier start is not counted: on a compute-bound round it only moves its work
        ahead of the requests already in it (counting it too lost 1.9 % / 1.2 % to native on RACE
        sessions of qwen3.5-9b at 22.4/s and qwen3.5-27b at 6.195/s; judging a fill alone, without
        its group, lost 4.2 % to radixflow on the qwen3.5-4b RACE burst: docs/results.md). Consumers
        (they pair or wait) and an empty round pass."""
        rows, budget = round_.rows, round_.budget
        if not rows or self.round_cost is None or budget.rows == 0:
            return True  # (no rows left: the admission scan answers STOP_ROUND)
        row = self._fill_row(req, budget.tokens)
        if row is None:
            return True  # a consumer (it pairs or waits), or the admission scan answers STOP_ROUND
        base = self.round_cost(rows)
        grown = [*rows, row]
        cost = self.round_cost(grown)
        if cost <= base:
            return True
        group, tokens, seqs = [req], budget.tokens - len(row.tokens), budget.rows - 1
        group_tokens = len(row.tokens)
        for seen, other in enumerate(following):
            if seqs == 0 or tokens <= 0 or seen >= 4 * self._config.max_num_seqs:
                break
            other_row = self._fill_row(other, tokens)
            if other_row is None:
                continue
            with_other = self.round_cost([*grown, other_row])
            if with_other - cost > (cost - base) * len(other_row.tokens) / group_tokens:
                break  # it would raise the group's cost per token: the slack is used
            grown.append(other_row)
            group.append(other)
            cost, tokens, seqs = with_other, tokens - len(other_row.tokens), seqs - 1
            group_tokens += len(other_row.tokens)
        served = {r.request_id for r in group[1:]}  # the followers, not the fill itself
        served.update(sib.request_id for member in group for sib in round_.waiting_index.siblings(member))
        return _pays(base, cost, len(rows), len(served))

    def _fill_row(self, req: Request, tokens_left: int) -> RowPlan | None:
        """The row ``req`` would get if admitted now with ``tokens_left`` tokens of budget (no pages,
        slot or emits: enough for the round cost); ``None`` for a consumer or when nothing fits."""
        cache = self._memory.cache
        match = cache.match(req.tokens, touch=False, shared=False) if cache is not None else None
        if match is not None and match.is_consumer:
            return None
        hit = match.hit_len if match is not None else 0
        span = grid_span(hit, req.num_tokens - hit, tokens_left, self._config.grid)
        if span == 0:
            return None
        return RowPlan(
            request_id=req.request_id,
            tokens=req.tokens[hit : hit + span],
            start=hit,
            pages=(),
            slot=0,
            copy_from=0 if hit else None,
            emits=(),
            sample=True,
        )


def _pays(base: float, cost: float, in_round: int, served: int) -> bool:
    """The cost rule shared by fills and pairing: growing a round of time ``base`` to ``cost``
    delays each of the ``in_round`` requests already in it by the difference; it pays when that is
    less than the round of waiting (``base``) it saves each of the ``served`` requests."""
    return (cost - base) * in_round < base * served
