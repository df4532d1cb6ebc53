"""The oracle API: load a model by preset name or directory, run full forwards and incremental spans.

``load(path_or_preset, dtype=...)`` returns a :class:`LoadedModel` with
``logits(token_ids) -> np.ndarray[T, vocab]`` (one sequence, float32) and the incremental path the
engine uses: :meth:`LoadedModel.new_sequence`, :meth:`LoadedModel.extend` (a span of any length
through the chunked scan, with cached KV and recurrent state carried) and
:meth:`LoadedModel.decode` (one token through the decode updates).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from radixflow_jax.models import presets
from radixflow_jax.models.batch import Batch, ModelCache, init_cache
from radixflow_jax.models.config import ConfigError, ModelConfig
from radixflow_jax.models.hf_config import parse_hf_config
from radixflow_jax.models.hybrid import HybridLM
from radixflow_jax.models.mixers.attention import KvPages
from radixflow_jax.models.mtp import mtp_layer_config, mtp_layer_count
from radixflow_jax.models.safetensors_io import WeightsError
from radixflow_jax.models.tokenizer import Tokenizer
from radixflow_jax.models.gguf import is_gguf
from radixflow_jax.models.weights import has_orbax, load_orbax_state, load_safetensors_state

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_PAGE_SIZE = 16


def resolve_dtype(dtype: str | jnp.dtype) -> jnp.dtype:
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(_DTYPES)}")
        return _DTYPES[dtype]
    return jnp.dtype(dtype)


def resolve_model_path(path_or_preset: str) -> str:
    """A directory holding ``config.json`` or a ``.gguf`` file. A tiny preset is materialised in the
    preset cache; a packaged preset (``smollm2-135m``) resolves to the file its package installed."""
    if presets.is_preset(path_or_preset):
        return presets.materialize(path_or_preset)
    if is_gguf(path_or_preset):
        return path_or_preset
    if not os.path.isdir(path_or_preset):
        raise FileNotFoundError(
            f"model {path_or_preset!r} is neither a directory nor a preset nor a .gguf file ({', '.join(presets.names())})"
        )
    if not os.path.exists(os.path.join(path_or_preset, "config.json")):
        raise FileNotFoundError(f"{path_or_preset}: no config.json")
    return path_or_preset


def read_config(model_dir: str) -> ModelConfig:
    with open(os.path.join(model_dir, "config.json")) as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{model_dir}/config.json is not valid JSON ({exc})") from exc
    return parse_hf_config(raw)


@dataclasses.dataclass
class SequenceState:
    """One sequence's cache: contiguous pages ``1..n`` (page 0 is the padding sink), state slot 1."""

    cache: ModelCache
    length: int
    capacity: int


class LoadedModel:
    """A model with its parameters on the device and, when the directory has one, its tokenizer."""

    def __init__(
        self,
        model_dir: str,
        cfg: ModelConfig,
        graphdef: nnx.GraphDef,
        state: nnx.State,
        dtype: jnp.dtype,
        tokenizer: Tokenizer | None = None,
    ):
        self.model_dir = model_dir  # a directory, or the .gguf file the model came from
        self.config = cfg
        self.dtype = dtype
        self.graphdef = graphdef
        self.params = state
        if tokenizer is None and os.path.isdir(model_dir) and Tokenizer.exists(model_dir):
            tokenizer = Tokenizer.from_directory(model_dir)
        self.tokenizer = tokenizer
        self._forward = jax.jit(self._forward_impl, static_argnames=("num_decode",), donate_argnames=("cache",))
        # step executables that the engines built on this model share (runner/step.CompiledStep):
        # a second engine on one model takes the variants the first compiled instead of tracing them
        self.compiled_variants: dict[tuple, Callable] = {}

    @property
    def module(self) -> HybridLM:
        return nnx.merge(self.graphdef, self.params)

    def _forward_impl(
        self, params: nnx.State, tokens: jax.Array, batch: Batch, cache: ModelCache, *, num_decode: int
    ) -> tuple[jax.Array, ModelCache]:
        model = nnx.merge(self.graphdef, params)
        hidden, cache = model(tokens, batch, cache, num_decode=num_decode)
        return model.logits(hidden), cache

    def new_sequence(self, capacity: int = 2048) -> SequenceState:
        pages = -(-capacity // _PAGE_SIZE)
        cache = init_cache(self.config, num_pages=pages + 1, page_size=_PAGE_SIZE, num_slots=2, dtype=self.dtype)
        return SequenceState(cache=self.place_cache(cache), length=0, capacity=pages * _PAGE_SIZE)

    def place_cache(self, cache: ModelCache) -> ModelCache:
        """Places fresh pools on the model's devices (one device: as created; see models/sharding)."""
        return cache

    def _run(self, seq: SequenceState, ids: Sequence[int], num_decode: int) -> np.ndarray:
        n = len(ids)
        if n == 0:
            raise ValueError("empty token span")
        if seq.length + n > seq.capacity:
            raise ValueError(f"sequence of {seq.length + n} tokens exceeds its capacity {seq.capacity}")
        self._check_ids(ids)
        tokens, batch = _one_row(ids, seq.length, seq.capacity, num_decode)
        logits, seq.cache = self._forward(self.params, tokens, batch, seq.cache, num_decode=num_decode)
        seq.length += n
        return np.asarray(logits[:n])

    def mtp_logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced MTP guesses over one sequence (a model loaded with ``mtp=True``): row
        ``t`` is the first MTP layer's float32 logits for token ``t + 2``, from the trunk's hidden
        state at ``t`` and token ``t + 1`` (``models/mtp.py``); ``[T - 1, vocab]``."""
        if self.config.mtp_layers == 0:
            raise ValueError(f"{self.model_dir} was loaded without MTP layers (load(..., mtp=True))")
        n = len(token_ids)
        if n < 2:
            raise ValueError("MTP guesses need at least two tokens")
        self._check_ids(token_ids)
        seq = self.new_sequence(n)
        tokens, batch = _one_row(token_ids, 0, seq.capacity, 0)
        mtp_kv = init_cache(
            mtp_layer_config(self.config), num_pages=seq.capacity // _PAGE_SIZE + 1, page_size=_PAGE_SIZE,
            num_slots=1, dtype=self.dtype,
        ).kv[0]  # fmt: skip
        logits = _mtp_teacher_forced(self.graphdef, self.params, tokens, batch, seq.cache, mtp_kv)
        return np.asarray(logits[: n - 1])

    def extend(self, seq: SequenceState, ids: Sequence[int]) -> np.ndarray:
        """Processes a span through the chunked path; returns its logits ``[n, vocab]`` (float32)."""
        return self._run(seq, ids, num_decode=0)

    def decode(self, seq: SequenceState, token_id: int) -> np.ndarray:
        """Processes one token through the decode path; returns its logits ``[vocab]``."""
        return self._run(seq, [token_id], num_decode=1)[0]

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Full forward of one sequence: float32 logits ``[T, vocab]``."""
        seq = self.new_sequence(max(len(token_ids), 1))
        return self.extend(seq, token_ids)

    def recurrent_states(self, seq: SequenceState) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(conv_state [K-1, C], ssm_state)`` of every recurrent layer, in layer order."""
        return [(np.asarray(c[1]), np.asarray(s[1])) for c, s in zip(seq.cache.conv, seq.cache.ssm)]

    def _check_ids(self, ids: Sequence[int]) -> None:
        bad = [t for t in ids if not 0 <= int(t) < self.config.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})")

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError(f"{self.model_dir} has no tokenizer.json: pass token ids instead of text")
        return self.tokenizer.encode(text)


def _one_row(ids: Sequence[int], start: int, capacity: int, num_decode: int) -> tuple[jax.Array, Batch]:
    """Tokens and batch of one row feeding ``ids`` at positions ``start ..`` into pages ``1 ..`` and
    state slot 1 (prefill rows padded to a power of two, at least 8)."""
    n = len(ids)
    padded = n if num_decode else max(8, 1 << (n - 1).bit_length())
    tokens = np.zeros(padded, np.int32)
    tokens[:n] = ids
    pos = np.arange(start, start + n)
    slots = np.zeros(padded, np.int32)
    slots[:n] = (pos // _PAGE_SIZE + 1) * _PAGE_SIZE + pos % _PAGE_SIZE
    batch = Batch(
        cu_seqlens=jnp.asarray([0, n], jnp.int32),
        kv_lens=jnp.asarray([start + n], jnp.int32),
        page_table=jnp.arange(1, capacity // _PAGE_SIZE + 1, dtype=jnp.int32)[None, :],
        slot_mapping=jnp.asarray(slots),
        state_slots=jnp.asarray([1], jnp.int32),
        decode_base=jnp.asarray(1, jnp.int32),
    )
    return jnp.asarray(tokens), batch


@functools.partial(jax.jit, static_argnums=(0,))
def _mtp_teacher_forced(
    graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array, batch: Batch, cache: ModelCache, mtp_kv: KvPages
) -> jax.Array:
    """The trunk over one prefill row, then the first MTP layer with each slot's next token."""
    model = nnx.merge(graphdef, params)
    hidden, _ = model(tokens, batch, cache)
    next_tokens = jnp.concatenate([tokens[1:], tokens[:1]])  # the last slot's guess is dropped
    m, _ = model.mtp_step(next_tokens, hidden, batch, mtp_kv)
    return model.logits(m)


def load(path_or_preset: str, dtype: str | jnp.dtype = "float32", *, mtp: bool = False) -> LoadedModel:
    """Loads a preset, a HF directory (safetensors), a ``radixflow convert`` output (orbax) or a
    llama.cpp ``.gguf`` file (dequantised; config and tokenizer from its metadata). ``mtp``: also
    load the checkpoint's MTP layers (``models/mtp.py``; HF ``mtp.*``, GGUF nextn blocks), else
    they are skipped; a checkpoint without them raises :class:`WeightsError`."""
    jdtype = resolve_dtype(dtype)
    path = resolve_model_path(path_or_preset)
    if is_gguf(path):
        return _load_gguf(path, jdtype, mtp=mtp)
    cfg = read_config(path)
    if has_orbax(path):
        if mtp:
            raise WeightsError(f"{path}: MTP layers load from the safetensors or GGUF checkpoint, not from orbax")
        graphdef, state = load_orbax_state(path, cfg, jdtype)
    else:
        if mtp:
            from radixflow_jax.models.safetensors_io import SafetensorsDir

            cfg = _with_mtp(cfg, mtp_layer_count(SafetensorsDir(path)), path)
        graphdef, state = load_safetensors_state(path, cfg, jdtype)
    return LoadedModel(path, cfg, graphdef, state, jdtype)


def _with_mtp(cfg: ModelConfig, layers: int, path: str) -> ModelConfig:
    """``cfg`` with the checkpoint's ``layers`` MTP layers; raises where it has none."""
    if layers == 0:
        raise WeightsError(f"{path}: the checkpoint has no MTP layers (no mtp.layers.* / nextn tensors)")
    mtp_layer_config(cfg)  # raises ConfigError for a family without MTP layers
    return dataclasses.replace(cfg, mtp_layers=layers)


def _load_gguf(path: str, dtype: jnp.dtype, *, mtp: bool) -> LoadedModel:
    from radixflow_jax.models import gguf

    f = gguf.GgufFile(path)
    raw = gguf.hf_config_dict(f)
    cfg = parse_hf_config(raw)
    if mtp:
        cfg = _with_mtp(cfg, int(raw.get("mtp_num_hidden_layers") or 0), path)
    graphdef, state = gguf.load_state(f, cfg, dtype)
    return LoadedModel(path, cfg, graphdef, state, dtype, tokenizer=gguf.build_tokenizer(f))


__all__ = ["load", "LoadedModel", "SequenceState", "ConfigError", "WeightsError", "read_config", "resolve_model_path"]


def greedy_generate(model: LoadedModel, prompt_ids: Sequence[int], max_tokens: int) -> tuple[list[int], str]:
    """Greedy decoding through the incremental path; returns ``(token ids, finish reason)``.

    Stops at any of the model's EOS ids (config and tokenizer) or after ``max_tokens`` tokens."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    eos = set(model.config.eos_token_ids) | set(model.tokenizer.eos_token_ids if model.tokenizer else ())
    seq = model.new_sequence(len(prompt_ids) + max_tokens)
    logits = model.extend(seq, prompt_ids)[-1]
    out: list[int] = []
    while True:
        token = int(np.argmax(logits))
        out.append(token)
        if token in eos:
            return out, "stop"
        if len(out) >= max_tokens:
            return out, "length"
        logits = model.decode(seq, token)


def convert(src: str, out_dir: str, dtype: str = "float32") -> str:
    """Writes ``out_dir`` (config, tokenizer files, orbax parameters) that :func:`load` reads faster."""
    import shutil

    from radixflow_jax.models.weights import save_orbax, write_marker

    model = load(src, dtype=dtype)
    os.makedirs(out_dir, exist_ok=True)
    if is_gguf(model.model_dir):  # config and tokenizer come from the GGUF metadata
        from radixflow_jax.models import gguf

        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(gguf.hf_config_dict(gguf.GgufFile(model.model_dir)), f, indent=2)
        if model.tokenizer is not None:
            model.tokenizer.save(out_dir)
    else:
        names = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
        for name in names:
            path = os.path.join(model.model_dir, name)
            if os.path.exists(path):
                shutil.copy(path, os.path.join(out_dir, name))
    save_orbax(model.module, out_dir)
    write_marker(out_dir, {"format": "orbax", "dtype": str(jnp.dtype(model.dtype)), "source": os.path.abspath(model.model_dir)})
    return out_dir
