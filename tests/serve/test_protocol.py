"""``serve.protocol``: body validation and translation to engine input, without a server or a model
(a stand-in tokenizer). The HTTP tests cover the same paths end to end."""

from __future__ import annotations

import subprocess
import sys

import pytest

from radixflow_jax.serve import protocol as p


class FakeTokenizer:
    def encode(self, text: str) -> list[int]:
        return [ord(c) % 200 + 1 for c in text]

    def apply_chat_template(self, messages, add_generation_prompt=True) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt else "")


def convert(raw, kind=None, **kw):
    kind = kind or (p.COMPLETIONS if "prompt" in raw else p.CHAT)
    return p.to_engine_request(p.parse_body(kind, raw), FakeTokenizer(), max_model_len=kw.get("max_model_len", 256), vocab_size=300)


def test_import_needs_no_server_or_jax():
    code = "import sys, radixflow_jax.serve.protocol; print(sorted(m for m in ('jax', 'fastapi', 'uvicorn') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_completion_text_and_ids():
    req = convert({"prompt": "abc", "max_tokens": 5, "temperature": 0, "stop": "x", "seed": 3, "unknown_extra": 1})
    assert req.prompt_ids == FakeTokenizer().encode("abc")
    assert (req.params.max_tokens, req.params.temperature, req.params.stop, req.params.seed) == (5, 0.0, ("x",), 3)
    req = convert({"prompt": [5, 6, 7], "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True})
    assert req.prompt_ids == [5, 6, 7] and req.stream and req.include_usage and req.params.ignore_eos
    assert req.params.max_tokens == 16 and req.params.temperature == 1.0  # OpenAI defaults
    assert convert({"prompt": [[1, 2]]}).prompt_ids == [1, 2]


def test_chat_renders_template_and_fills_context():
    req = convert({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    text = "<system>s<user>hi<assistant>"
    assert req.prompt_ids == FakeTokenizer().encode(text)
    assert req.params.max_tokens == 256 - len(text)
    assert convert({"messages": [{"role": "user", "content": "q"}], "max_completion_tokens": 4}).params.max_tokens == 4


@pytest.mark.parametrize(
    "raw, param, fragment",
    [
        ({"prompt": "a", "n": 17}, "n", "between 1 and 16"),
        ({"prompt": "a", "n": 0}, "n", "between 1 and 16"),
        ({"prompt": "a", "n": 3, "best_of": 2}, "best_of", "between n (3) and 16"),
        ({"prompt": "a", "best_of": 17}, "best_of", "between n (1) and 16"),
        ({"prompt": "a", "best_of": 2, "stream": True}, "best_of", "stream=true"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 20}, "n", "--max-n"),
        ({"prompt": "a", "suffix": "z"}, "suffix", "no fill-in-the-middle"),
        ({"prompt": "a", "logit_bias": {"x": 2.0}}, "logit_bias", "not a token id"),
        ({"prompt": "a", "logit_bias": {"300": 2.0}}, "logit_bias", "outside the vocabulary [0, 300)"),
        ({"prompt": "a", "logit_bias": {"-1": 2.0}}, "logit_bias", "outside the vocabulary"),
        ({"prompt": "a", "logit_bias": {"5": 150}}, "logit_bias", "[-100, 100]"),
        ({"prompt": "a", "min_tokens": 20, "max_tokens": 5}, "min_tokens", "min_tokens"),
        ({"prompt": ["a", "b"]}, "prompt", "several prompts"),
        ({"prompt": ""}, "prompt", "empty"),
        ({"prompt": []}, "prompt", "empty"),
        ({"prompt": [1, 999]}, "prompt", "outside the vocabulary"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens", "at least 1"),
        ({"prompt": "a", "max_tokens": 1000}, "max_tokens", "maximum context length"),
        ({"prompt": "a", "temperature": -1}, "temperature", "temperature"),
        ({"prompt": "a", "top_p": 0}, "top_p", "top_p"),
        ({"prompt": "a", "stream_options": {"include_usage": True}}, "stream_options", "stream is true"),
        ({"prompt": "a", "temperature": "hot"}, "temperature", "valid number"),
        ({"prompt": 5}, "prompt", "prompt"),
        ({}, "prompt", "Field required"),
        ({"messages": []}, "messages", "at least 1"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", "role"),
        ({"messages": [{"role": "user"}]}, "messages.0.content", "needs content"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools.0.function", "function"),
        ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}, "response_format", "yaml"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs", "logprobs"),
    ],
)
def test_bad_bodies_name_the_field(raw, param, fragment):
    kind = p.CHAT if "messages" in raw else p.COMPLETIONS
    with pytest.raises(p.ProtocolError) as info:
        convert(raw, kind)
    assert info.value.param == param and info.value.status == 400
    assert fragment in info.value.message


def test_non_object_body():
    with pytest.raises(p.ProtocolError, match="JSON object"):
        p.parse_body(p.COMPLETIONS, [1, 2])


def test_samples_bias_min_tokens_and_echo_reach_the_params():
    req = convert({"prompt": "ab", "n": 3, "best_of": 5, "seed": 7, "logit_bias": {"5": 100, " 7": -100.0},
                   "min_tokens": 2, "max_tokens": 4})  # fmt: skip
    params = req.params
    assert (params.n, params.best_of, params.seed, params.min_tokens) == (3, 5, 7, 2)
    assert params.logit_bias == ((5, 100.0), (7, -100.0)) and not req.echo
    echo = convert({"prompt": "ab", "echo": True, "logprobs": 2})
    assert echo.echo and echo.prompt_text == "ab" and echo.params.prompt_logprobs == 2 and not echo.score_only
    scored = convert({"prompt": ["ab"], "echo": True, "max_tokens": 0, "logprobs": 0})
    assert scored.score_only and scored.params.max_tokens == 1 and scored.prompt_text == "ab"
    assert convert({"prompt": "ab", "echo": True}).params.prompt_logprobs is None  # echo alone: text only
    assert convert({"prompt": "a", "n": 2, "stream": True}).params.n == 2  # n streams; best_of does not
    wide = p.to_engine_request(p.parse_body(p.COMPLETIONS, {"prompt": "a", "n": 20}), FakeTokenizer(), max_n=32)
    assert wide.params.n == 20


@pytest.mark.parametrize(
    "raw,param",
    [
        ({"prompt": "a", "stop": ["x"] * 17}, "stop"),
        ({"prompt": "a", "stop": "y" * 257}, "stop"),
        ({"prompt": "a", "stop_token_ids": [1] * 129}, "stop_token_ids"),
        ({"prompt": "a", "guided_choice": ["c"] * 257}, "guided_choice"),
        ({"prompt": "a", "guided_choice": ["c" * 1025]}, "guided_choice"),
        ({"prompt": "a", "structured_outputs": {"choice": ["c"] * 257}}, "structured_outputs"),
        ({"prompt": "a", "guided_regex": "a" * 65537}, "guided_regex"),
        ({"prompt": "a", "guided_grammar": "a" * 65537}, "guided_grammar"),
        ({"prompt": "a", "guided_json": {"enum": ["v" * 70000]}}, "guided_json"),
        ({"messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, "tools"),
    ],
)
def test_caps_answer_400_naming_the_field(raw, param):
    with pytest.raises(p.ProtocolError) as err:
        convert(raw)
    assert err.value.param == param and err.value.code == "too_large" and err.value.status == 400


def test_caps_allow_what_they_state():
    req = convert({"prompt": "a", "stop": ["x" * 256] * 16, "stop_token_ids": [1] * 128})
    assert len(req.params.stop) == 16


def test_json_depth_and_decode_caps():
    from radixflow_jax.serve.caps import DEFAULT_CAPS, json_depth
    from radixflow_jax.serve.errors import ApiError
    from radixflow_jax.serve.prepare import decode_json

    assert json_depth(1) == 0 and json_depth([]) == 1 and json_depth({"a": [[1]]}) == 3
    assert json_depth([[[]]] * 3) == 3
    assert decode_json(b'{"a": ' + b"[" * 60 + b"]" * 60 + b"}", DEFAULT_CAPS)["a"]
    for raw in (b'{"a": ' + b"[" * 64 + b"]" * 64 + b"}", b"[" * 100_000):
        with pytest.raises(ApiError) as err:
            decode_json(raw, DEFAULT_CAPS)
        assert err.value.status == 400 and err.value.code == "too_deep"


def test_exposure_warning_and_server_options(capsys):
    import argparse

    from radixflow_jax.serve.server import add_arguments, server_config, warn_if_exposed

    warn_if_exposed("127.0.0.1", None)
    warn_if_exposed("0.0.0.0", "key")
    assert capsys.readouterr().err == ""
    warn_if_exposed("0.0.0.0", None)
    assert "without --api-key" in capsys.readouterr().err
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = server_config(parser.parse_args(["--api-key", ""]), "m")
    assert cfg.max_waiting == 1024 and cfg.stream_timeout_s == 60 and not cfg.allow_cache_reset
    assert not cfg.private_cache_stats and cfg.api_key is None
    with pytest.raises(ValueError, match="needs --api-key"):
        server_config(parser.parse_args(["--api-key", "", "--private-cache-stats"]), "m")
    args = parser.parse_args(["--api-key", "k", "--stream-timeout", "0", "--enable-reset-prefix-cache"])
    off = server_config(args, "m")
    assert off.stream_timeout_s is None and off.allow_cache_reset


def test_speculative_flags_become_the_engine_option() -> None:
    import argparse

    from radixflow_jax.serve.server import add_arguments, speculative_option

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert speculative_option(parser.parse_args([])) is None
    assert speculative_option(parser.parse_args(["--speculative", "ngram", "--num-draft", "3"])) == {
        "method": "ngram", "num_draft": 3,
    }  # fmt: skip
    args = parser.parse_args(["--speculative", "draft", "--draft-model", "tiny-qwen3"])
    assert speculative_option(args) == {"method": "draft", "num_draft": None, "draft_model": "tiny-qwen3"}
    mtp = speculative_option(parser.parse_args(["--speculative", "mtp"]))
    assert mtp == {"method": "mtp", "num_draft": None}  # SpeculativeConfig makes it 1 (4 for the others)
    with pytest.raises(SystemExit, match="--draft-model needs --speculative draft"):
        speculative_option(parser.parse_args(["--draft-model", "tiny-qwen3"]))
