"""HF directory -> GGUF file, laid out as llama.cpp's ``convert_hf_to_gguf.py`` lays it out.

The config is parsed first by the loader's parser (``parse_hf_config``), so a directory is written
iff it loads, and the metadata is read from the parsed :class:`ModelConfig` (``Family.gguf_metadata``;
``config.json`` only for what it does not hold). Per family (``Family.gguf_metadata``,
``Family.to_gguf``): the same metadata keys and tensor names,
shapes and layout changes; here: the converter's per-tensor type rule. 1-D tensors, ``*_norm.weight``,
``ssm_conv1d``, MoE routers and tensors not named ``*.weight`` stay F32; every other tensor takes the
output type, and a tensor ``gguf.quants`` cannot quantise to it (a row not a multiple of the block)
falls back to F16, as the converter does.

Invariants: quantisation goes through ``gguf.quants``, the ``general.*`` model card through
``gguf.Metadata``; the source directory is only read; the output appears whole or not at all.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator, Mapping

import numpy as np

from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.gguf.family import ARR, F32, STR, U32, Family
from radixflow_jax.models.gguf.loader import FAMILIES
from radixflow_jax.models.gguf.nextn import MtpNames, with_nextn
from radixflow_jax.models.gguf.vocab import write_vocab
from radixflow_jax.models.hf_config import parse_hf_config
from radixflow_jax.models.mtp import mtp_layer_count

OUTTYPES = ("f32", "f16", "bf16", "q8_0")
_FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}  # llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_BF16
_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_ALWAYS_F32 = ("ssm_conv1d.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight")


def family_for(cfg: dict[str, Any]) -> Family:
    """The family whose converter class handles this HF config (by ``architectures``)."""
    archs = cfg.get("architectures") or []
    for fam in FAMILIES:
        if any(a in fam.hf_architectures for a in archs):
            return fam
    known = sorted({a for fam in FAMILIES for a in fam.hf_architectures})
    raise ConfigError(f"config.json: architectures={archs!r}: no GGUF writer for it (written: {', '.join(known)})")


def tensor_type(name: str, array: np.ndarray, outtype: str) -> Any:
    """The GGML type the converter gives GGUF tensor ``name`` for output type ``outtype``."""
    import gguf

    qt = gguf.GGMLQuantizationType
    if array.ndim <= 1 or name.endswith("_norm.weight") or name.endswith(_ALWAYS_F32) or not name.endswith(".weight"):
        return qt.F32
    return {"f32": qt.F32, "f16": qt.F16, "bf16": qt.BF16, "q8_0": qt.Q8_0}[outtype]


def _encode(array: np.ndarray, qtype: Any) -> tuple[np.ndarray, Any]:
    import gguf

    try:
        return gguf.quants.quantize(array, qtype), qtype
    except gguf.QuantError:  # the converter falls back to F16 for rows the block size does not divide
        qtype = gguf.GGMLQuantizationType.F16
        return gguf.quants.quantize(array, qtype), qtype


def _hf_tensors(tensors: Mapping[str, np.ndarray]) -> Iterator[tuple[str, np.ndarray]]:
    """The checkpoint's tensors as float32, in file order, with per-expert MoE weights
    (``mlp.experts.{e}.{gate,up,down}_proj.weight``) stacked into the fused HF forms
    ``mlp.experts.gate_up_proj`` ``[E, 2I, H]`` and ``mlp.experts.down_proj`` ``[E, H, I]``, emitted
    once a layer's experts are all read (what the converter stacks into ``ffn_*_exps``)."""
    pending: dict[str, dict[tuple[str, int], np.ndarray]] = {}
    counts: dict[str, int] = {}
    for key in tensors:
        m = _EXPERT.match(key)
        if m is None:
            yield key, np.asarray(tensors[key], dtype=np.float32)
            continue
        counts[m[1]] = max(counts.get(m[1], 0), int(m[2]) + 1)
        pending.setdefault(m[1], {})[(m[3], int(m[2]))] = np.asarray(tensors[key], dtype=np.float32)
    for base, parts in pending.items():
        n = counts[base]
        try:
            stack = {w: np.stack([parts[(w, e)] for e in range(n)]) for w in ("gate_proj", "up_proj", "down_proj")}
        except KeyError as exc:
            raise ConfigError(f"{base}: expert tensor {exc} is missing") from None
        yield f"{base}.gate_up_proj", np.concatenate([stack["gate_proj"], stack["up_proj"]], axis=1)
        yield f"{base}.down_proj", stack["down_proj"]


def _add_metadata(writer: Any, meta: list[tuple[str, Any, str]]) -> None:
    adders = {
        U32: writer.add_uint32,
        F32: writer.add_float32,
        STR: writer.add_string,
        ARR: writer.add_array,
        "bool": writer.add_bool,
    }
    for key, value, kind in meta:
        adders[kind](key, value)


def _add_model_card(writer: Any, model_dir: str) -> None:
    """``general.*`` name, basename, version and size label, by ``gguf.Metadata`` as the converter does."""
    import pathlib

    import gguf

    total, shared, expert, experts = writer.get_total_parameter_count()
    card = gguf.Metadata.load(None, pathlib.Path(model_dir), None, total)
    card.name = card.name or os.path.basename(os.path.normpath(model_dir))
    if card.size_label is None and total > 0:
        card.size_label = gguf.size_label(total, shared, expert, experts)
    writer.add_type(gguf.GGUFType.MODEL)
    card.set_gguf_meta_model(writer)


def write_gguf(model_dir: str, out_path: str, outtype: str = "f32") -> str:
    """Writes ``model_dir`` (``config.json``, safetensors, ``tokenizer.json``) to ``out_path``."""
    import gguf

    from radixflow_jax.models.safetensors_io import SafetensorsDir

    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r}: expected one of {', '.join(OUTTYPES)}")
    with open(os.path.join(model_dir, "config.json")) as fh:
        cfg = json.load(fh)
    fam = family_for(cfg)
    model = parse_hf_config(cfg)
    tmp = out_path + ".tmp"
    writer = gguf.GGUFWriter(tmp, fam.arch)
    try:
        tensors = SafetensorsDir(model_dir)
        mtp_layers = mtp_layer_count(tensors)  # written as llama.cpp's nextn blocks (models/gguf/nextn.py)
        mtp = MtpNames(model.num_layers, fam) if mtp_layers else None
        try:
            _add_metadata(writer, with_nextn(fam.gguf_metadata(model, cfg), fam.arch, mtp_layers))
        except KeyError as exc:
            raise ConfigError(f"{model_dir}/config.json: field {exc} is missing (needed for {fam.arch} GGUF metadata)")
        writer.add_file_type(_FILE_TYPES[outtype])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        write_vocab(writer, model_dir, int(cfg["vocab_size"]))
        for key, array in _hf_tensors(tensors):
            pairs = mtp.to_gguf(key, array, cfg) if mtp and key.startswith("mtp.") else fam.to_gguf(key, array, cfg)
            for name, array in pairs:
                data, qtype = _encode(np.ascontiguousarray(array, dtype=np.float32), tensor_type(name, array, outtype))
                writer.add_tensor(name, data, raw_dtype=qtype)
        _add_model_card(writer, model_dir)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return out_path
