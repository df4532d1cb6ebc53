"""User-facing request parameters and results: :class:`SamplingParams`, :class:`RequestOutput`.

Parameters we do not implement are rejected with :class:`UnsupportedParameterError`; nothing is
silently ignored.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Iterable, Mapping, Sequence

from radixflow_jax.engine.grammar import StructuredOutputsParams

# Unsupported parameters and the values that mean "off" (accepted, since they ask for nothing).
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {"use_beam_search": (False,)}

DEFAULT_MAX_N = 16  # the most samples (n, best_of) one request may ask for unless configured
LOGIT_BIAS_LIMIT = 100.0  # |bias| of a logit_bias entry (the OpenAI API's range)
INT32_MAX = 2**31 - 1  # token ids, top_k and token counts go into int32 step inputs
SEED_RANGE = (-(2**63), 2**64 - 1)  # a seed is any 64-bit integer (signed or not); the device keeps its low 32 bits


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class UnsupportedParameterError(ValueError):
    """A sampling parameter this engine does not implement was given a non-default value."""


class InvalidParameterError(ValueError):
    """A request value out of its range (``SamplingParams`` or ``engine/intake.py``); ``field`` names
    the parameter (``prompt`` for the prompt's token ids). Its message starts with the field's name."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field} {message}" if not message.startswith(field) else message)
        self.field = field


def _invalid(field: str, message: str) -> InvalidParameterError:
    return InvalidParameterError(field, message)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` is greedy. ``top_k`` 0 (or -1, vLLM's spelling, stored as 0) and ``top_p == 1``
    and ``min_p == 0`` are off; a ``top_k`` at least the vocabulary size keeps every token, so intake
    stores it as 0 (vLLM accepts it the same way).
    ``seed``: per-request RNG stream (default: derived from the engine seed and the request id).
    ``stop``: strings that end generation (excluded from the text); ``stop_token_ids`` end it too;
    the model's EOS ids end it unless ``ignore_eos``. ``presence_penalty`` / ``frequency_penalty``
    (in [-2, 2]) act on generated tokens, ``repetition_penalty`` (> 0, 1 = off) on prompt and
    generated tokens. ``logprobs``: return the log-probability of each sampled token and of the
    ``logprobs`` most likely alternatives (0-20; None = off), from the penalised and biased logits
    before temperature and filtering.

    ``n`` samples of the prompt (``best_of`` candidates, ranked by cumulative logprob, of which the
    best ``n`` are returned; ``best_of >= n``): the engine runs them as sibling requests
    (``engine/siblings.py``), each with its own seed stream (``seed + i`` when a seed is given).
    ``logit_bias``: token id (an int, or its decimal string as JSON keys are) -> bias in [-100, 100]
    added to that token's logit before sampling (stored as sorted ``(id, bias)`` pairs).
    ``min_tokens``: the stop tokens (EOS unless ``ignore_eos``, and ``stop_token_ids``) are masked
    until that many tokens were generated (``min_tokens <= max_tokens``; stop strings still end
    generation). ``prompt_logprobs``: the
    logprob of every prompt token after the first, and its ``prompt_logprobs`` best alternatives
    (0-20; None = off), computed cold (cached prompt tokens have no logits).

    ``structured_outputs`` (vLLM's name): a :class:`~radixflow_jax.engine.grammar.StructuredOutputsParams`
    (or a dict of its fields: ``json``, ``regex``, ``choice``, ``grammar``, ``json_object``); every
    sampled token is constrained to the grammar, and the request ends with ``stop`` once the
    grammar is complete (or EOS where it may end)."""

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
    n: int = 1
    best_of: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    prompt_logprobs: int | None = None
    structured_outputs: StructuredOutputsParams | None = None

    @property
    def num_samples(self) -> int:
        """Sibling requests this request runs as (``best_of`` when given, else ``n``)."""
        return self.best_of if self.best_of is not None else self.n

    @property
    def has_penalty(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def __post_init__(self) -> None:
        """Every value is checked here against the range that needs no engine facts (the vocabulary
        and the engine's limits are ``engine/intake.py``'s); each refusal is an
        :class:`InvalidParameterError` naming its field. What reaches a fixed-width step input is
        bounded: token ids and ``top_k`` in int32, floats finite."""
        self._check_stops()
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            if not _is_real(getattr(self, name)):
                raise _invalid(name, f"must be a number, got {getattr(self, name)!r}")
        if not _is_int(self.max_tokens) or not 1 <= self.max_tokens <= INT32_MAX:
            raise _invalid("max_tokens", f"must be an integer in [1, {INT32_MAX}], got {self.max_tokens!r}")
        if self.seed is not None:
            if not _is_int(self.seed) or not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
                raise _invalid("seed", f"must be a 64-bit integer or None, got {self.seed!r}")
            object.__setattr__(self, "seed", int(self.seed))
        if not 0 <= self.temperature < float("inf"):
            raise _invalid("temperature", f"must be a finite number >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise _invalid("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not 0 <= self.min_p <= 1:
            raise _invalid("min_p", f"must be in [0, 1], got {self.min_p!r}")
        if not _is_int(self.top_k) or not -1 <= self.top_k <= INT32_MAX:
            raise _invalid("top_k", f"must be -1 or 0 (off) or an integer in [1, {INT32_MAX}], got {self.top_k!r}")
        object.__setattr__(self, "top_k", max(0, int(self.top_k)))  # -1 (vLLM's off) is 0
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise _invalid(name, f"must be in [-2, 2], got {getattr(self, name)!r}")
        if not 0 < self.repetition_penalty < float("inf"):
            raise _invalid("repetition_penalty", f"must be a finite number > 0, got {self.repetition_penalty!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= 20):
                raise _invalid(name, f"must be an integer in [0, 20] or None, got {value!r}")
        self._check_samples()
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        so = self.structured_outputs
        if isinstance(so, Mapping):
            object.__setattr__(self, "structured_outputs", StructuredOutputsParams(**so))
        elif so is not None and not isinstance(so, StructuredOutputsParams):
            raise _invalid("structured_outputs", f"must be StructuredOutputsParams or a dict, got {so!r}")

    def _check_stops(self) -> None:
        """``stop``: non-empty strings; ``stop_token_ids``: integers in [0, 2**31 - 1] (the vocabulary
        bound is intake's)."""
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        if any(not isinstance(s, str) for s in self.stop):
            raise _invalid("stop", f"must be a string or a list of strings, got {self.stop!r}")
        if any(not s for s in self.stop):
            raise _invalid("stop", "strings must be non-empty")
        ids = self.stop_token_ids
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise _invalid("stop_token_ids", f"must be a list of token ids, got {ids!r:.100}")
        ids = tuple(ids)
        bad = next((i for i, t in enumerate(ids) if not _is_int(t) or not 0 <= t <= INT32_MAX), None)
        if bad is not None:
            got = f"{ids[bad]!r:.100}"
            raise _invalid("stop_token_ids", f"must be token ids (integers in [0, {INT32_MAX}]), got {got}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in ids))

    def _check_samples(self) -> None:
        """``n``, ``best_of`` (1 is the same as None), the siblings' seeds and ``min_tokens``."""
        if self.best_of == 1 and not isinstance(self.best_of, bool):
            object.__setattr__(self, "best_of", None)
        if not _is_int(self.n) or not 1 <= self.n <= INT32_MAX:
            raise _invalid("n", f"must be an integer >= 1, got {self.n!r}")
        if self.best_of is not None and (not _is_int(self.best_of) or not self.n <= self.best_of <= INT32_MAX):
            raise _invalid("best_of", f"must be an integer >= n ({self.n}), got {self.best_of!r}")
        if self.seed is not None and self.seed + self.num_samples - 1 > SEED_RANGE[1]:  # sibling i runs seed + i
            raise _invalid("seed", f"must leave room for {self.num_samples} sibling seeds (seed + i), got {self.seed}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise _invalid(
                "min_tokens", f"must be an integer in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}"
            )

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
        return cls(**kwargs)


def _bias_pairs(bias: Any) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as sorted ``(token id, bias)`` pairs; ids are integers in [0, 2**31 - 1] (the
    vocabulary bound is intake's), biases in [-100, 100]."""
    items = bias.items() if isinstance(bias, Mapping) else bias
    try:
        pairs = [(k, v) for k, v in items]
    except (TypeError, ValueError):
        raise _invalid("logit_bias", f"must map token ids to numbers, got {bias!r}") from None
    pairs = [(_json_key(k), v) for k, v in pairs]
    for k, v in pairs:
        if not _is_int(k) or not 0 <= k <= INT32_MAX:
            raise _invalid("logit_bias", f"keys must be token ids (integers in [0, {INT32_MAX}]), got {k!r}")
        if not _is_real(v) or not -LOGIT_BIAS_LIMIT <= v <= LOGIT_BIAS_LIMIT:
            raise _invalid("logit_bias", f"values must be numbers in [-100, 100], got {v!r} for token {k}")
    if len({k for k, _ in pairs}) != len(pairs):
        raise _invalid("logit_bias", "names a token id twice")
    return tuple(sorted((int(k), float(v)) for k, v in pairs))


def _json_key(key: Any) -> Any:
    """A JSON object key that spells a token id (at most 10 digits: nothing longer fits int32) as an int."""
    if isinstance(key, str) and key.strip().isdigit() and len(key.strip()) <= 10:
        return int(key)
    return key


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
    # per prompt token (the first None), when prompt_logprobs was asked for: (logprob, top ids, top logprobs)
    prompt_logprobs: list[tuple[float, list[int], list[float]] | None] | None = None
    index: int = 0  # this sample's index among its request's n (best_of) samples
    samples: list[RequestOutput] | None = None  # LLM.generate with n > 1: the n samples returned (this is samples[0])

    @property
    def cumulative_logprob(self) -> float | None:
        """Sum of the sampled tokens' logprobs (None without logprobs): what ``best_of`` ranks by."""
        return None if self.logprobs is None else float(sum(lp for lp, _, _ in self.logprobs))

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time
