"""The engine's settings and records, apart from the loop (``engine/core.py``) that uses them.

:class:`EngineConfig` (pools, overlap, compile options and the scheduler's), :class:`RoundRecord` (what
one round carried and cost), :class:`ServingClock` (wall time minus first-use compiles),
:class:`EngineFailure`. No JAX here.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable

from radixflow_jax.engine.params import DEFAULT_MAX_N
from radixflow_jax.engine.protocol import StepResult
from radixflow_jax.scheduler.config import MODEL_DERIVED, SchedulerConfig
from radixflow_jax.scheduler.drafts import position_counts
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, attention_pairs, pairing_spans


ENGINE_SCHEDULER = SchedulerConfig()  # an engine's scheduling options unless given (the defaults: policy pair)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Budgets, pools and policy. ``None`` pool sizes are derived from the other values.

    ``scheduler`` is the one home of the scheduling options (budgets, page size, policy, queue
    order, checkpoint placement); the engine spec (``engine/spec.py``) completes it with the
    model's grid. Every other setting has its one home here (``max_n`` too: the request check and
    the server read it from this config). Flat options, as ``LLM(model, policy="pair",
    max_num_seqs=8)`` and the CLIs give them, go through :meth:`from_options` /
    :meth:`with_options`, which send each name to its home."""

    scheduler: SchedulerConfig = ENGINE_SCHEDULER
    num_kv_pages: int | None = None
    num_state_slots: int | None = None
    # the host tier (cache/tiers.py, cache/hostkv.py): host memory for checkpoints and KV pages
    # evicted from the device pools, in GiB; None: an eighth of the host's RAM, at most 4 GiB; 0:
    # none. host_kv_fraction: its share for KV pages (None: the device pools' split by bytes).
    # num_host_slots / num_host_pages, when either is given, set it in checkpoints and pages instead
    # (the one not given is 0). engine/build.host_tier_sizes
    host_cache_gb: float | None = None
    host_kv_fraction: float | None = None
    num_host_slots: int | None = None
    num_host_pages: int | None = None
    max_model_len: int | None = None
    kernels: str = "auto"
    seed: int = 0
    # False / "lazy": a step variant compiles (and is primed) the first time a round needs it;
    # True / "all": every variant of the bucket set compiles and runs once at start-up
    warmup: bool | str = False
    warmup_progress: bool = True  # report warm-up and first-use compiles on stderr
    bucket_mode: str = "fine"  # "fine" | "pow2" | "fixed" (one shape): runner/shapes.py
    # where one-token rows of rounds with prefill rows run: "window" (a decode region), "packed"
    # (with the prompts) or "auto" (packed where the step's kernels price such a row at one token:
    # the native CPU kernels, EngineSpec.packed_rows_free): runner/shapes.py
    mixed_layout: str = "auto"
    compilation_cache_dir: str | None = None  # persistent XLA cache: later engines reuse compiled variants
    penalty_window: int | None = None  # longest context a penalised request may have; None: min(max_model_len, 4096)
    step_retries: int = 1  # failed rounds a request is retried through before it ends with an error
    max_failed_rounds: int = 3  # failed rounds in a row after which the engine gives up (EngineFailure)
    overlap: bool = True  # plan and build round r+1 while the device runs round r (model executor, one device)
    max_n: int = DEFAULT_MAX_N  # the most samples (n, best_of) one request may ask for (engine/siblings.py)

    def __post_init__(self) -> None:
        if self.warmup not in (True, False, "all", "lazy"):
            raise ValueError(f"warmup={self.warmup!r}: expected True/'all' or False/'lazy'")
        if self.mixed_layout not in ("auto", "window", "packed"):
            raise ValueError(f"mixed_layout={self.mixed_layout!r}: expected 'auto', 'window' or 'packed'")
        if self.max_n < 1:
            raise ValueError(f"max_n={self.max_n}: must be >= 1")
        for name in ("num_host_slots", "num_host_pages"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.host_kv_fraction is not None and not 0.0 <= self.host_kv_fraction <= 1.0:
            raise ValueError(f"host_kv_fraction must be in [0, 1], got {self.host_kv_fraction}")
        if self.host_cache_gb is not None and self.host_cache_gb < 0:
            raise ValueError(f"host_cache_gb must be >= 0, got {self.host_cache_gb}")

    @property
    def warmup_all(self) -> bool:
        return self.warmup in (True, "all")

    @classmethod
    def from_options(cls, **options: Any) -> EngineConfig:
        """The config of flat options over the defaults (see :meth:`with_options`)."""
        return cls().with_options(**options)

    def with_options(self, **options: Any) -> EngineConfig:
        """This config with flat options replaced: an engine field by its name (``scheduler`` too,
        as a whole), a scheduling option (a :class:`SchedulerConfig` field) in ``scheduler``.
        Unknown names and the model-derived ``grid`` / ``hybrid`` raise ``TypeError`` naming them."""
        unknown = sorted(set(options) - _ENGINE_FIELDS - _SCHEDULER_OPTIONS)
        if unknown:
            hint = " (the prefix cache is off under policy='no-cache')" if "enable_prefix_cache" in unknown else ""
            raise TypeError(f"unknown engine option{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}{hint}")
        own = {k: v for k, v in options.items() if k in _ENGINE_FIELDS}
        scheduling = {k: v for k, v in options.items() if k in _SCHEDULER_OPTIONS}
        base = own.pop("scheduler", self.scheduler)
        return dataclasses.replace(self, scheduler=dataclasses.replace(base, **scheduling), **own)


_ENGINE_FIELDS = frozenset(f.name for f in dataclasses.fields(EngineConfig))
_SCHEDULER_OPTIONS = frozenset(f.name for f in dataclasses.fields(SchedulerConfig)) - set(MODEL_DERIVED)


@dataclasses.dataclass(frozen=True)
class RoundRecord:
    """One committed round: what it carried (from its plan and the scheduler's :class:`RoundStats`,
    fields of the same name), the variant it ran in and its timings (from the :class:`StepResult`,
    fields of the same name). ``bubble_*`` are the stats' ``shadow_*``: budget left idle while
    requests behind a consumer stop were admissible, measured by the scheduler's shadow scan."""

    index: int
    num_tokens: int
    num_rows: int
    token_slots: int
    row_slots: int
    padding_tokens: int
    bubble_tokens: int
    bubble_rows: int
    admitted: int
    consumers_blocked: int
    consumers_waiting: int
    preempted: int
    checkpoints_planted: int
    checkpoints_skipped: int
    checkpoints_evicted_unused: int
    plan_s: float
    build_s: float
    step_s: float
    num_decode: int = 0  # one-token rows of the plan
    consumers_paired: int = 0  # consumers admitted into their producer's round (policy pair)
    fill_declined: int = 0  # fill requests pair's cost rule kept out of the round
    pairs_declined: int = 0  # consumers pair's cost rule left waiting instead of pairing
    riders: int = 0  # requests that rode an identical prompt's last round (scheduler/riders.py)
    decode_slots: int = 0  # the variant's decode region (rows taking the one-step updates)
    prefill_first: bool = False  # planned prompts before decode rows: the round before starved one
    # host time on the critical path: from the previous round's result to this round's dispatch, the
    # host work done while no round was in flight (commit of the previous round, plan, build); 0 when
    # this round was launched while the previous one still ran (overlap)
    host_s: float = 0.0
    overlapped: bool = False  # launched while the previous round was in flight
    attention_pairs: int = 0  # query-key pairs of the real rows (scheduler/plan.attention_pairs)
    pairing_tokens: int = 0  # producer span tokens a paired round scans first (scheduler/plan.pairing_spans)
    verify_rows: int = 0  # rows carrying drafted tokens (speculative decoding, scheduler/drafts.py)
    drafted_tokens: int = 0  # drafted tokens its verify rows carried
    accepted_tokens: int = 0  # of those, the ones accepted (scheduler/drafts.accepted_length)
    drafted_at: tuple[int, ...] = ()  # per drafted position: verify rows that drafted a token there
    accepted_at: tuple[int, ...] = ()  # per drafted position: verify rows accepted through it (drafts.position_counts)
    host_hits: int = 0  # requests whose match resumed from a host checkpoint (read into their slot, or restoring)
    restore_waits: int = 0  # requests that waited this round for a pending restore they started
    spilled: int = 0  # checkpoints the round copied to the host tier (RoundPlan.state_moves)
    restored: int = 0  # checkpoints the round copied back from the host tier
    kv_spilled: int = 0  # KV pages the round copied to the host tier
    kv_restored: int = 0  # KV pages the round copied back from the host tier

    @classmethod
    def of(
        cls, index: int, plan: RoundPlan, result: StepResult, *, plan_s: float, host_s: float, overlapped: bool
    ) -> RoundRecord:
        """The record of round ``index``: ``plan``'s counts and stats, ``result``'s slots and times."""
        stats, num_tokens = plan.stats, plan.num_tokens
        drafts = [
            (r.tokens[len(r.tokens) - r.num_draft :], result.verified[r.request_id])
            for r in plan.rows
            if r.num_draft and r.request_id in result.verified
        ]
        drafted_at, accepted_at = position_counts(drafts)
        moves = collections.Counter(m.kind for m in plan.state_moves)  # the host tier's copies, by kind
        return cls(
            index=index,
            num_tokens=num_tokens,
            num_rows=len(plan.rows),
            num_decode=plan.num_decode,
            padding_tokens=result.token_slots - num_tokens,
            bubble_tokens=stats.shadow_tokens,
            bubble_rows=stats.shadow_rows,
            plan_s=plan_s,
            host_s=host_s,
            overlapped=overlapped,
            attention_pairs=attention_pairs(plan.rows),
            pairing_tokens=sum(pairing_spans(plan.rows).values()),
            verify_rows=sum(1 for r in plan.rows if r.num_draft),
            spilled=moves["spill"],
            restored=moves["restore"],
            kv_spilled=moves["kv_spill"],
            kv_restored=moves["kv_restore"],
            drafted_tokens=plan.num_drafted,
            accepted_tokens=sum(accepted_at),
            drafted_at=drafted_at,
            accepted_at=accepted_at,
            **{name: getattr(stats, name) for name in _FROM_STATS},
            **{name: getattr(result, name) for name in _FROM_RESULT},
        )

    @property
    def kind(self) -> str:
        """``decode`` (only one-token rows), ``prefill`` (none) or ``mixed``."""
        if self.num_decode == self.num_rows:
            return "decode"
        return "mixed" if self.num_decode else "prefill"


def _shared_fields(source: type) -> tuple[str, ...]:
    """The :class:`RoundRecord` fields ``source`` (a dataclass) has under the same name."""
    theirs = {f.name for f in dataclasses.fields(source)}
    return tuple(f.name for f in dataclasses.fields(RoundRecord) if f.name in theirs)


_FROM_STATS = _shared_fields(RoundStats)  # admitted, consumers_*, preempted, checkpoints_*, ...
_FROM_RESULT = _shared_fields(StepResult)  # token_slots, row_slots, decode_slots, build_s, step_s


class ServingClock:
    """The engine's time: the given clock minus the time spent compiling step variants on first use,
    so latencies and arrival schedules measure serving, not compiling (the engine wraps only the
    default wall clock; a virtual clock is used as it is)."""

    def __init__(self, base: Callable[[], float]):
        self.base = base
        self.paused_s = 0.0

    def __call__(self) -> float:
        return self.base() - self.paused_s


class EngineFailure(RuntimeError):
    """The engine cannot go on: recovery from a failed step failed, or too many rounds failed in a row."""

