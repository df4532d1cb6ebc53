"""Structured outputs: what a request constrains its output to (:class:`StructuredOutputsParams`,
vLLM's name and fields), the grammar engine's per-tokenizer handle (:class:`GrammarCompiler`) and
one request's matcher (:class:`GrammarState`). The grammar engine is ``llguidance`` (no torch).

Kinds (exactly one per request):
  * ``json``: a JSON schema (a dict, or its JSON text); ``json_object``: any JSON object;
  * ``regex``: a regular expression (Rust ``regex`` syntax) the whole output must match;
  * ``choice``: a list of strings, the output is exactly one of them;
  * ``grammar``: a context-free grammar in llguidance's Lark-like syntax (``start: ...`` rules,
    ``"literals"``, ``/regexes/``, ``%json {...}`` for embedded schemas; see llguidance's
    ``docs/syntax.md``). GBNF (llama.cpp) text is converted when it is not Lark.
JSON is generated compact (no whitespace between tokens) unless the schema's ``x-guidance``
options say otherwise.

Invariants:
  * A :class:`StructuredOutputsParams` that exists is valid: its grammar compiled without error
    (``__post_init__`` validates it, without a tokenizer); an invalid one raises
    :class:`GrammarError` naming ``field`` (the request field it came from).
  * Grammar state is per request (:class:`GrammarState`, kept on the engine's request record); it
    is never shared between requests nor stored in the prefix cache, so a preempted request
    resumes with its matcher where it was. What is shared is the compiled grammar: the compiler
    keeps the last ``GRAMMAR_CACHE_SIZE`` grammars by their text, unused matchers each request
    copies (``n`` siblings and repeated schemas compile once).
  * ``GrammarState.consumed`` tokens of the request's output were fed to the matcher, in order;
    :meth:`GrammarState.mask_into` describes the tokens allowed after exactly those.

The one-round lag of overlap (the engine plans round r+1 before round r's token is on the host):
a constrained request never has two rounds in flight. A round that sampled a constrained row is
committed before the next round is planned (``EngineCore._needs_commit_first``, as for penalised
rows), the commit advances the matcher (``RequestRecord.follow_grammar``), and the mask of the
row's next token is computed when that next round is built (``runner/inputs._fill_sampling``),
so every mask describes exactly the committed tokens. Rounds that sampled no constrained row
still overlap; the cost is one lost overlap per round that samples a constrained row.
No JAX here; ``llguidance`` and numpy are imported on first use (``serve/protocol.py`` stays light).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json as _json
import threading
import time
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import numpy as np

_JSON_DEFAULTS = {"whitespace_flexible": False}  # compact JSON; a schema's x-guidance may override it
_REGEX_META = set("\\.+*?()|[]{}^$#&-~")
GRAMMAR_CACHE_SIZE = 64  # compiled grammars kept per engine, by grammar text (least recently used out)


class GrammarError(ValueError):
    """An invalid schema, regex, choice list or grammar; ``field`` names the request field."""

    def __init__(self, message: str, field: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def _llg() -> Any:
    import llguidance

    return llguidance


def _escape(text: str) -> str:
    """``text`` as a regex that matches it literally."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


@dataclasses.dataclass(frozen=True)
class StructuredOutputsParams:
    """vLLM's ``StructuredOutputsParams``: one of ``json`` (schema dict or its JSON text), ``regex``,
    ``choice``, ``grammar`` (llguidance Lark syntax) or ``json_object=True``. ``field``: the request
    field it came from (named by errors). Stored hashable: ``json`` as canonical JSON text."""

    json: Any = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool = False
    field: str = dataclasses.field(default="structured_outputs", compare=False)

    def __post_init__(self) -> None:
        given = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            message = f"exactly one of json, regex, choice, grammar, json_object is required, got {given}"
            raise GrammarError(message, self.field)
        if self.json is not None:
            object.__setattr__(self, "json", _schema_text(self.json, self.field))
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) for c in self.choice) or not self.choice:
                raise GrammarError("choice must be a non-empty list of strings", self.field)
            object.__setattr__(self, "choice", tuple(self.choice))
        for name in ("regex", "grammar"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise GrammarError(f"{name} must be a string", self.field)
        error = _validated(self.grammar_text())
        if error:
            raise GrammarError(f"invalid {given[0].replace('_', ' ')}: {error.strip()}", self.field)

    @property
    def kind(self) -> str:
        """Which constraint this is: json, json_object, regex, choice or grammar."""
        if self.json_object:
            return "json_object"
        return next(k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None)

    def grammar_text(self) -> str:
        """The llguidance grammar of this constraint (converted once per distinct constraint)."""
        return _grammar_text(self)

    def _convert(self) -> str:
        m = _llg().LLMatcher
        if self.json is not None:
            return m.grammar_from_json_schema(self.json, defaults=_JSON_DEFAULTS)
        if self.json_object:
            return m.grammar_from_json_schema({"type": "object"}, defaults=_JSON_DEFAULTS)
        if self.regex is not None:
            return m.grammar_from_regex(self.regex)
        if self.choice is not None:
            return m.grammar_from_regex("(" + "|".join(_escape(c) for c in self.choice) + ")")
        text = self.grammar or ""
        if "start:" not in text and "::=" in text:  # GBNF (llama.cpp): llguidance converts it
            text = _llg().gbnf_to_lark(text)
        return m.grammar_from_lark(text)


@functools.lru_cache(maxsize=GRAMMAR_CACHE_SIZE)
def _grammar_text(spec: StructuredOutputsParams) -> str:
    return spec._convert()


@functools.lru_cache(maxsize=GRAMMAR_CACHE_SIZE)
def _validated(text: str) -> str:
    """llguidance's validation error of a grammar text ("" when it is valid), once per text."""
    return _llg().LLMatcher.validate_grammar(text)


def _schema_text(schema: Any, field: str) -> str:
    """A JSON schema (dict, bool or JSON text) as canonical JSON text."""
    if isinstance(schema, str):
        try:
            schema = _json.loads(schema)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema is not valid JSON ({exc})", field) from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}", field)
    try:
        return _json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise GrammarError(f"the JSON schema cannot be serialised ({exc})", field) from None


def has_grammar(tokenizer: object, vocab_size: int | None) -> bool:
    """Structured outputs can run with this tokenizer (a HF ``tokenizers`` backend) and vocabulary."""
    return vocab_size is not None and callable(getattr(tokenizer, "backend_json", None))


class GrammarCompiler:
    """The grammar engine's view of one tokenizer, per engine. Its ``LLTokenizer`` is built on the
    first :meth:`open` (up to a second on large vocabularies), so engines that never see a
    constrained request never pay for it. ``tokenizer``: a ``models/tokenizer.Tokenizer`` with a HF
    ``tokenizers`` backend (:func:`has_grammar`); ``vocab_size``: the model's logits width (the mask
    covers it; ids the tokenizer does not have are never allowed); ``eos_ids``: what ends an output."""

    def __init__(self, tokenizer: object, vocab_size: int, eos_ids: Sequence[int]):
        if not has_grammar(tokenizer, vocab_size):
            raise ValueError("structured outputs need a Hugging Face tokenizers tokenizer and a known vocabulary")
        self._source = tokenizer
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._eos = list(eos_ids) or None
        self._tok: Any = None
        self._lock = threading.Lock()
        self._compiled: collections.OrderedDict[str, Any] = collections.OrderedDict()  # text -> unused matcher

    def open(self, spec: StructuredOutputsParams) -> GrammarState:
        """A fresh matcher for one request, copied from the cached compile of its grammar text;
        ``GrammarError`` when the grammar does not compile (an error is not cached)."""
        text = spec.grammar_text()
        with self._lock:
            base = self._compiled.get(text)
            if base is None:
                base = self._compile(text, spec)
                self._compiled[text] = base
                while len(self._compiled) > GRAMMAR_CACHE_SIZE:
                    self._compiled.popitem(last=False)
            self._compiled.move_to_end(text)
            return GrammarState(base.deep_copy(), self.words)

    def trial(self, spec: StructuredOutputsParams, max_seconds: float | None) -> None:
        """Compiles ``spec`` (into the cache) and walks its first two token masks on the calling
        thread (a server's preparation worker, not the engine thread): the first mask, then the
        mask after its lowest allowed token other than EOS. :class:`GrammarError` when it does not
        compile, its lexer gives up (llguidance's fuel and state limits: a regex whose automaton
        explodes), or the walk takes longer than ``max_seconds`` (a grammar that would stall rounds)."""
        import numpy as np

        started = time.perf_counter()  # the compile counts: it is what would stall the engine thread
        state = self.open(spec)
        row = np.zeros(self.words, np.int32)
        state.mask_into(row)
        allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[: self.vocab_size])
        first = next((int(t) for t in allowed if int(t) not in (self._eos or ())), None)
        if first is not None and not state.error:
            state.advance([first])
            state.mask_into(row)
        took = time.perf_counter() - started
        if state.error:
            reason = state.error.strip().splitlines()[0][:200]
            raise GrammarError(f"the grammar engine gave up on it: {reason}", spec.field)
        if max_seconds is not None and took > max_seconds:
            message = f"too complex: compiling it and its first token masks took {took:.2f} s (bound {max_seconds:g} s)"
            raise GrammarError(message, spec.field)

    @property
    def cached(self) -> int:
        """How many compiled grammars the cache holds."""
        return len(self._compiled)

    def _compile(self, text: str, spec: StructuredOutputsParams) -> Any:
        llg = _llg()
        if self._tok is None:
            source = self._source.backend_json()  # type: ignore[attr-defined]
            self._tok = llg.LLTokenizer(source, n_vocab=self.vocab_size, eos_token=self._eos)
        matcher = llg.LLMatcher(self._tok, text, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"invalid {spec.kind.replace('_', ' ')}: {matcher.get_error().strip()}", spec.field)
        return matcher


class GrammarState:
    """One request's matcher (module docstring). ``failed``: a committed token the grammar did not
    allow (the matcher is then in its error state and allows nothing)."""

    def __init__(self, matcher: Any, words: int):
        self._matcher = matcher
        self._words = words
        self.consumed = 0
        self.failed = False

    def advance(self, output: Sequence[int]) -> int | None:
        """Feeds the tokens of ``output`` (the request's committed output) past ``consumed``. When
        the grammar completes before the last of them (a verify row committed several), feeds no
        more and returns how many of ``output`` it kept (``consumed``); else None."""
        start, new = self.consumed, list(output[self.consumed :])
        self.consumed = len(output)
        for j, token in enumerate(new):
            if self.failed:
                break
            if not self._matcher.consume_tokens([token]):
                self.failed = True
            elif j + 1 < len(new) and self._matcher.is_stopped():
                self.consumed = start + j + 1
                return self.consumed
        return None

    @property
    def error(self) -> str:
        """The matcher's error ("" while it has none)."""
        return self._matcher.get_error() if self._matcher.is_error() else ""

    @property
    def stopped(self) -> bool:
        """The grammar is complete and allows no further token (besides EOS)."""
        return self._matcher.is_stopped() and not self.failed

    def draft_masks(self, draft: Sequence[int], points: "np.ndarray", after: "np.ndarray") -> None:
        """Speculative decoding (``runner/verify.py``): ``points[j]`` gets the mask after the
        ``consumed`` tokens and ``draft[:j]``, ``after`` the mask after the whole draft. From the
        first drafted token the grammar does not allow on, the masks are all ones (that point
        rejects it, so nothing after it is committed). The matcher is left as it was."""
        fed = 0
        for j, token in enumerate(draft):
            self.mask_into(points[j])
            if self.failed or not self._matcher.try_consume_tokens([int(token)]):
                points[j + 1 :] = -1
                after[:] = -1
                break
            fed += 1
        else:
            self.mask_into(after)
        if fed:
            self._matcher.rollback(fed)

    def mask_into(self, row: "np.ndarray") -> None:
        """Writes the allowed next tokens into ``row`` (int32 ``[ceil(V/32)]``, bit ``v % 32`` of word
        ``v // 32``), after the ``consumed`` tokens."""
        import numpy as np

        bits = np.frombuffer(self._matcher.compute_bitmask(), np.int32)
        n = min(len(bits), self._words, len(row))
        row[:n] = bits[:n]
        row[n:] = 0
