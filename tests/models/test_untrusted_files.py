"""Model files are untrusted input: a chat template renders in jinja2's immutable sandbox (a
template that reaches for ``os`` gets a typed error and runs nothing, in the tokenizer and through
the server); a safetensors index cannot name a shard outside the model directory; a truncated
safetensors or GGUF data section is a ``WeightsError``, never zeros. No model is built (the server
runs on the simulated executor), so the module costs no compile."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from fastapi.testclient import TestClient

from radixflow_jax.models.gguf.reader import GgufFile
from radixflow_jax.models.presets import materialize
from radixflow_jax.models.safetensors_io import INDEX_FILE, SafetensorsDir, WeightsError, save_file
from radixflow_jax.models.tokenizer import CHAT_TEMPLATE_FILE, ChatTemplateError, Tokenizer

QUESTION = [{"role": "user", "content": "Hi"}]
# Ways out of a template into Python that a plain jinja2.Environment allows; each would create MARKER.
ESCAPES = [
    "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ joiner.__init__.__globals__['os'].popen('touch MARKER').read() }}",
    "{{ lipsum.__globals__['os'].system('touch MARKER') }}",
    "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'Popen' %}"
    "{{ c(['touch', 'MARKER']) }}{% endif %}{% endfor %}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('touch MARKER') }}",
]


def _model_copy(tmp_path, template: str | None = None, *, in_config: bool = False) -> str:
    """A copy of the tiny-qwen3.5 preset's tokenizer files, its chat template replaced by ``template``."""
    src = materialize("tiny-qwen3.5")
    directory = tmp_path / "model"
    directory.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, name), directory / name)
    if template is not None and in_config:
        cfg = json.loads((directory / "tokenizer_config.json").read_text())
        cfg["chat_template"] = template
        (directory / "tokenizer_config.json").write_text(json.dumps(cfg))
    elif template is not None:
        (directory / CHAT_TEMPLATE_FILE).write_text(template)
    return str(directory)


@pytest.mark.parametrize("escape", range(len(ESCAPES)))
@pytest.mark.parametrize("in_config", [False, True], ids=["jinja_file", "tokenizer_config"])
def test_a_template_that_reaches_for_os_fails_and_runs_nothing(tmp_path, escape: int, in_config: bool) -> None:
    marker = tmp_path / "ran"
    template = ESCAPES[escape].replace("MARKER", str(marker))
    tok = Tokenizer.from_directory(_model_copy(tmp_path, template, in_config=in_config))
    assert tok.chat_template == template
    with pytest.raises(ChatTemplateError, match="chat template") as info:
        tok.apply_chat_template(QUESTION)
    assert not marker.exists()
    assert isinstance(info.value, ValueError)  # a TokenizerError: the server's 400, a batch line's error record
    assert info.value.unsafe or "undefined" in str(info.value)  # refused by the sandbox, or no such name at all


def test_the_preset_template_renders_as_before_and_compiles_once(tmp_path) -> None:
    tok = Tokenizer.from_directory(_model_copy(tmp_path))
    first = tok.apply_chat_template(QUESTION)
    assert first == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    compiled = tok._compiled
    assert tok.apply_chat_template(QUESTION + [{"role": "assistant", "content": "Yo"}], add_generation_prompt=False)
    assert tok._compiled is compiled  # the same compiled template serves every request
    tok.chat_template = "{{ messages[0]['content'] }}!"
    assert tok.apply_chat_template(QUESTION) == "Hi!" and tok._compiled is not compiled


@pytest.mark.parametrize(
    "template, message",
    [
        ("{{ raise_exception('only user turns') }}", "chat template: only user turns"),
        ("{{ 1 + messages }}", "TypeError"),
        ("{{ messages[0]['content'] | int // 0 }}", "ZeroDivisionError"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
        ("{% for %}", "does not compile"),
        ("{{ nothing_named_so }}", "undefined"),
        ("{{ messages.append(messages[0]) }}", "refused by the sandbox"),
        ("{% for i in range(10 ** 9) %}{% endfor %}", "range"),
    ],
)
def test_every_template_failure_is_a_chat_template_error(template: str, message: str) -> None:
    tok = Tokenizer(None, chat_template=template)
    for _ in range(2):  # a template that does not compile is refused again, from the kept error
        with pytest.raises(ChatTemplateError, match=message):
            tok.apply_chat_template([{"role": "user", "content": "7"}])


def test_the_server_answers_a_hostile_template_with_a_400_and_stays_up(tmp_path) -> None:
    from radixflow_jax.engine.config import EngineConfig
    from radixflow_jax.replicas.background import BackgroundEngine
    from radixflow_jax.serve.app import ServerConfig, ServerState, create_app
    from radixflow_jax.serve.metrics import ServerMetrics
    from radixflow_jax.sim.engines import build_sim_engine
    from radixflow_jax.sim.specs import get_device_spec, get_model_spec

    marker = tmp_path / "ran"
    tok = Tokenizer.from_directory(_model_copy(tmp_path, ESCAPES[0].replace("MARKER", str(marker))))
    ec = EngineConfig.from_options(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512)
    core = build_sim_engine(get_model_spec("qwen3.5-4b"), get_device_spec("h200"), ec)
    metrics = ServerMetrics("sim", hybrid=True)
    engine = BackgroundEngine(core, observer=metrics.observe, trim_records=True)
    metrics.attach(engine)
    state = ServerState(
        engine=engine,
        tokenizer=tok,
        metrics=metrics,
        config=ServerConfig("sim"),
        max_model_len=512,
        vocab_size=None,
    )
    try:
        with TestClient(create_app(state)) as c:
            for _ in range(3):
                r = c.post("/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 2})
                assert r.status_code == 400, r.text
                error = r.json()["error"]
                assert error["param"] == "messages" and "chat template refused by the sandbox" in error["message"]
            assert not marker.exists()
            ok = c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2, "ignore_eos": True})
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
            assert c.get("/health").status_code == 200
    finally:
        engine.shutdown()


# ------------------------------------------------------------------------------------- safetensors
def _tensors() -> dict[str, np.ndarray]:
    return {"a.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "b.weight": np.ones((5,), np.float32)}


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/../../outside.safetensors", ""])
def test_an_index_cannot_name_a_shard_outside_the_model_directory(tmp_path, shard: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    save_file(_tensors(), str(tmp_path / "outside.safetensors"))
    (model / INDEX_FILE).write_text(json.dumps({"weight_map": {"a.weight": shard, "b.weight": shard}}))
    with pytest.raises(WeightsError, match="leaves the model directory"):
        SafetensorsDir(str(model))


def test_shards_inside_the_directory_still_load(tmp_path) -> None:
    model = tmp_path / "model"
    (model / "shards").mkdir(parents=True)
    tensors = _tensors()
    save_file({"a.weight": tensors["a.weight"]}, str(model / "model-1.safetensors"))
    save_file({"b.weight": tensors["b.weight"]}, str(model / "shards" / "model-2.safetensors"))
    index = {"a.weight": "model-1.safetensors", "b.weight": "shards/model-2.safetensors"}
    (model / INDEX_FILE).write_text(json.dumps({"weight_map": index}))
    loaded = SafetensorsDir(str(model))
    for key, value in tensors.items():
        np.testing.assert_array_equal(loaded[key], value)
    (model / INDEX_FILE).write_text(json.dumps({"weight_map": ["model-1.safetensors"]}))
    with pytest.raises(WeightsError, match="weight_map must map"):
        SafetensorsDir(str(model))


def _header_end(path: str) -> int:
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


@pytest.mark.parametrize("keep", ["header_only", "half_data", "one_byte_short"])
def test_a_truncated_safetensors_file_is_refused_not_zeros(tmp_path, keep: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    path = str(model / "model.safetensors")
    save_file(_tensors(), path)
    size, data_start = os.path.getsize(path), _header_end(path)
    cut = {"header_only": data_start, "half_data": (size + data_start) // 2, "one_byte_short": size - 1}[keep]
    os.truncate(path, cut)
    with pytest.raises(WeightsError, match="model.safetensors: tensor '.*' needs bytes .*truncated"):
        SafetensorsDir(str(model))


def test_a_header_whose_offsets_disagree_with_the_shape_is_refused(tmp_path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    path = str(model / "model.safetensors")
    save_file(_tensors(), path)
    data = open(path, "rb").read()
    header = json.loads(data[8 : _header_end(path)])
    header["b.weight"]["shape"] = [6]  # 24 bytes, the offsets span 20
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + data[_header_end(path) :])
    with pytest.raises(WeightsError, match="tensor 'b.weight' spans bytes"):
        SafetensorsDir(str(model))


# -------------------------------------------------------------------------------------------- GGUF
def _gguf(path: str) -> str:
    import gguf

    writer = gguf.GGUFWriter(path, "qwen3")
    writer.add_tensor("a.weight", np.arange(64 * 32, dtype=np.float32).reshape(64, 32))
    writer.add_tensor("b.weight", np.ones((32,), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_truncated_gguf_file_is_refused_not_zeros(tmp_path) -> None:
    path = _gguf(str(tmp_path / "t.gguf"))
    f = GgufFile(path)
    np.testing.assert_array_equal(f.read("b.weight"), np.ones((32,), np.float32))
    data_start = min(t.data_offset for t in f.tensors.values())
    size = os.path.getsize(path)
    for cut in (data_start, data_start + 100, size - 4):  # no data section, one tensor torn, the last short
        short = str(tmp_path / f"cut{cut}.gguf")
        shutil.copy(path, short)
        os.truncate(short, cut)
        with pytest.raises(WeightsError, match=f"cut{cut}.gguf: .*truncated"):
            GgufFile(short)
