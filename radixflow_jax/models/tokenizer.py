"""Text <-> token ids (the ``tokenizers`` package) plus a chat template rendered with jinja2.

Sources: a HF directory (``tokenizer.json``; the template from ``chat_template.jinja``, which
transformers 5 writes, else from ``tokenizer_config.json``'s ``chat_template``; special tokens from
``tokenizer_config.json``) or a GGUF file's metadata (``models/gguf/``). No ``transformers`` import
at serving time.

Invariants: a chat template is untrusted input (it comes from model files). It renders in jinja2's
``ImmutableSandboxedEnvironment`` (as transformers does): no attribute starting with ``_``, no
method that mutates a list or dict, no ``range`` over 100,000 items, so a template reaches no module
and runs nothing but its own expressions. It is compiled once per text (the first render) and the
compiled form is reused for every request. Every failure of a template, a refused unsafe operation
included, comes out as :class:`ChatTemplateError` (a ``TokenizerError``, so a ``ValueError``): the
server answers it as a 400 on ``messages`` and a batch line as its error record.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"


class TokenizerError(ValueError):
    """Text was given where no tokenizer exists, or a chat template is missing or failed."""


class ChatTemplateError(TokenizerError):
    """The chat template does not compile, raised (``raise_exception``), failed while rendering, or
    tried an operation the sandbox refuses (``unsafe`` is then True; nothing of it ran)."""

    def __init__(self, message: str, *, unsafe: bool = False):
        super().__init__(message)
        self.unsafe = unsafe


def _raise_exception(message: str) -> None:
    """The ``raise_exception`` global that HF chat templates call to refuse their input."""
    raise ChatTemplateError(f"chat template: {message}")


class Tokenizer:
    """A loaded tokenizer; ``eos_token_ids`` are the ids that end generation besides the model's."""

    def __init__(
        self,
        backend: Any,
        *,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ):
        self._tok = backend
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        eos_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.eos_token_ids: tuple[int, ...] = (eos_id,) if eos_id is not None else ()
        # (template text, its compiled form or why it does not compile): compiled once per text
        self._compiled: tuple[str, Any] | None = None

    @classmethod
    def from_directory(cls, directory: str) -> Tokenizer:
        from tokenizers import Tokenizer as HfTokenizer

        backend = HfTokenizer.from_file(os.path.join(directory, TOKENIZER_FILE))
        cfg: dict[str, Any] = {}
        cfg_path = os.path.join(directory, TOKENIZER_CONFIG)
        if os.path.exists(cfg_path):
            with open(cfg_path) as f:
                try:
                    cfg = json.load(f)
                except json.JSONDecodeError as exc:
                    raise TokenizerError(f"{cfg_path} is not valid JSON ({exc})") from exc
        template = _template_from_config(cfg.get("chat_template"))
        jinja_path = os.path.join(directory, CHAT_TEMPLATE_FILE)
        if os.path.exists(jinja_path):  # transformers 5 saves the template here (it wins, as there)
            with open(jinja_path) as f:
                template = f.read()
        return cls(
            backend,
            chat_template=template,
            bos_token=_token_text(cfg.get("bos_token")),
            eos_token=_token_text(cfg.get("eos_token")),
        )

    @staticmethod
    def exists(directory: str) -> bool:
        return os.path.exists(os.path.join(directory, TOKENIZER_FILE))

    def save(self, directory: str) -> None:
        """Writes ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat template)."""
        self._tok.save(os.path.join(directory, TOKENIZER_FILE))
        cfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "chat_template": self.chat_template,
        }
        with open(os.path.join(directory, TOKENIZER_CONFIG), "w") as f:
            json.dump({k: v for k, v in cfg.items() if v is not None}, f, indent=2)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def backend_json(self) -> str:
        """The HF ``tokenizers`` backend serialised (``tokenizer.json``'s text), as grammar engines take it."""
        return self._tok.to_str()

    def token_id(self, text: str) -> int | None:
        """The id of the vocabulary entry spelled exactly ``text`` (a special token's name, say), or None."""
        return self._tok.token_to_id(text)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> str:
        """Renders ``messages`` with the chat template; ``tools`` (OpenAI tool objects) is passed
        as the template's ``tools`` variable, None when absent (as HF's ``apply_chat_template``)."""
        if not self.chat_template:
            raise TokenizerError(
                f"this model has no chat template (neither {CHAT_TEMPLATE_FILE} nor a chat_template in "
                f"{TOKENIZER_CONFIG})"
            )
        import jinja2
        from jinja2.sandbox import SecurityError

        template = self._compiled_template(self.chat_template)
        try:
            return template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except ChatTemplateError:
            raise
        except SecurityError as exc:
            raise ChatTemplateError(f"chat template refused by the sandbox: {exc}", unsafe=True) from None
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from None
        except Exception as exc:  # a template is untrusted: whatever it raises is the template's failure
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None

    def _compiled_template(self, text: str) -> Any:
        """``text`` compiled in the immutable sandbox, once (a compile error is kept and raised again)."""
        if self._compiled is None or self._compiled[0] != text:
            self._compiled = (text, _compile(text))
        compiled = self._compiled[1]
        if isinstance(compiled, str):
            raise ChatTemplateError(compiled)
        return compiled


def _compile(text: str) -> Any:
    """The template, or the message of the :class:`ChatTemplateError` saying why it does not compile."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(text)
    except Exception as exc:  # TemplateSyntaxError, or a RecursionError on absurd nesting
        return f"chat template does not compile: {type(exc).__name__}: {exc}"


def _template_from_config(value: Any) -> str | None:
    """``chat_template`` is a string, or a list of ``{"name", "template"}`` (the ``default`` one is used)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if "default" in named:
            return named["default"]
    raise TokenizerError(f"{TOKENIZER_CONFIG}: chat_template must be a string or a list with a 'default' entry")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value
