"""Per-token metadata of a packed variable-length token batch.

A round packs the token spans of ``R`` rows back to back into ``T`` token slots: row ``r`` owns
packed tokens ``cu_seqlens[r] : cu_seqlens[r + 1]`` (zero-length rows allowed); tokens at or after
``cu_seqlens[R]`` are padding. ``kv_lens[r]`` is the row's total context length *including* its
span, so the span covers absolute positions ``kv_lens[r] - span_len[r] : kv_lens[r]``.

Invariants:
  * ``row_of_token[t] == R`` exactly for padding tokens; otherwise ``cu[row] <= t < cu[row + 1]``.
  * Padding tokens get position 0 and ``valid == False``.
  * Every function is traceable and its output shapes depend only on static shapes.
"""

from __future__ import annotations

import jax.numpy as jnp


def row_of_token(cu_seqlens: jnp.ndarray, num_tokens: int) -> jnp.ndarray:
    """Owning row of each packed token ``[T]`` int32; ``R`` for padding tokens."""
    cu = jnp.asarray(cu_seqlens, jnp.int32)
    tokens = jnp.arange(num_tokens, dtype=jnp.int32)
    return jnp.searchsorted(cu[1:], tokens, side="right").astype(jnp.int32)


def positions_from_batch(
    cu_seqlens: jnp.ndarray, kv_lens: jnp.ndarray, num_tokens: int
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Returns ``(row_of_token [T], positions [T], valid [T])`` of a packed batch.

    ``positions[t] = kv_lens[r] - (cu[r + 1] - cu[r]) + (t - cu[r])`` for token ``t`` of row ``r``
    (the absolute position used for RoPE and the causal mask); 0 for padding tokens.
    """
    cu = jnp.asarray(cu_seqlens, jnp.int32)
    num_rows = cu.shape[0] - 1
    row = row_of_token(cu, num_tokens)
    valid = row < num_rows
    safe = jnp.minimum(row, num_rows - 1)
    span_len = cu[safe + 1] - cu[safe]
    offset = jnp.arange(num_tokens, dtype=jnp.int32) - cu[safe]
    pos = jnp.asarray(kv_lens, jnp.int32)[safe] - span_len + offset
    return row, jnp.where(valid, pos, 0).astype(jnp.int32), valid
