"""Drafts from a separate model (speculative decoding, ``SpeculativeConfig(method="draft",
draft_model=...)``, ``scheduler/drafts.Drafter``).

The draft model runs in an engine of its own (its own pools, radix cache and compiled steps): a
request's draft is that engine's greedy continuation of the request's tokens, ``num_draft`` tokens
long. Its prefix cache holds the request's earlier tokens from the previous round's draft, so a
round's draft computes the tokens the target committed since (an attention-only draft model hits
at page granularity, a hybrid one at its exact request end). The scheduler asks per request while
it plans a round; the draft engine runs to completion inside that call, so a round waits for its
drafts. The same tokens asked twice in a row (a draft lengthened into a variant's padding,
``RunningSet.fill_drafts``) are answered from the last drafts kept.

Invariants: a draft is a pure function of the tokens (greedy, EOS ignored), so the target's
outputs never depend on it (``tests/engine/test_draft_model.py``); the draft model's vocabulary is
the target's (:func:`model_drafter` refuses another)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from radixflow_jax.engine.params import SamplingParams

if TYPE_CHECKING:
    from radixflow_jax.engine.config import EngineConfig
    from radixflow_jax.engine.core import EngineCore
    from radixflow_jax.models.api import LoadedModel

KEPT = 64  # drafts kept for repeated asks: more than a round's running requests


class ModelDrafter:
    """``drafter(tokens, k)``: up to ``k`` tokens the draft engine ``core`` continues ``tokens`` with."""

    def __init__(self, core: EngineCore, num_draft: int) -> None:
        self.core = core
        self.params = SamplingParams(max_tokens=num_draft, temperature=0.0, ignore_eos=True)
        self._kept: OrderedDict[tuple[int, ...], tuple[int, ...]] = OrderedDict()
        self.drafts = 0  # draft engine runs (asks answered from the kept drafts not counted)

    def __call__(self, tokens: Sequence[int], k: int) -> tuple[int, ...]:
        key = tuple(tokens)
        draft = self._kept.get(key)
        if draft is None:
            rid = self.core.add_request(list(key), self.params)
            self.core.run_until_done()
            draft = tuple(self.core.output(rid).token_ids)
            self.core.forget(rid)
            self.drafts += 1
            self._kept[key] = draft
            if len(self._kept) > KEPT:
                self._kept.popitem(last=False)
        return draft[:k]


def model_drafter(target: LoadedModel, ec: EngineConfig, max_model_len: int) -> ModelDrafter:
    """The drafter of ``ec.scheduler.speculative.draft_model`` for ``target``: its engine has the
    target's batch limits, prefix caching and no speculation of its own. Raises ``ValueError``
    naming ``draft_model`` when its vocabulary is not the target's."""
    from radixflow_jax.engine.build import build_engine
    from radixflow_jax.models.api import load

    spec = ec.scheduler.speculative
    assert spec is not None and spec.draft_model is not None
    draft = load(spec.draft_model, target.dtype)
    ours, theirs = target.config.vocab_size, draft.config.vocab_size
    probe = "A draft, 12 tokens: ok?"
    tokenizers = (target.tokenizer, draft.tokenizer)
    if ours != theirs or (None not in tokenizers and tokenizers[0].encode(probe) != tokenizers[1].encode(probe)):
        raise ValueError(
            f"speculative draft_model {spec.draft_model!r}: its vocabulary ({theirs} tokens) or tokenizer is not the "
            f"model's ({ours} tokens)"
        )
    config = ec.with_options(speculative=None, max_model_len=max_model_len + spec.num_draft, warmup=False,
                             warmup_progress=False)  # fmt: skip
    return ModelDrafter(build_engine(draft, config), spec.num_draft)
