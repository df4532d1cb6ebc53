"""Incremental detokenisation equals a full decode: at every step for whole characters, and at the
end always (random token streams of the tiny preset's byte-level BPE, which split characters)."""

from __future__ import annotations

import numpy as np

from radixflow_jax.engine.detok import IncrementalText
from radixflow_jax.models.api import resolve_model_path
from radixflow_jax.models.tokenizer import Tokenizer


def test_incremental_text_matches_full_decode():
    tok = Tokenizer.from_directory(resolve_model_path("tiny-qwen3.5"))
    rng = np.random.default_rng(0)
    texts = ["The passage says ünïcödé → 東京 and more", "plain ascii words only, with spaces", "emoji 🙂🙃 mixed in"]
    streams = [tok.encode(t) for t in texts] + [list(rng.integers(0, tok.vocab_size, 40)) for _ in range(20)]
    for ids in streams:
        inc = IncrementalText(tok)
        for n in range(1, len(ids) + 1):
            text = inc.update(ids[:n])
            full = tok.decode(ids[:n])
            # never ahead of, or different from, a full decode (up to a character still being split)
            cut = full.find("\ufffd")
            assert full.startswith(text) or (cut >= 0 and text[:cut] == full[:cut]), (text, full)
            if not full.endswith("\ufffd"):
                assert text == full
        assert inc.finish(ids) == tok.decode(ids)
    for t, ids in zip(texts, streams):
        inc = IncrementalText(tok)
        for n in range(1, len(ids) + 1):
            inc.update(ids[:n])
        assert inc.text == t  # whole characters: nothing held back at the end
