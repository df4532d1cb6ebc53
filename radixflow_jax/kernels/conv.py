"""Depthwise causal conv1d over packed variable-length batches: pure-jnp reference kernels.

Conventions and invariants:
  * Kernel width ``K``; ``weight`` is ``[C, K]`` (HF's ``[C, 1, K]`` conv weight squeezed) and
    tap ``i`` multiplies the input ``K - 1 - i`` steps back (tap ``K - 1`` is the current token).
  * A row's conv *state* is its last ``K - 1`` inputs, oldest first: ``[..., K - 1, C]``.
    The row's *extended* input is its state followed by its span's tokens, and
    ``y[t] = act(bias + sum_i weight[:, i] * xe[t - (K - 1) + i])``.
  * Packed batches follow :mod:`radixflow_jax.kernels.layout` (row ``r`` owns tokens
    ``cu_seqlens[r] : cu_seqlens[r + 1]``; tokens at or after ``cu_seqlens[R]`` are padding):
    padding tokens output 0 and never enter a state.
  * Math is float32; ``y`` has ``x``'s dtype; returned states have the given state's dtype.
  * ``final_state == conv_states_at(x, cu_seqlens, initial_state, arange(R), lens)``; a
    zero-length row keeps its initial state, and a row shorter than ``K - 1`` mixes old state
    and new inputs.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

Activation = Literal["silu"] | None


def _activate(y: jnp.ndarray, activation: Activation) -> jnp.ndarray:
    if activation is None:
        return y
    if activation == "silu":
        return jax.nn.silu(y)
    raise ValueError(f"unsupported activation {activation!r}")


def _token_rows(cu_seqlens: jnp.ndarray, num_tokens: int) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Per packed token: ``(row clamped to [0, R), position in the row's span, is-real-token)``."""
    cu = cu_seqlens.astype(jnp.int32)
    num_rows = cu.shape[0] - 1
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    row = jnp.minimum(jnp.searchsorted(cu[1:], t, side="right").astype(jnp.int32), num_rows - 1)
    return row, t - cu[row], t < cu[num_rows]


def _extended_at(
    x: jnp.ndarray, state: jnp.ndarray, cu: jnp.ndarray, row: jnp.ndarray, pos: jnp.ndarray
) -> jnp.ndarray:
    """Element ``pos`` (may be negative: ``-1`` is the newest state entry) of each row's extended
    input, float32, for broadcast-compatible int arrays ``row`` and ``pos``; returns ``[..., C]``."""
    width = state.shape[1]  # K - 1
    from_x = x[jnp.clip(cu[row] + pos, 0, x.shape[0] - 1)].astype(jnp.float32)
    if width == 0:
        return from_x
    from_state = state[row, jnp.clip(width + pos, 0, width - 1)].astype(jnp.float32)
    return jnp.where((pos >= 0)[..., None], from_x, from_state)


def _states_at(
    x: jnp.ndarray, cu: jnp.ndarray, state: jnp.ndarray, rows: jnp.ndarray, offsets: jnp.ndarray
) -> jnp.ndarray:
    """``[M, K - 1, C]`` float32 states of ``rows`` after ``offsets`` tokens of their spans."""
    width = state.shape[1]
    if width == 0:
        return jnp.zeros((rows.shape[0], 0, state.shape[2]), jnp.float32)
    slots = jnp.arange(width, dtype=jnp.int32)
    pos = offsets.astype(jnp.int32)[:, None] - width + slots[None, :]  # [M, K - 1]
    return _extended_at(x, state, cu, rows.astype(jnp.int32)[:, None], pos)


def causal_conv1d(
    x: jnp.ndarray,
    weight: jnp.ndarray,
    bias: jnp.ndarray | None,
    cu_seqlens: jnp.ndarray,
    initial_state: jnp.ndarray,
    *,
    activation: Activation = "silu",
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Causal depthwise conv over a packed batch.

    ``x [T, C]``, ``weight [C, K]``, ``bias [C] | None``, ``cu_seqlens int [R + 1]``,
    ``initial_state [R, K - 1, C]`` -> ``(y [T, C] in x.dtype, final_state [R, K - 1, C])``.
    """
    num_tokens = x.shape[0]
    kernel = weight.shape[1]
    cu = cu_seqlens.astype(jnp.int32)
    row, local, valid = _token_rows(cu, num_tokens)
    acc = jnp.zeros(x.shape, jnp.float32)
    if bias is not None:
        acc = acc + bias.astype(jnp.float32)[None, :]
    w = weight.astype(jnp.float32)
    for i in range(kernel):
        acc = acc + w[:, i][None, :] * _extended_at(x, initial_state, cu, row, local - (kernel - 1) + i)
    y = jnp.where(valid[:, None], _activate(acc, activation), 0.0).astype(x.dtype)
    lens = cu[1:] - cu[:-1]
    rows = jnp.arange(lens.shape[0], dtype=jnp.int32)
    final = _states_at(x, cu, initial_state, rows, lens).astype(initial_state.dtype)
    return y, final


def conv_states_at(
    x: jnp.ndarray,
    cu_seqlens: jnp.ndarray,
    initial_state: jnp.ndarray,
    rows: jnp.ndarray,
    offsets: jnp.ndarray,
) -> jnp.ndarray:
    """Conv state of row ``rows[m]`` after ``offsets[m]`` tokens of its span (``0 <= offset <= len``).

    ``rows, offsets int [M]`` -> ``[M, K - 1, C]`` in ``initial_state``'s dtype; offset 0 gives the
    row's initial state. Offsets past the span are not checked (they read the next row's tokens)."""
    cu = cu_seqlens.astype(jnp.int32)
    return _states_at(x, cu, initial_state, rows, offsets).astype(initial_state.dtype)


def causal_conv1d_update(
    x: jnp.ndarray,
    weight: jnp.ndarray,
    bias: jnp.ndarray | None,
    state: jnp.ndarray,
    *,
    activation: Activation = "silu",
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """One token per row: ``x [B, C]``, ``state [B, K - 1, C]`` ->
    ``(y [B, C] in x.dtype, new_state [B, K - 1, C] in state's dtype)``."""
    window = jnp.concatenate([state.astype(jnp.float32), x.astype(jnp.float32)[:, None, :]], axis=1)
    acc = jnp.einsum("bkc,ck->bc", window, weight.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    if bias is not None:
        acc = acc + bias.astype(jnp.float32)[None, :]
    y = _activate(acc, activation).astype(x.dtype)
    return y, window[:, 1:].astype(state.dtype)
