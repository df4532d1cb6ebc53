"""The one engine-side validation of a request: :meth:`RequestLimits.check` turns a prompt and its
sampling params into a :class:`CheckedRequest`, or raises ``TypeError`` / ``ValueError`` naming what
is wrong (an out-of-range value: ``InvalidParameterError``, whose ``field`` names it; the ranges
that need no engine facts are ``SamplingParams``'s own). ``EngineCore.add`` queues only checked requests, so nothing between the caller and the
scheduler checks a prompt again.

Where it runs: at the door of the engine. ``EngineCore.add_request`` checks and queues in one call
(single-threaded callers); ``BackgroundEngine.submit`` and ``ReplicatedEngine.submit`` check in the
caller's thread (errors raise there, before routing) and hand the checked request to the engine
thread; ``LLM.generate`` and batch jobs check every prompt before queueing any.

Invariants:
  * :class:`RequestLimits` holds only settings fixed when the engine was built (a frozen copy), so
    checking is safe off the engine thread and gives the same answer on every replica of one build.
  * A :class:`CheckedRequest` has a non-empty tuple of ``int`` token ids inside the vocabulary (inside
    int32 when the vocabulary size is unknown), ``stop_token_ids`` likewise, a ``top_k`` below the
    vocabulary size (a larger one keeps every token, so it becomes 0, off, as vLLM treats it), and
    its prompt + ``max_tokens`` fits ``max_model_len``, the KV pool and (penalised) the penalty window;
    its ``n`` / ``best_of`` are at most ``max_n``, its logit_bias ids lie in the vocabulary and its
    bias entries fit the executor's bias slots; a prompt to score (``prompt_logprobs``, ``echo``
    with ``logprobs`` over HTTP) has at most ``score_max_len`` tokens.
  * The checks run in a fixed order, so a request with several faults always gets the same error.
The HTTP layer (``serve/protocol.py``) checks the OpenAI request body on its own terms (field names,
its own context-length answer); the scheduler's ``add`` keeps its own preconditions for direct users.
No JAX here.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Sequence

from radixflow_jax.engine.params import INT32_MAX, InvalidParameterError, SamplingParams

# the longest prompt an engine scores (prompt_logprobs): its scratch sequence's capacity
# (runner/scoring.py), and so the longest time a scoring call holds the engine thread
MAX_SCORED_PROMPT = 2048


@dataclasses.dataclass(frozen=True)
class CheckedRequest:
    """A request :meth:`RequestLimits.check` accepted: its token ids and sampling params."""

    prompt: tuple[int, ...]
    params: SamplingParams


@dataclasses.dataclass(frozen=True, kw_only=True)
class RequestLimits:
    """What one engine can run. ``pool_tokens``: the longest request its KV pool holds with nothing
    else running; ``penalty_window``: the longest penalised context (0: no penalties);
    ``logprobs``: its executor returns logprobs; ``stop_strings``: it has a tokenizer;
    ``vocab_size``: None when unknown (no range check); ``bias_width``: bias entries a row may carry
    (0: no logit_bias / min_tokens); ``prompt_logprobs``: the executor computes them; ``max_n``: the
    most samples (``n``, ``best_of``) of one request (a copy of ``EngineConfig.max_n``, the setting's
    one home); ``stop_ids``: the model's EOS ids (what ``min_tokens`` bans besides ``stop_token_ids``);
    ``structured``: the engine can constrain outputs to a grammar (its executor masks and its
    tokenizer is one the grammar engine reads). ``score_max_len``: the longest prompt scored for
    ``prompt_logprobs`` (``MAX_SCORED_PROMPT``, within ``max_model_len``)."""

    max_model_len: int
    pool_tokens: int
    penalty_window: int
    logprobs: bool
    stop_strings: bool
    vocab_size: int | None
    bias_width: int = 0
    prompt_logprobs: bool = False
    max_n: int
    stop_ids: tuple[int, ...] = ()
    structured: bool = False

    @property
    def score_max_len(self) -> int:
        return min(self.max_model_len, MAX_SCORED_PROMPT)

    def check(self, prompt: Sequence[int], params: SamplingParams) -> CheckedRequest:
        """See the module docstring; nothing is queued here."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if isinstance(prompt, (str, bytes)):
            raise TypeError("prompt must be a list of token ids")
        if len(prompt) == 0:
            raise ValueError("the prompt is empty")
        if any(isinstance(t, bool) or not isinstance(t, numbers.Integral) for t in prompt):
            raise ValueError("prompt token ids must be integers")
        ids = tuple(int(t) for t in prompt)
        self._check_length(len(ids), params)
        if params.logprobs is not None and not self.logprobs:
            raise ValueError("logprobs are not available with this executor")
        if params.stop and not self.stop_strings:
            raise ValueError("stop strings need a tokenizer; this model has none (use stop_token_ids)")
        self._check_ids(ids, params)
        self._check_extras(params)
        if params.prompt_logprobs is not None and len(ids) > self.score_max_len:
            raise InvalidParameterError(
                "prompt_logprobs",
                f"prompt_logprobs (echo with logprobs) scores prompts of at most {self.score_max_len} tokens; "
                f"this one has {len(ids)}",
            )
        if params.structured_outputs is not None and not self.structured:
            raise ValueError(
                f"{params.structured_outputs.field}: structured outputs are not available on this engine "
                "(they need a Hugging Face tokenizer and an executor that masks tokens)"
            )
        if len(ids) + params.max_tokens > self.pool_tokens:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the KV pool's "
                f"{self.pool_tokens} tokens"
            )
        if self.vocab_size is not None and params.top_k >= self.vocab_size:
            params = dataclasses.replace(params, top_k=0)  # keeps every token: the same as off (as vLLM)
        return CheckedRequest(ids, params)

    def _check_ids(self, ids: tuple[int, ...], params: SamplingParams) -> None:
        """Prompt and ``stop_token_ids`` ids in the vocabulary (in int32 when its size is unknown)."""
        end = self.vocab_size if self.vocab_size is not None else INT32_MAX + 1
        where = f"the vocabulary [0, {end})" if self.vocab_size is not None else f"the int32 range [0, {end})"
        bad = next((t for t in ids if not 0 <= t < end), None)
        if bad is not None:
            raise InvalidParameterError("prompt", f"token id {bad} is outside {where}")
        bad = next((t for t in params.stop_token_ids if t >= end), None)
        if bad is not None:
            raise InvalidParameterError("stop_token_ids", f"token id {bad} is outside {where}")

    def banned(self, params: SamplingParams) -> tuple[int, ...]:
        """The token ids ``min_tokens`` masks: ``stop_token_ids`` and, unless ``ignore_eos``, EOS."""
        if not params.min_tokens:
            return ()
        return tuple(sorted(set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.stop_ids))))

    def _check_extras(self, params: SamplingParams) -> None:
        """``n`` / ``best_of`` against ``max_n``; logit_bias ids in the vocabulary and, with the
        min_tokens bans, within the bias slots; prompt_logprobs available."""
        for name in ("n", "best_of"):
            value = getattr(params, name)
            if value is not None and value > self.max_n:
                limit = f"this engine's limit of {self.max_n} samples per request (max_n)"
                raise ValueError(f"{name}={value} exceeds {limit}")
        entries = len(params.logit_bias) + len(self.banned(params))
        if entries and not self.bias_width:
            raise ValueError("logit_bias and min_tokens are not available with this executor")
        if entries > self.bias_width:
            raise ValueError(
                f"logit_bias has {len(params.logit_bias)} entries and min_tokens bans "
                f"{entries - len(params.logit_bias)} stop tokens: more than the {self.bias_width} allowed"
            )
        if self.vocab_size is not None:
            bad = next((t for t, _ in params.logit_bias if t >= self.vocab_size), None)
            if bad is not None:
                raise InvalidParameterError(
                    "logit_bias", f"logit_bias: token id {bad} is outside the vocabulary [0, {self.vocab_size})"
                )
        if params.prompt_logprobs is not None and not self.prompt_logprobs:
            raise ValueError("prompt_logprobs are not available with this executor")

    def _check_length(self, num_prompt: int, params: SamplingParams) -> None:
        if num_prompt + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({num_prompt} tokens) + max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len={self.max_model_len}"
            )
        if params.has_penalty and num_prompt + params.max_tokens > self.penalty_window:
            raise ValueError(
                f"penalties need the whole context in the penalty window ({self.penalty_window} tokens, engine option "
                f"penalty_window); this request has {num_prompt} prompt tokens + max_tokens {params.max_tokens}"
            )
