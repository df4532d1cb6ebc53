"""User-facing request parameters and results: :class:`SamplingParams`, :class:`RequestOutput`.

Parameters we do not implement are rejected with :class:`UnsupportedParameterError`; nothing is
silently ignored.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Sequence

# Unsupported parameters and the values that mean "off" (accepted, since they ask for nothing).
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (1,), "best_of": (1,), "prompt_logprobs": (0, False), "logit_bias": ({},),
    "use_beam_search": (False,), "min_tokens": (0,),
}  # fmt: skip


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class UnsupportedParameterError(ValueError):
    """A sampling parameter this engine does not implement was given a non-default value."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` is greedy. ``top_k <= 0`` and ``top_p == 1`` and ``min_p == 0`` are off.
    ``seed``: per-request RNG stream (default: derived from the engine seed and the request id).
    ``stop``: strings that end generation (excluded from the text); ``stop_token_ids`` end it too;
    the model's EOS ids end it unless ``ignore_eos``. ``presence_penalty`` / ``frequency_penalty``
    (in [-2, 2]) act on generated tokens, ``repetition_penalty`` (> 0, 1 = off) on prompt and
    generated tokens. ``logprobs``: return the log-probability of each sampled token and of the
    ``logprobs`` most likely alternatives (0-20; None = off), from the penalised logits before
    temperature and filtering."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None

    @property
    def has_penalty(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        if any(not isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if isinstance(self.stop_token_ids, (str, bytes)) or any(not _is_int(t) for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be a list of integers, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            if not _is_real(getattr(self, name)):
                raise ValueError(f"{name} must be a number, got {getattr(self, name)!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))
        if not 0 <= self.temperature < float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not _is_int(self.top_k):
            raise ValueError(f"top_k must be an integer, got {self.top_k!r}")
        object.__setattr__(self, "top_k", int(self.top_k))
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)!r}")
        if not 0 < self.repetition_penalty < float("inf"):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= 20):
            raise ValueError(f"logprobs must be an integer in [0, 20] or None, got {self.logprobs!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SamplingParams:
        """Builds params from a request body; unsupported or unknown names raise."""
        fields = {f.name for f in dataclasses.fields(cls)}
        for key, value in values.items():
            if key in _UNSUPPORTED:
                neutral = _UNSUPPORTED[key]
                default_ok = value is None or any(value == v for v in neutral)
                if not default_ok:
                    raise UnsupportedParameterError(f"sampling parameter '{key}' is not supported")
            elif key not in fields:
                raise UnsupportedParameterError(f"unknown sampling parameter '{key}'")
        kwargs = {k: v for k, v in values.items() if k in fields and v is not None}
        if kwargs.get("top_k") == -1:
            kwargs["top_k"] = 0
        return cls(**kwargs)


@dataclasses.dataclass
class RequestOutput:
    """A finished (or, when streamed, in-progress) request."""

    request_id: int
    prompt_token_ids: Sequence[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    arrival_time: float
    first_token_time: float | None = None
    finish_time: float | None = None
    first_token_round: int | None = None
    finish_round: int | None = None
    logprobs: list[tuple[float, list[int], list[float]]] | None = None  # per token, when requested
    error: str | None = None  # why the request ended with finish_reason 'error'

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time
