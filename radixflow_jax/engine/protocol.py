"""What an executor is (no JAX here: the simulated executor and the engine loop need none)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol

from radixflow_jax.runner.inputs import SamplingRow
from radixflow_jax.scheduler.plan import RoundPlan


@dataclasses.dataclass(frozen=True)
class StepResult:
    """Sampled token per sampling row, the slot counts of the variant used (``decode_slots``: its
    decode region), and timings (``compile_s``: compiling a variant on first use, which is not part
    of ``step_s`` and not on the engine's clock). ``logprobs``: for rows that asked for them,
    ``(logprob of the sampled token, top ids, top logprobs)``."""

    sampled: dict[int, int]
    token_slots: int
    row_slots: int
    build_s: float
    step_s: float
    logprobs: dict[int, tuple[float, list[int], list[float]]] = dataclasses.field(default_factory=dict)
    decode_slots: int = 0
    compile_s: float = 0.0


class Executor(Protocol):
    def execute(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow]) -> StepResult: ...

    def reset(self) -> None:
        """After a step raised: rebuild every device buffer the step may have consumed (donated
        pools), empty. The engine flushes its cache and recomputes running requests around it."""
        ...




class OverlapExecutor(Executor, Protocol):
    """An executor the engine can run with overlap (``EngineConfig.overlap``): ``launch`` dispatches a
    round and returns at once with a handle; ``collect`` waits for its result. ``prev`` is the handle
    of the round launched just before, not collected yet: rows whose input is ``UNKNOWN_TOKEN`` take
    it from that round's samples on the device. A device error may surface at ``collect``.
    ``supports_overlap`` may be False (the engine then calls ``execute``). A handle may carry
    ``compile_s``: seconds of first-use compiling spent inside ``launch``, which the engine takes off
    its serving clock when ``launch`` returns (before it commits the round in flight); the result's
    ``compile_s`` then repeats that figure for the round record only."""

    supports_overlap: bool

    def launch(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow], prev: Any = None) -> Any: ...

    def collect(self, handle: Any) -> StepResult: ...
