"""GGUF at tensor level and bad input; no model is run, so this needs no compile.

* Dequantisation goes through ``gguf``'s own code: F16/BF16/Q4_0/Q4_1/Q8_0 written by ``gguf``'s
  quantisers read back as ``gguf.quants.dequantize`` gives, and close to the source; K-quant blocks
  (Q4_K, Q5_K, Q6_K: what ``Q4_K_M`` files hold; ``gguf`` has no quantiser for them) read back as
  its dequantiser gives, in HF dimension order.
* The converter's layout changes are undone exactly (v-head regrouping, qkvz split, q/k permutation).
* Bad input (truncated file, unknown architecture, missing key or tensor, wrong shape, unknown
  tensor) raises ``ConfigError``/``WeightsError`` naming the GGUF key or tensor.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from radixflow_jax.models import api, gguf, presets
from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.gguf import qwen35, qwen3next
from radixflow_jax.models.hf_config import parse_hf_config
from radixflow_jax.models.safetensors_io import WeightsError
from radixflow_jax.models.tokenizer import TokenizerError

# type -> max |read - source| / max |source| for a N(0, 1) tensor
QUANTISED = {"F16": 1e-3, "BF16": 1e-2, "Q8_0": 1e-2, "Q4_0": 0.12, "Q4_1": 0.12}
K_BLOCKS = {"Q4_K": (144, (0, 2)), "Q5_K": (176, (0, 2)), "Q6_K": (210, (208,))}  # block bytes, f16 scale offsets


def _write(path: str, tensors: dict[str, tuple[np.ndarray, str]], arch: str = "qwen3", **meta) -> str:
    import gguf as gg

    writer = gg.GGUFWriter(path, arch)
    for key, (value, kind) in meta.items():
        getattr(writer, f"add_{kind}")(key, value)
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=getattr(gg.GGMLQuantizationType, qtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("qtype", sorted(QUANTISED))
def test_quantised_tensors_read_back_through_gguf(qtype, tmp_path) -> None:
    import gguf as gg

    source = np.random.default_rng(0).standard_normal((6, 256)).astype(np.float32)
    kind = getattr(gg.GGMLQuantizationType, qtype)
    data = gg.quants.quantize(source, kind)
    f = gguf.GgufFile(_write(str(tmp_path / "t.gguf"), {"w.weight": (data, qtype)}))
    got = f.read("w.weight")
    assert got.shape == source.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got, gg.quants.dequantize(data, kind))
    assert np.abs(got - source).max() <= QUANTISED[qtype] * np.abs(source).max()


@pytest.mark.parametrize("qtype", sorted(K_BLOCKS))
def test_k_quant_blocks_read_as_gguf_dequantises_them(qtype, tmp_path) -> None:
    import gguf as gg

    size, scales = K_BLOCKS[qtype]
    rows, blocks = 3, 2  # 3 rows of 512 values
    raw = np.random.default_rng(1).integers(0, 256, (rows, blocks, size), dtype=np.uint8)
    for off in scales:  # finite scales: small float16 values in place of random bits
        raw[..., off : off + 2] = np.full((rows, blocks), 0.01, np.float16).view(np.uint8).reshape(rows, blocks, 2)
    data = raw.reshape(rows, blocks * size)
    kind = getattr(gg.GGMLQuantizationType, qtype)
    f = gguf.GgufFile(_write(str(tmp_path / "k.gguf"), {"w.weight": (data, qtype)}))
    got = f.read("w.weight")
    assert got.shape == (rows, 512)
    np.testing.assert_array_equal(got, gg.quants.dequantize(data, kind))
    assert np.isfinite(got).all()


def test_layout_changes_invert_exactly() -> None:
    rng = np.random.default_rng(2)
    cfg = {"linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 4, "linear_value_head_dim": 3}
    qkv = rng.standard_normal((2 * 2 * 4 + 6 * 3, 5)).astype(np.float32)
    key = "model.layers.1.linear_attn.in_proj_qkv.weight"
    ((name, stored),) = qwen35.to_gguf(key, qkv, cfg)
    assert name == "blk.1.attn_qkv.weight" and not np.array_equal(stored, qkv)
    np.testing.assert_array_equal(stored[:16], qkv[:16])  # q and k rows keep their order
    np.testing.assert_array_equal(qwen35.from_gguf(key, {name: stored}, cfg), qkv)
    out = rng.standard_normal((5, 18)).astype(np.float32)
    key = "model.layers.1.linear_attn.out_proj.weight"
    np.testing.assert_array_equal(qwen35.from_gguf(key, dict(qwen35.to_gguf(key, out, cfg)), cfg), out)
    qkvz = rng.standard_normal((2 * (4 + 4 + 9 + 9), 5)).astype(np.float32)
    key = "model.layers.0.linear_attn.in_proj_qkvz.weight"
    parts = dict(qwen3next.to_gguf(key, qkvz, cfg))
    assert sorted(parts) == ["blk.0.attn_gate.weight", "blk.0.attn_qkv.weight"]
    np.testing.assert_array_equal(parts["blk.0.attn_qkv.weight"][:4], qkvz[:4])  # head 0's q
    np.testing.assert_array_equal(parts["blk.0.attn_qkv.weight"][4:8], qkvz[26:30])  # head 1's q
    np.testing.assert_array_equal(qwen3next.from_gguf(key, parts, cfg), qkvz)
    weight = rng.standard_normal((4 * 8, 3)).astype(np.float32)
    np.testing.assert_array_equal(gguf.unpermute_qk(gguf.permute_qk(weight, 4), 4), weight)
    # llama-quantize drops the shared-expert gate's unit extent ([1, H] -> [H]); both forms read back as HF's [1, H]
    gate = rng.standard_normal((1, 5)).astype(np.float32)
    key = "model.layers.0.mlp.shared_expert_gate.weight"
    ((name, stored),) = qwen3next.to_gguf(key, gate, cfg)
    assert name == "blk.0.ffn_gate_inp_shexp.weight"
    for form in (stored, stored.reshape(-1)):
        np.testing.assert_array_equal(qwen3next.from_gguf(key, {name: form}, cfg), gate)


@pytest.fixture(scope="module")
def qwen3_file(tmp_path_factory) -> str:
    return gguf.write_gguf(presets.materialize("tiny-qwen3"), str(tmp_path_factory.mktemp("g") / "q3.gguf"), "q8_0")


def _rewrite(src: str, dst: str, drop: str = "", replace: dict[str, np.ndarray] | None = None, arch: str = "") -> str:
    """A copy of ``src`` without tensor ``drop``, with tensors replaced by float32 ``replace`` arrays,
    or under another ``general.architecture``."""
    import gguf as gg

    reader = gg.GGUFReader(src)
    old = reader.fields["general.architecture"].contents()
    writer = gg.GGUFWriter(dst, arch or old)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gg.GGUFValueType.ARRAY else None
        writer.add_key_value(
            name.replace(f"{old}.", f"{arch}.", 1) if arch else name, field.contents(), field.types[0], sub_type=sub
        )
    for t in reader.tensors:
        if t.name == drop:
            continue
        if replace and t.name in replace:
            writer.add_tensor(t.name, replace[t.name])
        else:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)  # quantised: [rows, bytes]
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_writer_keeps_norms_and_vectors_f32(qwen3_file) -> None:
    f = gguf.GgufFile(qwen3_file)
    kinds = {name: t.tensor_type.name for name, t in f.tensors.items()}
    assert kinds["blk.0.attn_norm.weight"] == kinds["blk.0.attn_q_norm.weight"] == "F32"
    assert kinds["blk.0.attn_q.weight"] == kinds["token_embd.weight"] == kinds["output.weight"] == "Q8_0"
    assert f.get("general.file_type") == 7 and f.arch == "qwen3"
    assert parse_hf_config(gguf.hf_config_dict(f)) == api.read_config(presets.materialize("tiny-qwen3"))


def test_truncated_file_is_a_weights_error(qwen3_file, tmp_path) -> None:
    path = str(tmp_path / "cut.gguf")
    with open(qwen3_file, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(os.path.getsize(qwen3_file) // 2))
    with pytest.raises(WeightsError, match="not a readable GGUF file"):
        gguf.GgufFile(path)


def test_unknown_architecture_and_missing_key_name_the_key(qwen3_file, tmp_path) -> None:
    path = _rewrite(qwen3_file, str(tmp_path / "a.gguf"), arch="mamba2")
    with pytest.raises(ConfigError, match="general.architecture='mamba2' is not supported; supported: llama, qwen3"):
        gguf.hf_config_dict(gguf.GgufFile(path))
    path = _write(str(tmp_path / "m.gguf"), {}, arch="qwen35", **{"qwen35.block_count": (2, "uint32")})
    with pytest.raises(ConfigError, match="'qwen35.attention.head_count' is missing"):
        gguf.hf_config_dict(gguf.GgufFile(path))


def test_missing_wrong_shape_and_unknown_tensors_name_the_tensor(qwen3_file, tmp_path) -> None:
    path = _rewrite(qwen3_file, str(tmp_path / "d.gguf"), drop="blk.1.attn_k.weight")
    with pytest.raises(WeightsError, match=r"GGUF tensor 'blk\.1\.attn_k\.weight'.*missing"):
        api.load(path)
    bad = {"blk.2.ffn_up.weight": np.zeros((128, 128), np.float32)}  # [I=256, H=128] expected
    path = _rewrite(qwen3_file, str(tmp_path / "s.gguf"), replace=bad)
    with pytest.raises(WeightsError, match=r"GGUF tensor 'blk\.2\.ffn_up\.weight'.*shape \(128, 128\)"):
        api.load(path)
    path = _write(
        str(tmp_path / "x.gguf"),
        {"blk.0.attn_foo.weight": (np.zeros((2, 32), np.float32), "F32")},
        **{"qwen3.block_count": (1, "uint32")},
    )
    with pytest.raises(WeightsError, match="GGUF tensor 'blk.0.attn_foo.weight' is not supported"):
        gguf.GgufTensors(gguf.GgufFile(path), cfg={})


def test_writer_refuses_a_family_it_does_not_map(tmp_path) -> None:
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"]}')
    out = str(tmp_path / "m.gguf")
    with pytest.raises(ConfigError, match=r"architectures=\['Mamba2ForCausalLM'\]: no GGUF writer"):
        gguf.write_gguf(str(src), out)
    assert not os.path.exists(out) and not os.path.exists(out + ".tmp")


def test_qwen_pre_tokenizers_split_digits_one_by_one_as_qwen_tokenizers_do(tmp_path) -> None:
    """A GGUF file whose ``tokenizer.ggml.pre`` is ``qwen2`` or ``qwen35`` (what llama.cpp's
    converter writes for Qwen models) tokenizes as the Qwen split: each digit alone, unlike gpt2."""
    from radixflow_jax.models import presets
    from radixflow_jax.models.gguf import write_gguf
    from radixflow_jax.models.gguf.reader import GgufFile
    from radixflow_jax.models.gguf.vocab import build_tokenizer

    path = write_gguf(presets.materialize("tiny-qwen3"), str(tmp_path / "m.gguf"), "f32")
    f = GgufFile(path)
    text = "year 2024: it's 12 apples"

    def pieces(tok) -> list[str]:
        return [p for p, _ in tok._tok.pre_tokenizer.pre_tokenize_str(text)]

    assert "Ġ2024" in pieces(build_tokenizer(f))  # gpt2: a space and a run of digits are one piece
    for pre in ("qwen2", "qwen35"):
        f.metadata["tokenizer.ggml.pre"] = pre
        tok = build_tokenizer(f)
        assert tok.decode(tok.encode(text)) == text
        assert pieces(tok)[:7] == ["year", "Ġ", "2", "0", "2", "4", ":"]
    f.metadata["tokenizer.ggml.pre"] = "llama-bpe"
    with pytest.raises(TokenizerError, match="llama-bpe.*qwen2, qwen35"):
        build_tokenizer(f)
