"""Data parallelism: several engine replicas behind a router (no JAX here).

Each replica is a whole :class:`EngineCore` (its own scheduler, radix cache and executor: one
data-parallel group of devices, or a simulated executor). The router picks a replica per request:

* ``prefix``: the replica with the longest *state-ready* prefix of the prompt, the longer of
  - what its cache can serve: the usable hit (for a hybrid model the deepest checkpoint on the KV
    path, committed or pending: a KV match without a checkpoint at that depth saves nothing), and
  - what the router itself sent there: the longest prefix (in ``block`` tokens) shared with a prompt
    routed to it, which covers prompts still waiting or running whose prefix is not in the tree yet
    (their scheduler plants a branch checkpoint where the new prompt leaves the old one);
  falling back to the least-loaded replica when no replica holds a prefix, or when the best one's
  outstanding requests exceed ``imbalance * mean + slack`` (a hot prefix must not pile a queue
  onto one replica while others idle);
* ``round-robin``: replicas in turn (the baseline);
* ``least-loaded``: fewest outstanding (waiting + running) requests.

Invariant: the router never changes what a request computes, only where; every replica's output
equals what a single engine computes for the same request.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

from radixflow_jax.engine.core import EngineCore
from radixflow_jax.engine.intake import CheckedRequest
from radixflow_jax.engine.params import RequestOutput, SamplingParams

ROUTERS = ("prefix", "round-robin", "least-loaded")


@dataclasses.dataclass(frozen=True)
class RouterConfig:
    """``block``: tokens per hashed block of the router's own prefix record (the page size is a
    good choice); ``memory``: blocks remembered per replica (oldest forgotten first)."""

    policy: str = "prefix"
    block: int = 16
    imbalance: float = 1.5
    slack: int = 4
    memory: int = 1 << 16

    def __post_init__(self) -> None:
        if self.policy not in ROUTERS:
            raise ValueError(f"unknown router {self.policy!r}; routers: {', '.join(ROUTERS)}")
        if self.block < 1 or self.memory < 1 or self.imbalance < 1.0 or self.slack < 0:
            raise ValueError(f"bad router config {self}: block/memory >= 1, imbalance >= 1, slack >= 0")


def _block_hashes(prompt: Sequence[int], block: int) -> list[int]:
    """Chained hashes of the prompt's full blocks: ``h[k]`` identifies the first ``(k + 1) * block`` tokens."""
    out, h = [], 0
    for start in range(0, len(prompt) - block + 1, block):
        h = hash((h, tuple(prompt[start : start + block])))
        out.append(h)
    return out


def state_ready_prefix(engine: EngineCore, prompt: Sequence[int]) -> int:
    """Prompt tokens ``engine``'s cache can serve from a checkpointed prefix (pending ones included:
    their producer is running and the scheduler makes the request wait for the commit)."""
    cache = engine.scheduler.memory.cache
    if cache is None or len(prompt) < 2:
        return 0
    m = cache.match(prompt, touch=False, shared=False)
    return max(m.hit_len, m.checkpoint_depth if m.checkpoint_pending else 0)


def outstanding(engine: EngineCore) -> int:
    return len(engine.scheduler.waiting) + len(engine.scheduler.running)


class Router:
    """Chooses a replica per request (see the module docstring); counts its decisions."""

    def __init__(self, num_replicas: int, config: RouterConfig = RouterConfig()):
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        self.config = config
        self.num_replicas = num_replicas
        self._seen: list[collections.OrderedDict[int, None]] = [collections.OrderedDict() for _ in range(num_replicas)]
        self._next = 0
        self.routed = [0] * num_replicas
        self.prefix_hits = 0  # requests sent to a replica for its prefix
        self.fallbacks = 0  # requests with a prefix somewhere that went to the least-loaded replica instead

    def _least_loaded(self, loads: Sequence[int]) -> int:
        low = min(loads)
        n = self.num_replicas
        for k in range(n):  # rotate among the least loaded, so ties spread
            i = (self._next + k) % n
            if loads[i] == low:
                self._next = (i + 1) % n
                return i
        raise AssertionError("unreachable")

    def routed_prefix(self, replica: int, hashes: Sequence[int]) -> int:
        seen, n = self._seen[replica], 0
        for h in hashes:
            if h not in seen:
                break
            n += 1
        return n * self.config.block

    def choose(self, prompt: Sequence[int], loads: Sequence[int], ready: Sequence[int]) -> int:
        """The replica for ``prompt`` given each replica's outstanding requests and cache-ready prefix."""
        cfg = self.config
        if len(loads) != self.num_replicas or len(ready) != self.num_replicas:
            raise ValueError(f"{len(loads)} loads / {len(ready)} prefixes for {self.num_replicas} replicas")
        hashes = _block_hashes(prompt, cfg.block)
        if cfg.policy == "round-robin":
            choice = self._next
            self._next = (self._next + 1) % self.num_replicas
        elif cfg.policy == "least-loaded":
            choice = self._least_loaded(loads)
        else:
            score = [max(ready[i], self.routed_prefix(i, hashes)) for i in range(self.num_replicas)]
            best = max(range(self.num_replicas), key=lambda i: (score[i], -loads[i]))
            mean = sum(loads) / self.num_replicas
            if score[best] == 0:
                choice = self._least_loaded(loads)
            elif loads[best] > cfg.imbalance * mean + cfg.slack:
                choice = self._least_loaded(loads)
                self.fallbacks += 1
            else:
                choice = best
                self.prefix_hits += 1
        seen = self._seen[choice]
        for h in hashes:
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > cfg.memory:
            seen.popitem(last=False)
        self.routed[choice] += 1
        return choice


class ReplicaSet:
    """Engine replicas behind a :class:`Router`: ``add_request`` routes and queues, ``step`` runs
    one round on every replica with work. Request ids are ``(replica, engine request id)``."""

    def __init__(self, engines: Sequence[EngineCore], config: RouterConfig = RouterConfig()):
        self.engines = list(engines)
        self.router = Router(len(self.engines), config)

    def route(self, prompt: Sequence[int]) -> int:
        if len(self.engines) == 1:
            return 0
        loads = [outstanding(e) for e in self.engines]
        ready = [state_ready_prefix(e, prompt) if self.router.config.policy == "prefix" else 0 for e in self.engines]
        return self.router.choose(prompt, loads, ready)

    def add_request(
        self, prompt: Sequence[int], params: SamplingParams, *, arrival_time: float | None = None
    ) -> tuple[int, int]:
        """Checks (once: the replicas are identical, so the first one's check holds for all), routes
        and queues a request."""
        return self.add(self.engines[0].check(prompt, params), arrival_time=arrival_time)

    def add(self, checked: CheckedRequest, *, arrival_time: float | None = None) -> tuple[int, int]:
        """Routes and queues a request a replica's ``check`` accepted."""
        replica = self.route(checked.prompt)
        return replica, self.engines[replica].add(checked, arrival_time=arrival_time)

    def add_group(self, checked: CheckedRequest, *, arrival_time: float | None = None) -> list[tuple[int, int]]:
        """Routes a checked request once and queues its sibling requests there (``EngineCore.add_group``)."""
        replica = self.route(checked.prompt)
        return [(replica, rid) for rid in self.engines[replica].add_group(checked, arrival_time=arrival_time)]

    def has_unfinished(self) -> bool:
        return any(e.has_unfinished() for e in self.engines)

    def step(self) -> list[tuple[int, RequestOutput]]:
        out = []
        for i, e in enumerate(self.engines):
            if e.has_unfinished():
                out += [(i, o) for o in e.step()]
        return out

    def output(self, rid: tuple[int, int]) -> RequestOutput:
        return self.engines[rid[0]].output(rid[1])
