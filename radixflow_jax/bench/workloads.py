"""Seeded benchmark workloads (token ids; no dataset is downloaded).

Statistics follow docs/design.md, "Workloads and model sizes":
  * ``race``: articles of ~420 tokens (middle/high school mix), 3-5 questions each of ~45 tokens
    (question + 4 options + template), one-letter answers;
  * ``quality``: articles of ~6.5-7k tokens, up to 20 questions each (~17.7 on average), 60-80 tokens;
  * ``gsp``: SGLang's generated-shared-prefix shape (groups x prompts, system prompt, question, output);
  * ``multiturn``: conversations whose next turn extends the previous turn (prompt + answer + new text);
  * ``agentic``: agent sessions (``bench/agentic.py``): one long system prompt of tool descriptions
    (``article_len`` tokens, default 1200) shared by every session, a task of 40 tokens, then per
    turn a tool result (``question_len``, default 96) after the model's real answer
    (``max_tokens``, default 24); tokenised by the model's tokenizer when ``generate`` gets one.
In both conversational workloads turn k is stored without the history: the driver sends it after
turn k-1 finished, with turn k-1's prompt and its real answer in front (``turns`` per conversation),
``think_s`` seconds later (``think_time``: a mean, exponential draws, seeded; 0 by default). With
many conversations and a think time, the others push a conversation's state out of the device pool
before it returns (the host tier's case, ``cache/tiers.py``).
Arrivals: ``burst`` (each article's questions together, articles spaced by ``1 / rate``), ``all``
(everything at t=0), ``poisson`` (requests shuffled, exponential gaps at ``rate`` requests/s),
``sessions`` (articles or conversations arrive as a Poisson process at ``rate`` per second; an
article's questions arrive together, or spread uniformly over ``session_window`` seconds after it;
a conversation's later turns follow its answers as always).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from radixflow_jax.bench import agentic
from radixflow_jax.bench.agentic import Encode

WORKLOADS = ("race", "quality", "gsp", "multiturn", "agentic")
CONVERSATIONS = ("multiturn", "agentic")  # turn k+1 follows turn k's answer
ARRIVALS = ("burst", "all", "poisson", "sessions")


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    prompt: tuple[int, ...]
    max_tokens: int
    arrival_s: float = 0.0
    group: int = 0  # article / conversation id
    turn: int = 0  # multiturn: the turn index (turn k+1 depends on turn k's answer)
    think_s: float = 0.0  # conversations: seconds from turn k-1's answer to this turn's arrival


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    name: str = "race"
    num_requests: int = 64
    seed: int = 0
    arrival: str = "burst"
    rate: float = 8.0  # requests/s for poisson; articles (conversations) per second for burst and sessions
    session_window: float = 0.0  # sessions: an article's questions arrive within this many seconds
    vocab: int = 500  # ids drawn from [3, vocab)
    article_len: int | None = None
    question_len: int | None = None
    max_tokens: int | None = None
    turns: int | None = None  # conversational workloads: turns per conversation (multiturn 4, agentic 5)
    think_time: float = 0.0  # conversational workloads: mean seconds between an answer and the next turn

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(f"unknown workload {self.name!r}; workloads: {', '.join(WORKLOADS)} or a .jsonl file")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"unknown arrival {self.arrival!r}; arrivals: {', '.join(ARRIVALS)}")
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        if not self.session_window >= 0:
            raise ValueError(f"session_window must be >= 0, got {self.session_window}")
        if not self.think_time >= 0:
            raise ValueError(f"think_time must be >= 0, got {self.think_time}")
        if self.turns is not None and self.turns < 1:
            raise ValueError(f"turns must be >= 1, got {self.turns}")


def _ids(rng: np.random.Generator, n: int, vocab: int) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(3, vocab, max(1, n)))


def _articles(
    spec: WorkloadSpec,
    rng: np.random.Generator,
    art_mean: int,
    art_sd: int,
    q_mean: int,
    q_sd: int,
    per_article: Sequence[int],
    out: int,
) -> list[BenchRequest]:
    reqs: list[BenchRequest] = []
    template = _ids(rng, 12, spec.vocab)  # shared instruction header
    group = 0
    while len(reqs) < spec.num_requests:
        n_art = spec.article_len or int(max(32, rng.normal(art_mean, art_sd)))
        article = template + _ids(rng, n_art, spec.vocab)
        count = int(rng.choice(per_article))
        for _ in range(min(count, spec.num_requests - len(reqs))):
            n_q = spec.question_len or int(max(8, rng.normal(q_mean, q_sd)))
            prompt = article + _ids(rng, n_q, spec.vocab)
            reqs.append(BenchRequest(prompt=prompt, max_tokens=spec.max_tokens or out, group=group))
        group += 1
    return reqs


def _gsp(spec: WorkloadSpec, rng: np.random.Generator) -> list[BenchRequest]:
    per_group = 16
    sys_len, q_len = spec.article_len or 2048, spec.question_len or 128
    reqs = []
    group = 0
    while len(reqs) < spec.num_requests:
        system = _ids(rng, sys_len, spec.vocab)
        for _ in range(min(per_group, spec.num_requests - len(reqs))):
            prompt = system + _ids(rng, q_len, spec.vocab)
            reqs.append(BenchRequest(prompt=prompt, max_tokens=spec.max_tokens or 256, group=group))
        group += 1
    return reqs


def _multiturn(spec: WorkloadSpec, rng: np.random.Generator) -> list[BenchRequest]:
    """Each conversation's turns; turn k's prompt is stored without the previous answers (the
    driver appends the real answers when it submits turn k)."""
    turns = spec.turns or 4
    reqs = []
    group = 0
    while len(reqs) < spec.num_requests:
        first = _ids(rng, spec.article_len or 300, spec.vocab)
        for t in range(min(turns, spec.num_requests - len(reqs))):
            text = first if t == 0 else _ids(rng, spec.question_len or 40, spec.vocab)
            reqs.append(BenchRequest(prompt=text, max_tokens=spec.max_tokens or 32, group=group, turn=t))
        group += 1
    return reqs


def _agentic(spec: WorkloadSpec, rng: np.random.Generator, encode: Encode) -> list[BenchRequest]:
    """Agent sessions over one shared system prompt; turn 0 is the system prompt and the task, each
    later turn a tool result (the driver puts the history, with the real answers, in front)."""
    turns, out = spec.turns or 5, spec.max_tokens or 24
    system = agentic.system_prompt(rng, encode, spec.article_len or 1200)
    reqs: list[BenchRequest] = []
    group = 0
    while len(reqs) < spec.num_requests:
        for t in range(min(turns, spec.num_requests - len(reqs))):
            if t == 0:
                text = system + agentic.task(rng, encode, 40, group)
            else:
                text = agentic.tool_result(rng, encode, spec.question_len or 96, t)
            reqs.append(BenchRequest(prompt=text, max_tokens=out, group=group, turn=t))
        group += 1
    return reqs


def _arrivals(spec: WorkloadSpec, reqs: list[BenchRequest], rng: np.random.Generator) -> list[BenchRequest]:
    if spec.arrival == "all":
        return reqs
    if spec.arrival == "burst":
        return [dataclasses.replace(r, arrival_s=r.group / spec.rate) for r in reqs]
    if spec.arrival == "sessions":
        groups = max(r.group for r in reqs) + 1
        gaps = rng.exponential(1.0 / spec.rate, groups)
        starts = np.cumsum(gaps) - gaps[0]
        spread = rng.uniform(0.0, spec.session_window, len(reqs)) if spec.session_window else np.zeros(len(reqs))
        return [
            dataclasses.replace(r, arrival_s=float(starts[r.group] + (0.0 if r.turn else d)))
            for r, d in zip(reqs, spread)
        ]
    order = rng.permutation(len(reqs)) if spec.name not in CONVERSATIONS else np.arange(len(reqs))
    gaps = rng.exponential(1.0 / spec.rate, len(reqs))
    times = np.cumsum(gaps) - gaps[0]
    return [dataclasses.replace(reqs[i], arrival_s=float(t)) for i, t in zip(order, times)]


def generate(spec: WorkloadSpec, encode: Encode | None = None) -> list[BenchRequest]:
    """The workload's requests in arrival order (seeded: same spec and encoder, same requests).
    ``encode``: the model's tokenizer, for the workloads written as text (``agentic``); without one
    they take :class:`~radixflow_jax.bench.agentic.WordIds` over ``spec.vocab``. The others draw ids."""
    rng = np.random.default_rng(spec.seed)
    if spec.name == "race":
        reqs = _articles(spec, rng, 420, 80, 45, 8, (3, 4, 5), 1)
    elif spec.name == "quality":
        reqs = _articles(spec, rng, 6700, 300, 70, 6, tuple(range(12, 21)), 1)
    elif spec.name == "gsp":
        reqs = _gsp(spec, rng)
    elif spec.name == "agentic":
        reqs = _agentic(spec, rng, encode if encode is not None else agentic.WordIds(spec.vocab))
    else:
        reqs = _multiturn(spec, rng)
    reqs = _arrivals(spec, reqs, rng)
    if spec.think_time and spec.name in CONVERSATIONS:  # drawn after the rest: same requests otherwise
        think = np.random.default_rng([spec.seed, 1]).exponential(spec.think_time, len(reqs))
        reqs = [dataclasses.replace(r, think_s=float(t)) if r.turn else r for r, t in zip(reqs, think)]
    return sorted(reqs, key=lambda r: r.arrival_s)
