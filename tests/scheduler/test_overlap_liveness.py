"""A livelock under overlap in a tiny page pool, found by a scheduler fuzz in review (2026-12-01) and
present since before that day's scheduler changes (reproduced at ``6f83c45``).

Grid 8, page 4, 22 pages, 3 state slots, budget 16, 4 rows, policy radixflow, overlap (each plan
is launched before the previous one commits). Three requests: ``A`` (52 tokens, 40 of them a
prefix that ``C`` shares 32 of) arrives in round 10, ``B`` (3 tokens) and ``C`` (42 tokens) in round
11. After ``B`` and ``C`` finish, ``A`` runs alone. It computed 0 -> 48 and could not get the pages
for its next span: 8 pages stayed held by ``C``'s prefix in the tree, pinned by ``A``'s own pending
checkpoint (its round in flight) below it. So it preempted itself and started again at 0, forever
(126 preemptions in 400 rounds), and with 3 slots no committed checkpoint survived to resume from.
Now a request that finds no victim while a round of its own is in flight waits for that round's
commit instead of preempting itself: its KV and checkpoint then commit, and the next plan either
fits or preempts it with a committed hit to resume from.
"""

from __future__ import annotations

from radixflow_jax.scheduler.request import Request
from radixflow_jax.scheduler.scheduler import Scheduler, SchedulerConfig

PREFIX = tuple(range(3000, 3040))
A = PREFIX + (54, 18, 14, 37, 58, 59, 19, 57, 41, 33, 43, 14)
B = (40, 14, 55)
C = PREFIX[:32] + (49, 35, 22, 46, 12, 37, 8, 49, 12, 35)


def test_a_lone_request_under_overlap_finishes_in_a_tiny_pool() -> None:
    cfg = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=16, page_size=4, grid=8, hybrid=True, policy="radixflow"
    )
    s = Scheduler(cfg, num_pages=22, num_slots=3)
    arrivals = {10: [Request(0, A, 9)], 11: [Request(1, B, 2), Request(2, C, 2)]}
    in_flight = None
    for rnd in range(400):
        for req in arrivals.get(rnd, ()):
            s.add(req)
        if in_flight is not None and s.plants_on_unknown():
            s.commit(in_flight, {r.request_id: 7 for r in in_flight.rows if r.sample})
            in_flight = None
        if rnd > 11 and not s.has_work() and in_flight is None:
            break
        plan = s.schedule()
        if plan.rows:
            s.launch(plan)
        if in_flight is not None:
            s.commit(in_flight, {r.request_id: 7 for r in in_flight.rows if r.sample})
        in_flight = plan if plan.rows else None
    assert not s.has_work(), f"livelock: {[(r.request_id, r.num_computed, r.num_preemptions) for r in s.running]}"
    assert all(len(s.requests[i].output) == s.requests[i].max_tokens for i in range(3))
