"""Load a llama.cpp GGUF file (``gguf`` package, numpy only) into our Llama model and tokenizer.

* Config: the GGUF metadata (``llama.block_count``, ``llama.attention.head_count``, ...) is turned
  into the ``config.json`` dict a HF checkpoint of the same model would carry, and that dict goes
  through :func:`radixflow_jax.models.hf_config.parse_hf_config` like any directory: one config path.
* Weights: every tensor is dequantised to float32 on first access (Q4_x, Q8_0, F16, ...: whatever
  ``gguf.quants`` knows) and renamed to its HF key. llama.cpp stores ``attn_q``/``attn_k`` rows
  permuted for its interleaved RoPE; :func:`unpermute_qk` undoes that exactly (inverse of the
  converter's ``permute``), or the rotary pairs mix the wrong channels and the output degrades.
  A file without ``output.weight`` has a tied head (``tie_word_embeddings``).
* Tokenizer: ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE): vocabulary, merges and token types
  from the metadata; control tokens become special tokens; the chat template is
  ``tokenizer.chat_template``.

Invariants: the config dict names only HF fields (nothing GGUF-specific reaches ``ModelConfig``);
a GGUF field we cannot map raises :class:`ConfigError` naming the GGUF key; a tensor we cannot
map or with the wrong shape raises :class:`WeightsError` naming the GGUF tensor.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterator, Mapping

import numpy as np

from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.safetensors_io import WeightsError
from radixflow_jax.models.tokenizer import Tokenizer, TokenizerError

GGUF_SUFFIX = ".gguf"
_SUPPORTED_ARCHS = ("llama",)
_TOKEN_CONTROL = 3  # llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
_TOKEN_USER_DEFINED = 4
_BLOCK = re.compile(r"^blk\.(?P<layer>\d+)\.(?P<name>[a-z_]+)\.weight$")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}  # fmt: skip


def is_gguf(path: str) -> bool:
    return os.path.isfile(path) and path.endswith(GGUF_SUFFIX)


class GgufFile:
    """An opened GGUF file: its metadata (plain Python values) and its tensors (not yet read)."""

    def __init__(self, path: str):
        import gguf

        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such GGUF file")
        try:
            reader = gguf.GGUFReader(path, "r")
        except (ValueError, OSError) as exc:
            raise WeightsError(f"{path}: not a readable GGUF file ({exc})") from exc
        self.path = path
        self.metadata: dict[str, Any] = {name: field.contents() for name, field in reader.fields.items()}
        self.tensors = {t.name: t for t in reader.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str, kind: type | tuple[type, ...] = int) -> Any:
        value = self.metadata.get(key)
        if value is None:
            raise ConfigError(f"{self.path}: GGUF metadata key '{key}' is missing")
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ConfigError(f"{self.path}: GGUF metadata key '{key}' must be {kind}, got {value!r}")
        return value


def hf_config_dict(f: GgufFile) -> dict[str, Any]:
    """The ``config.json`` dict of the model in ``f`` (HF field names; parsed by ``parse_hf_config``)."""
    arch = f.require("general.architecture", str)
    if arch not in _SUPPORTED_ARCHS:
        raise ConfigError(
            f"{f.path}: GGUF general.architecture={arch!r} is not supported; supported: {', '.join(_SUPPORTED_ARCHS)}"
        )
    heads = f.require(f"{arch}.attention.head_count")
    hidden = f.require(f"{arch}.embedding_length")
    head_dim = f.get(f"{arch}.attention.key_length", hidden // heads if heads else 0)
    rotary = f.get(f"{arch}.rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise ConfigError(f"{f.path}: GGUF {arch}.rope.dimension_count={rotary} != head_dim {head_dim} (partial RoPE)")
    if f.get(f"{arch}.attention.value_length", head_dim) != head_dim:
        raise ConfigError(f"{f.path}: GGUF {arch}.attention.value_length differs from key_length")
    tokens = f.get("tokenizer.ggml.tokens")
    vocab = f.get(f"{arch}.vocab_size", len(tokens) if tokens else None)
    cfg: dict[str, Any] = {
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": f.require(f"{arch}.block_count"),
        "intermediate_size": f.require(f"{arch}.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": f.get(f"{arch}.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(f.require(f"{arch}.attention.layer_norm_rms_epsilon", (int, float))),
        "max_position_embeddings": f.get(f"{arch}.context_length", 8192),
        "rope_theta": float(f.get(f"{arch}.rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in f.tensors,
        "bos_token_id": f.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": f.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = f.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(f.require(f"{arch}.rope.scaling.factor", float))}
    elif scaling != "none":
        raise ConfigError(f"{f.path}: GGUF {arch}.rope.scaling.type={scaling!r} is not supported (none, linear)")
    return cfg


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row order: per head it stores rows ``[0, d/2, 1, d/2+1, ...]`` as
    ``[0, 1, ..., d-1]``; HF's rotate-half layout wants the halves back together.

    ``weight`` is ``[num_heads * d, in]``; the converter did ``reshape(h, 2, d/2, in).swapaxes(1, 2)``,
    so the inverse is ``reshape(h, d/2, 2, in).swapaxes(1, 2)``."""
    rows, cols = weight.shape
    if rows % (2 * num_heads):
        raise WeightsError(f"q/k weight with {rows} rows cannot be split into {num_heads} heads of even size")
    return weight.reshape(num_heads, rows // num_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


class GgufTensors(Mapping[str, np.ndarray]):
    """The file's tensors under their HF names, dequantised to float32 ``[out, in]`` on access."""

    def __init__(self, f: GgufFile, num_heads: int, num_kv_heads: int):
        self._file = f
        self._heads = {"self_attn.q_proj": num_heads, "self_attn.k_proj": num_kv_heads}
        self._names: dict[str, str] = {}
        for name in f.tensors:
            self._names[self._hf_name(name)] = name

    def _hf_name(self, name: str) -> str:
        if name in _TOP_NAMES:
            return _TOP_NAMES[name]
        match = _BLOCK.match(name)
        if match and match["name"] in _LAYER_NAMES:
            return f"model.layers.{int(match['layer'])}.{_LAYER_NAMES[match['name']]}.weight"
        raise WeightsError(f"{self._file.path}: GGUF tensor '{name}' is not supported for a Llama model")

    def __getitem__(self, key: str) -> np.ndarray:
        import gguf

        tensor = self._file.tensors[self._names[key]]
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        shape = tuple(int(d) for d in reversed(tensor.shape))  # ggml lists dims innermost first
        if values.size != int(np.prod(shape)):
            raise WeightsError(f"{self._file.path}: GGUF tensor '{tensor.name}' has {values.size} values for {shape}")
        values = values.reshape(shape)
        heads = next((h for proj, h in self._heads.items() if key.endswith(f".{proj}.weight")), None)
        return unpermute_qk(values, heads) if heads else values

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, key: object) -> bool:
        return key in self._names


def build_tokenizer(f: GgufFile) -> Tokenizer:
    """A byte-level BPE tokenizer and chat template from the GGUF ``tokenizer.*`` metadata."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HfTokenizer

    kind = f.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise TokenizerError(f"{f.path}: GGUF tokenizer.ggml.model={kind!r} is not supported (only 'gpt2' BPE)")
    tokens: list[str] = f.get("tokenizer.ggml.tokens") or []
    merges: list[str] = f.get("tokenizer.ggml.merges") or []
    types: list[int] = f.get("tokenizer.ggml.token_type") or [1] * len(tokens)
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
    else:
        raise TokenizerError(f"{f.path}: GGUF tokenizer.ggml.pre={pre!r} is not supported (default, gpt2, smollm)")
    backend.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _TOKEN_CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _TOKEN_USER_DEFINED]
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
