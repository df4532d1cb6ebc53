"""What an executor is (no JAX here: the simulated executor and the engine loop need none).

Every executor declares what it can do in :class:`ExecutorCapabilities`, which the engine reads
once, when it is built; the engine never probes an executor for optional attributes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Protocol, Sequence

from radixflow_jax.runner.inputs import SamplingRow
from radixflow_jax.scheduler.plan import RoundPlan


@dataclasses.dataclass(frozen=True)
class StepResult:
    """Sampled token per sampling row, the slot counts of the variant used (``decode_slots``: its
    decode region), and timings (``compile_s``: compiling a variant on first use, which is not part
    of ``step_s`` and not on the engine's clock). ``logprobs``: for rows that asked for them,
    ``(logprob of the sampled token, top ids, top logprobs)``. ``verified`` (speculative decoding):
    per verify row (``RowPlan.num_draft``), the token after its last known token and after each of
    its drafted tokens but the last; ``sampled`` holds the one after the last. ``verify_logprobs``:
    for verify rows that asked for logprobs, those of each of ``verified``'s tokens, in order
    (``logprobs`` has the row's sample's). ``drafts`` (speculative method ``mtp``): per sampling
    row, the model's MTP guess at the token after the ones this round commits for it."""

    sampled: dict[int, int]
    token_slots: int
    row_slots: int
    build_s: float
    step_s: float
    logprobs: dict[int, tuple[float, list[int], list[float]]] = dataclasses.field(default_factory=dict)
    decode_slots: int = 0
    compile_s: float = 0.0
    verified: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    verify_logprobs: dict[int, list[tuple[float, list[int], list[float]]]] = dataclasses.field(default_factory=dict)
    drafts: dict[int, int] = dataclasses.field(default_factory=dict)  # MTP: per sampling row, a guess at the next token


@dataclasses.dataclass(frozen=True)
class ExecutorCapabilities:
    """What an executor offers beyond ``execute`` / ``reset``; the defaults offer nothing.

    ``overlap``: the executor is an :class:`OverlapExecutor` whose ``launch`` may run while the round
    launched before it is not collected yet (the engine overlaps only when its config asks too).
    ``logprobs``: results carry logprobs for rows whose ``SamplingRow.logprobs >= 0``; without it the
    engine refuses requests that ask for them.
    ``penalty_window``: the longest context (prompt + output) a penalised row may have; 0: the
    executor applies no penalties and the engine refuses penalised requests.
    (No executor offers a round cost: the policies' estimator is fitted to the rounds an executor
    reports, ``engine/roundcost.py``, the simulator's included.)
    ``logit_bias``: the most bias entries (``logit_bias`` + ``min_tokens`` bans of stop tokens) a
    row may carry; 0: the executor applies none and the engine refuses requests that need them.
    ``prompt_logprobs``: ``(prompt ids, k) -> per prompt token (logprob, top k ids, their logprobs)``,
    the first token None, computed cold; None: the engine refuses ``prompt_logprobs``.
    ``grammar_mask``: the step applies each sampled row's ``SamplingRow.grammar`` mask (structured
    outputs); False: the engine refuses requests with ``structured_outputs``.``verify``: results carry the tokens sampled at verify rows (``StepResult.verified``), so the
    engine may schedule drafted tokens (speculative decoding, ``scheduler/drafts.py``).
    """

    overlap: bool = False
    logprobs: bool = False
    penalty_window: int = 0
    logit_bias: int = 0
    prompt_logprobs: Callable[[Sequence[int], int], list[PromptLogprob | None]] | None = None
    grammar_mask: bool = False
    verify: bool = False


PromptLogprob = tuple[float, list[int], list[float]]  # (logprob of the token, top ids, their logprobs)


class Executor(Protocol):
    capabilities: ExecutorCapabilities

    def execute(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow]) -> StepResult: ...

    def reset(self) -> None:
        """After a step raised: rebuild every device buffer the step may have consumed (donated
        pools), empty. The engine flushes its cache and recomputes running requests around it."""
        ...


class LaunchHandle(Protocol):
    """What ``launch`` returns: opaque to the engine but for ``compile_s``, the seconds of first-use
    compiling spent inside ``launch`` (0 when nothing compiled)."""

    @property
    def compile_s(self) -> float: ...


class OverlapExecutor(Executor, Protocol):
    """An executor the engine can run with overlap (``capabilities.overlap``): ``launch`` dispatches a
    round and returns at once with a handle; ``collect`` waits for its result. ``prev`` is the handle
    of the round launched just before, not collected yet: rows whose input is ``UNKNOWN_TOKEN`` take
    it from that round's samples on the device. A device error may surface at ``collect``. The
    engine takes the handle's ``compile_s`` off its serving clock when ``launch`` returns (before it
    commits the round in flight); the result's ``compile_s`` then repeats that figure for the round
    record only."""

    def launch(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow], prev: Any = None) -> LaunchHandle: ...

    def collect(self, handle: Any) -> StepResult: ...


@dataclasses.dataclass(frozen=True)
class DeferredRound:
    """The handle of an executor that runs a launched round only when it is collected (the
    simulated and recording executors): the round's plan and sampling rows; nothing compiles."""

    plan: RoundPlan
    sampling: Mapping[int, SamplingRow]
    compile_s: float = 0.0
