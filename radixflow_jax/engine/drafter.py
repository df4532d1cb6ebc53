"""Drafts from a separate model (speculative decoding, ``SpeculativeConfig(method="draft",
draft_model=...)``, ``scheduler/drafts.Drafter``).

The draft model runs in an engine of its own (its own pools, radix cache and compiled steps): a
request's draft is that engine's greedy continuation of the request's tokens, ``num_draft`` tokens
long. Its prefix cache holds the request's earlier tokens from the previous round's draft, so a
round's draft computes the tokens the target committed since (an attention-only draft model hits
at page granularity, a hybrid one at its exact request end). Before the scheduler plans a round,
the running set hands it every speculating request's tokens (:meth:`ModelDrafter.prefetch`): one
run of the draft engine drafts them all, its rounds batching the requests; the round waits for
it. Asks while planning (and again for a draft lengthened into a variant's padding,
``RunningSet.fill_drafts``) are answered from the drafts kept; an ask for tokens not kept drafts
them alone.

Invariants: a draft is a pure function of the tokens (greedy, EOS ignored), so the target's
outputs never depend on it (``tests/engine/test_draft_model.py``); the draft model's vocabulary is
the target's (:func:`model_drafter` refuses another)."""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from radixflow_jax.engine.params import SamplingParams

if TYPE_CHECKING:
    from radixflow_jax.engine.config import EngineConfig
    from radixflow_jax.engine.core import EngineCore
    from radixflow_jax.models.api import LoadedModel

FAILURES = 3  # draft engine failures in a row after which drafting stops (logged)
_LOG = logging.getLogger("radixflow.drafter")


class ModelDrafter:
    """``drafter(tokens, k)``: up to ``k`` tokens the draft engine ``core`` continues ``tokens`` with
    (cut before any id at or past ``vocab``, the target's vocabulary); ``keep``: drafts kept for
    repeated asks, more than a round's running requests.

    A failure of the draft engine never fails the target: the round gets no drafts, the draft
    engine's requests are aborted and forgotten, the reason is logged, and after ``FAILURES`` in a
    row drafting stops for good (``disabled`` says why); the target decodes without drafts."""

    def __init__(self, core: EngineCore, num_draft: int, *, vocab: int, keep: int) -> None:
        self.core = core
        self.params = SamplingParams(max_tokens=num_draft, temperature=0.0, ignore_eos=True)
        self.vocab, self.keep = vocab, keep
        self._kept: OrderedDict[tuple[int, ...], tuple[int, ...]] = OrderedDict()
        self.drafts = 0  # requests the draft engine drafted
        self.failures = 0  # failed draft engine runs in a row
        self.disabled: str | None = None

    def __call__(self, tokens: Sequence[int], k: int) -> tuple[int, ...]:
        key = tuple(tokens)
        if key not in self._kept:
            self.prefetch([key])
        return self._kept.get(key, ())[:k]

    def prefetch(self, requests: Sequence[Sequence[int]]) -> None:
        """Drafts every one of ``requests`` (token lists) not kept yet, in one run of the draft
        engine (its rounds batch them); the running set calls it before planning a round."""
        keys = list(dict.fromkeys(tuple(t) for t in requests if tuple(t) not in self._kept))
        if not keys or self.disabled:
            return
        rids: list[int] = []
        try:
            rids = [self.core.add_request(list(key), self.params) for key in keys]
            self.core.run_until_done()
            drafts = [self._valid(self.core.output(rid).token_ids) for rid in rids]
        except Exception as exc:  # noqa: BLE001 - the target must go on without drafts
            self._failed(exc, rids)
            return
        finally:
            del self.core.records[:-self.keep]  # nobody reads the draft engine's round records
        for key, rid, draft in zip(keys, rids, drafts):
            self.core.forget(rid)
            self._kept[key] = draft
            self._kept.move_to_end(key)
        self.drafts += len(keys)
        self.failures = 0
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)

    def _valid(self, tokens: Sequence[int]) -> tuple[int, ...]:
        out = []
        for t in tokens:
            if not 0 <= t < self.vocab:
                break
            out.append(int(t))
        return tuple(out)

    def _failed(self, exc: Exception, rids: list[int]) -> None:
        for rid in rids:
            with contextlib.suppress(Exception):
                self.core.abort(rid)
                self.core.forget(rid)
        self.failures += 1
        if self.failures >= FAILURES:
            self.disabled = f"{type(exc).__name__}: {exc}"
            _LOG.error("draft model failed %d times in a row; speculation stops: %s", self.failures, self.disabled)
        else:
            _LOG.warning("draft model failed (the round goes on without drafts): %s: %s", type(exc).__name__, exc)


def model_drafter(target: LoadedModel, ec: EngineConfig, max_model_len: int) -> ModelDrafter:
    """The drafter of ``ec.scheduler.speculative.draft_model`` for ``target``: its engine has the
    target's batch limits and warm-up mode (``warmup=True`` compiles its variants at start too),
    prefix caching (whatever the target's policy), pools sized for the draft model (not the
    target's sizes), no host tier and no speculation of its own. Raises
    ``ValueError`` naming ``draft_model`` when its tokenizer is not the target's (the same
    encoding of a probe text; without tokenizers, the same vocabulary size)."""
    from radixflow_jax.engine.build import build_engine
    from radixflow_jax.models.api import load

    spec = ec.scheduler.speculative
    assert spec is not None and spec.draft_model is not None
    draft = load(spec.draft_model, target.dtype)
    ours, theirs = target.config.vocab_size, draft.config.vocab_size
    probe = "A draft, 12 tokens: ok?"
    tokenizers = (target.tokenizer, draft.tokenizer)
    if None in tokenizers:
        same = ours == theirs
    else:
        same = tokenizers[0].encode(probe) == tokenizers[1].encode(probe)  # type: ignore[union-attr]
    if not same:
        raise ValueError(
            f"speculative draft_model {spec.draft_model!r}: its tokenizer or vocabulary ({theirs} tokens) is not the "
            f"model's ({ours} tokens)"
        )
    config = ec.with_options(
        speculative=None, max_model_len=max_model_len + spec.num_draft, warmup_progress=False,
        policy="radixflow", num_kv_pages=None, num_state_slots=None, host_cache_gb=0, num_host_slots=None,
    )  # fmt: skip
    keep = 4 * ec.scheduler.max_num_seqs
    return ModelDrafter(build_engine(draft, config), spec.num_draft, vocab=ours, keep=keep)
