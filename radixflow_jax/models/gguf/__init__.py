"""llama.cpp GGUF files: load one into our model and tokenizer, or write one from a HF directory.

* ``reader``: the file's metadata and tensors, dequantised through ``gguf.quants``.
* ``family`` and one module per family (``dense``: ``llama``, ``qwen3``; ``qwen35``; ``qwen3next``;
  ``granite``: ``granitehybrid``; ``bamba``; ``falcon_h1``; ``nemotron_h``): the metadata <->
  ``config.json`` map and the tensor-name map, with llama.cpp's converter layout changes undone.
* ``loader``: config dict (through the one parser, ``parse_hf_config``) and HF-named tensors.
* ``writer``: a HF directory laid out as ``convert_hf_to_gguf.py`` lays it out (``radixflow convert
  SRC OUT.gguf``). ``vocab``: the ``tokenizer.*`` keys both ways.

Invariants: a GGUF field we cannot map raises ``ConfigError`` naming the GGUF key; a tensor we cannot
map, a missing one or one with the wrong shape raises ``WeightsError`` naming the GGUF tensor.
"""

from __future__ import annotations

from radixflow_jax.models.gguf.dense import permute_qk, unpermute_qk
from radixflow_jax.models.gguf.loader import FAMILIES, GgufTensors, family_of, hf_config_dict, load_state
from radixflow_jax.models.gguf.reader import GGUF_SUFFIX, GgufFile, is_gguf
from radixflow_jax.models.gguf.vocab import build_tokenizer
from radixflow_jax.models.gguf.writer import OUTTYPES, write_gguf

__all__ = [
    "FAMILIES",
    "GGUF_SUFFIX",
    "GgufFile",
    "GgufTensors",
    "OUTTYPES",
    "build_tokenizer",
    "family_of",
    "hf_config_dict",
    "is_gguf",
    "load_state",
    "permute_qk",
    "unpermute_qk",
    "write_gguf",
]
