"""The tokenizer in a GGUF file: read from ``tokenizer.*`` metadata, and written from a HF directory.

Reading: ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE): vocabulary, merges and token types
from the metadata; control tokens become special tokens; the chat template is
``tokenizer.chat_template``. Writing lays the vocabulary out as llama.cpp's converter does
(``tokens`` by id with ``[PADi]`` for holes, CONTROL for special added tokens, USER_DEFINED for other
added tokens, merges and special ids through ``gguf.SpecialVocab``).

Invariant: only the pre-tokenizers we can rebuild exactly are read or written (``gpt2``/``default``:
the GPT-2 split; ``smollm``: digits split first; read only: ``qwen2`` and ``qwen35``, the split
regexes of Qwen2's and Qwen3.5's ``tokenizer.json``, then byte-level without the GPT-2 regex); any
other raises naming the key.
"""

from __future__ import annotations

import json
import os
from typing import Any

from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.gguf.reader import GgufFile
from radixflow_jax.models.tokenizer import Tokenizer, TokenizerError

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5
# the pre-tokenizer split regexes of the Qwen tokenizers (their tokenizer.json), by llama.cpp's name
SPLIT_REGEX = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen35": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def build_tokenizer(f: GgufFile) -> Tokenizer:
    """A byte-level BPE tokenizer and chat template from the GGUF ``tokenizer.*`` metadata."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HfTokenizer

    kind = f.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise TokenizerError(f"{f.path}: GGUF tokenizer.ggml.model={kind!r} is not supported (only 'gpt2' BPE)")
    tokens: list[str] = f.get("tokenizer.ggml.tokens") or []
    merges: list[str] = f.get("tokenizer.ggml.merges") or []
    types: list[int] = f.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    if not tokens or len(types) != len(tokens):
        raise TokenizerError(f"{f.path}: GGUF tokenizer.ggml.tokens/token_type are missing or of different lengths")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = HfTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs, fuse_unk=False))
    pre = f.get("tokenizer.ggml.pre", "default")
    prefix = bool(f.get("tokenizer.ggml.add_space_prefix", False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=True)
    if pre == "smollm":  # llama.cpp: every digit is its own pre-token, then the GPT-2 split
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("default", "gpt2", "gpt-2"):
        backend.pre_tokenizer = byte_level
    elif pre in SPLIT_REGEX:
        split = pre_tokenizers.Split(Regex(SPLIT_REGEX[pre]), behavior="isolated", invert=False)
        no_regex = pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=False)
        backend.pre_tokenizer = pre_tokenizers.Sequence([split, no_regex])
    else:
        names = ", ".join(("default", "gpt2", "smollm", *SPLIT_REGEX))
        raise TokenizerError(f"{f.path}: GGUF tokenizer.ggml.pre={pre!r} is not supported ({names})")
    backend.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == TOKEN_CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == TOKEN_USER_DEFINED]
    backend.add_special_tokens(special)
    backend.add_tokens(user)

    def text(key: str) -> str | None:
        idx = f.get(key)
        return tokens[idx] if isinstance(idx, int) and 0 <= idx < len(tokens) else None

    return Tokenizer(
        backend,
        chat_template=f.get("tokenizer.chat_template"),
        bos_token=text("tokenizer.ggml.bos_token_id"),
        eos_token=text("tokenizer.ggml.eos_token_id"),
    )


def _pre_tokenizer_name(spec: dict[str, Any] | None, path: str) -> str:
    """The llama.cpp ``tokenizer.ggml.pre`` name of a ``tokenizer.json`` pre-tokenizer we can rebuild."""
    if spec and spec.get("type") == "ByteLevel" and spec.get("use_regex", True):
        return "gpt2"
    parts = spec.get("pretokenizers", []) if spec and spec.get("type") == "Sequence" else []
    if [p.get("type") for p in parts] == ["Digits", "ByteLevel"] and parts[0].get("individual_digits"):
        return "smollm"
    raise ConfigError(
        f"{path}: pre_tokenizer {json.dumps(spec)[:120]} has no GGUF tokenizer.ggml.pre we can write "
        "(byte-level GPT-2 split or digits + GPT-2)"
    )


def write_vocab(writer: Any, model_dir: str, vocab_size: int) -> None:
    """Adds the ``tokenizer.*`` keys of ``model_dir``'s ``tokenizer.json`` to a ``gguf.GGUFWriter``."""
    import gguf
    from tokenizers import Tokenizer as HfTokenizer

    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(path):
        raise ConfigError(f"{model_dir}: no tokenizer.json, which a GGUF file needs (tokenizer.ggml.tokens)")
    with open(path) as fh:
        spec = json.load(fh)
    if spec.get("model", {}).get("type") != "BPE":
        raise ConfigError(f"{path}: model type {spec.get('model', {}).get('type')!r}: only BPE is written to GGUF")
    backend = HfTokenizer.from_file(path)
    by_id = {i: t for t, i in backend.get_vocab(with_added_tokens=True).items()}
    added = backend.get_added_tokens_decoder()
    if by_id and max(by_id) >= vocab_size:
        raise ConfigError(f"{path}: token id {max(by_id)} >= vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
            continue
        tokens.append(by_id[i])
        types.append(TOKEN_NORMAL if i not in added else TOKEN_CONTROL if added[i].special else TOKEN_USER_DEFINED)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_tokenizer_name(spec.get("pre_tokenizer"), path))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=vocab_size).add_to_gguf(writer)
