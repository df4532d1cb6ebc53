"""Text <-> token ids from a HF ``tokenizer.json`` (the ``tokenizers`` package) plus the chat template
in ``tokenizer_config.json`` (rendered with jinja2). No ``transformers`` import at serving time."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"


class TokenizerError(ValueError):
    """Text was given where no tokenizer exists, or a chat template is missing or failed."""


class Tokenizer:
    """A loaded tokenizer; ``eos_token_ids`` are the ids that end generation besides the model's."""

    def __init__(self, directory: str):
        from tokenizers import Tokenizer as HfTokenizer

        self._tok = HfTokenizer.from_file(os.path.join(directory, TOKENIZER_FILE))
        cfg_path = os.path.join(directory, TOKENIZER_CONFIG)
        cfg: dict[str, Any] = {}
        if os.path.exists(cfg_path):
            with open(cfg_path) as f:
                cfg = json.load(f)
        self.chat_template: str | None = cfg.get("chat_template")
        self.bos_token: str | None = _token_text(cfg.get("bos_token"))
        self.eos_token: str | None = _token_text(cfg.get("eos_token"))
        eos_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.eos_token_ids: tuple[int, ...] = (eos_id,) if eos_id is not None else ()

    @staticmethod
    def exists(directory: str) -> bool:
        return os.path.exists(os.path.join(directory, TOKENIZER_FILE))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise TokenizerError("this model's tokenizer_config.json has no chat_template")
        import jinja2

        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
        try:
            return env.from_string(self.chat_template).render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except jinja2.TemplateError as exc:
            raise TokenizerError(f"chat template failed: {exc}") from exc


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value
