"""``POST /tokenize``, ``/detokenize`` and ``/reset_prefix_cache`` (vLLM's names and bodies).

Invariants:
  * ``/tokenize`` of ``messages`` gives the ids a chat completion of them would prompt with (the
    chat template applied); of ``prompt``, the plain encoding.
  * ``/detokenize`` refuses ids outside the vocabulary instead of decoding garbage.
  * ``/reset_prefix_cache`` flushes every replica's cache on its engine thread; the pool counts in
    the answer are sums over the replicas. It is an operator's tool (a flush slows every tenant):
    403 ``forbidden`` unless the server allows it (``--enable-reset-prefix-cache``).
  * Tokenising and template rendering run on the preparation pool (``serve/prepare.py``).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable

from fastapi import Request

from radixflow_jax.replicas.background import EngineDeadError
from radixflow_jax.serve import protocol
from radixflow_jax.serve.checks import check_alive, decode_object, need_tokenizer, read_body
from radixflow_jax.serve.errors import ApiError, engine_error
from radixflow_jax.serve.state import RouteGroup


def flush_cache(core: Any) -> dict[str, int]:
    """Empties one engine's prefix cache (engine thread) and reports its pools' free and total."""
    mem = core.scheduler.memory
    mem.flush()
    slots = mem.slots
    return {
        "kv_pages_free": mem.pages.num_free,
        "kv_pages_total": mem.pages.capacity,
        "state_slots_free": slots.num_free if slots else 0,
        "state_slots_total": slots.capacity if slots else 0,
    }


class AdminRoutes(RouteGroup):
    """The tokenizer and cache routes over one server's state."""

    def routes(self) -> list[tuple[str, Callable[..., Any], str]]:
        return [
            ("/tokenize", self.tokenize, "POST"),
            ("/detokenize", self.detokenize, "POST"),
            ("/reset_prefix_cache", self.reset_prefix_cache, "POST"),
        ]

    async def tokenize(self, request: Request) -> dict[str, Any]:
        body = await read_body(request, self.state.config)
        return await self.state.preparer.run(functools.partial(self._tokenize, body))

    async def detokenize(self, request: Request) -> dict[str, Any]:
        body = await read_body(request, self.state.config)
        return await self.state.preparer.run(functools.partial(self._detokenize, body))

    def _tokenize(self, body: bytes) -> dict[str, Any]:
        state = self.state
        raw = decode_object(body, state.config)
        if "messages" in raw:
            chat = protocol.parse_body(protocol.CHAT, {"messages": raw["messages"]})
            tok = need_tokenizer(state, "messages")
            ids = protocol.to_engine_request(chat, tok, caps=state.config.caps).prompt_ids
        elif isinstance(raw.get("prompt"), str):
            ids = need_tokenizer(state, "prompt").encode(raw["prompt"])
        else:
            raise ApiError(400, "prompt: expected a string (or send messages)", param="prompt")
        return {"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len}

    def _detokenize(self, body: bytes) -> dict[str, Any]:
        tokens = decode_object(body, self.state.config).get("tokens")
        if not isinstance(tokens, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in tokens):
            raise ApiError(400, "tokens: expected a list of integers", param="tokens")
        vocab = self.state.vocab_size
        bad = next((t for t in tokens if vocab is not None and not 0 <= t < vocab), None)
        if bad is not None:
            raise ApiError(400, f"tokens: token id {bad} is outside the vocabulary [0, {vocab})", param="tokens")
        return {"prompt": need_tokenizer(self.state, "tokens").decode(tokens)}

    async def reset_prefix_cache(self) -> dict[str, Any]:
        if not self.state.config.allow_cache_reset:
            raise ApiError(
                403, "resetting the prefix cache is disabled on this server (--enable-reset-prefix-cache)",
                code="forbidden",
            )
        check_alive(self.state)
        try:  # every replica's cache; the pool counts are summed over them
            each = [await asyncio.wrap_future(r.call(flush_cache)) for r in self.state.replicas]
        except EngineDeadError as exc:
            raise engine_error(exc) from None
        return {"status": "ok", **{k: sum(p[k] for p in each) for k in each[0]}}
