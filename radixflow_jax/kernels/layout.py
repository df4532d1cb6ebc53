"""Chunk layout of a packed variable-length token batch, and the chunk helpers every chunked
kernel shares (XLA and Pallas forms of the gated delta rule and of SSD): gathering a packed batch
into chunks (:func:`gather_chunks`, :func:`heads_chunks`), scattering chunk outputs back
(:func:`scatter_chunks`), the scan over chunks (:func:`scan_chunks`, with paired rows) and each
row's final state (:func:`effective_initial`, :func:`final_states`).

A round packs the token spans of ``R`` rows back to back into ``T`` token slots:
row ``r`` owns packed tokens ``cu_seqlens[r] : cu_seqlens[r + 1]``; tokens at or after
``cu_seqlens[R]`` are padding. Chunked recurrent ops split every row's span into chunks of
``chunk_size`` tokens counted from the *start of the span* (the last chunk of a row may be
short). Chunks of all rows are numbered consecutively: row ``r`` owns chunks
``first_chunk[r] : first_chunk[r + 1]``.

Invariants:
  * ``num_chunks = ceil(T / chunk_size) + R`` is static (a row adds at most one partial chunk);
    chunks past ``first_chunk[R]`` are unused (``row == R``, ``length == 0``).
  * The state after chunk ``first_chunk[r] + j`` is the state of row ``r`` after
    ``min((j + 1) * chunk_size, span_len)`` tokens of its span.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp


class ChunkLayout(NamedTuple):
    """Per-chunk metadata; all arrays int32 of length ``num_chunks`` unless noted."""

    row: jnp.ndarray  # owning row, R for unused chunks
    start: jnp.ndarray  # packed index of the chunk's first token
    length: jnp.ndarray  # real tokens in the chunk, 0 for unused chunks
    is_first: jnp.ndarray  # bool: first chunk of its row (the state resets to the row's initial state)
    first_chunk: jnp.ndarray  # [R + 1] chunk index of each row's first chunk (cumulative)


def num_chunks_for(num_tokens: int, num_rows: int, chunk_size: int) -> int:
    """Static chunk count of a ``[num_tokens]`` batch with ``num_rows`` rows."""
    return -(-num_tokens // chunk_size) + num_rows


def first_chunks(cu_seqlens: jnp.ndarray, chunk_size: int) -> jnp.ndarray:
    """``[R + 1]``: the index of each row's first chunk (cumulative; the last entry counts them all)."""
    cu = cu_seqlens.astype(jnp.int32)
    per_row = (cu[1:] - cu[:-1] + chunk_size - 1) // chunk_size
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(per_row).astype(jnp.int32)])


def chunk_ending_at(cu_seqlens: jnp.ndarray, rows: jnp.ndarray, offsets: jnp.ndarray, chunk_size: int) -> jnp.ndarray:
    """The chunk whose end state is row ``rows[m]``'s state after ``offsets[m] > 0`` tokens of its span
    (``offsets`` on the chunk grid or the span end); -1 where ``offsets[m] == 0`` (no chunk holds the
    initial state)."""
    chunk = first_chunks(cu_seqlens, chunk_size)[rows] + (offsets + chunk_size - 1) // chunk_size - 1
    return jnp.where(offsets > 0, chunk, -1)


def chunk_layout(cu_seqlens: jnp.ndarray, num_tokens: int, chunk_size: int) -> ChunkLayout:
    """Computes the chunk layout of a packed batch (traceable; shapes depend only on statics)."""
    cu = cu_seqlens.astype(jnp.int32)
    num_rows = cu.shape[0] - 1
    lens = cu[1:] - cu[:-1]
    first_chunk = first_chunks(cu, chunk_size)
    n = num_chunks_for(num_tokens, num_rows, chunk_size)
    idx = jnp.arange(n, dtype=jnp.int32)
    row = jnp.searchsorted(first_chunk[1:], idx, side="right").astype(jnp.int32)
    safe_row = jnp.minimum(row, num_rows - 1)
    local = idx - first_chunk[safe_row]
    used = row < num_rows
    start = jnp.where(used, cu[safe_row] + local * chunk_size, num_tokens)
    length = jnp.where(used, jnp.minimum(chunk_size, lens[safe_row] - local * chunk_size), 0)
    is_first = used & (local == 0)
    return ChunkLayout(row=row, start=start, length=length, is_first=is_first, first_chunk=first_chunk)


def gather_chunks(x: jnp.ndarray, layout: ChunkLayout, chunk_size: int) -> jnp.ndarray:
    """Gathers ``x[T, ...]`` into ``[num_chunks, chunk_size, ...]``; slots past a chunk's length are 0."""
    num_tokens = x.shape[0]
    pos = layout.start[:, None] + jnp.arange(chunk_size, dtype=jnp.int32)[None, :]
    valid = jnp.arange(chunk_size, dtype=jnp.int32)[None, :] < layout.length[:, None]
    safe = jnp.where(valid, jnp.minimum(pos, num_tokens - 1), 0)
    out = x[safe]
    mask = valid.reshape(valid.shape + (1,) * (x.ndim - 1))
    return jnp.where(mask, out, jnp.zeros((), x.dtype))


def scatter_chunks(y: jnp.ndarray, layout: ChunkLayout, num_tokens: int) -> jnp.ndarray:
    """Inverse of :func:`gather_chunks`: ``[num_chunks, chunk_size, ...] -> [T, ...]``; padding tokens get 0."""
    chunk_size = y.shape[1]
    pos = layout.start[:, None] + jnp.arange(chunk_size, dtype=jnp.int32)[None, :]
    valid = jnp.arange(chunk_size, dtype=jnp.int32)[None, :] < layout.length[:, None]
    target = jnp.where(valid, pos, num_tokens)  # out-of-range index: dropped
    out = jnp.zeros((num_tokens,) + y.shape[2:], y.dtype)
    return out.at[target.reshape(-1)].set(y.reshape((-1,) + y.shape[2:]), mode="drop")


def scan_chunks(
    step: Callable[..., jnp.ndarray],
    per_chunk: tuple[jnp.ndarray, ...],
    layout: ChunkLayout,
    initial_state: jnp.ndarray,
    pair_chunk: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The sequential pass over chunks shared by the chunked recurrent kernels.

    ``step(start [S...], *inputs_c) -> end [S...]`` advances a state over one chunk, ``per_chunk``
    holds its inputs ``[N, ...]``. Returns ``(start_states, end_states)``, each ``[N, S...]`` f32.
    The state restarts at each row's first chunk from ``initial_state[row]``, or, for a *paired*
    row (``pair_chunk[row] >= 0``, policy ``pair``), from the end state of chunk ``pair_chunk[row]``
    of the same call (its producer's state at the pairing depth).

    Without a paired row the pass visits the used chunks only (a loop of ``first_chunk[R]`` steps,
    not ``ceil(T / C) + R``); unused chunks get zero states and their start states are read off the
    end states afterwards (a row's first chunk starts from ``init[row]``, any other from the
    previous chunk's end). Pairing costs no extra pass: the scan visits the chunks of unpaired rows
    first, then those of paired rows, each group in chunk order, and keeps every end state it
    wrote. Invariant (the caller's): the chunk a paired row starts from belongs to an unpaired row,
    so it was visited before; unused chunks pass the carry through."""
    init = jnp.asarray(initial_state, jnp.float32)
    num_rows, num_chunks = init.shape[0], layout.row.shape[0]
    safe_row = jnp.minimum(layout.row, num_rows - 1)

    def plain() -> tuple[jnp.ndarray, jnp.ndarray]:
        # over the used chunks only (they come first); unused ones keep zero end states
        def body(c: jnp.ndarray, carry: tuple[jnp.ndarray, jnp.ndarray]) -> tuple[jnp.ndarray, jnp.ndarray]:
            state, ends = carry
            start = jnp.where(layout.is_first[c], init[safe_row[c]], state)
            end = step(start, *(jax.lax.dynamic_index_in_dim(x, c, keepdims=False) for x in per_chunk))
            return end, jax.lax.dynamic_update_index_in_dim(ends, end, c, 0)

        zeros = jnp.zeros((num_chunks,) + init.shape[1:], jnp.float32)
        _, ends = jax.lax.fori_loop(0, layout.first_chunk[-1], body, (zeros[0], zeros))
        prev = ends[jnp.maximum(jnp.arange(num_chunks) - 1, 0)]
        first = layout.is_first.reshape((-1,) + (1,) * (init.ndim - 1))
        return jnp.where(first, init[safe_row], prev), ends

    if pair_chunk is None:
        return plain()
    # a call without a paired row (most rounds of policy pair) takes the plain scan
    paired = lambda: _paired_scan(step, per_chunk, layout, init, safe_row, pair_chunk)  # noqa: E731
    return jax.lax.cond(jnp.any(pair_chunk >= 0), paired, plain)


def _paired_scan(
    step: Callable[..., jnp.ndarray],
    per_chunk: tuple[jnp.ndarray, ...],
    layout: ChunkLayout,
    init: jnp.ndarray,
    safe_row: jnp.ndarray,
    pair_chunk: jnp.ndarray,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """:func:`scan_chunks` with paired rows: unpaired rows' chunks first, then paired rows'."""
    num_rows, num_chunks = init.shape[0], layout.row.shape[0]
    src = pair_chunk.astype(jnp.int32)
    paired = (layout.row < num_rows) & (src[safe_row] >= 0)
    order = jnp.argsort(paired.astype(jnp.int32), stable=True).astype(jnp.int32)
    buf = jnp.zeros((num_chunks,) + init.shape[1:], jnp.float32)

    def paired_body(
        carry: tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray], c: jnp.ndarray
    ) -> tuple[tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray], None]:
        state, starts, ends = carry
        r = safe_row[c]
        row_init = jnp.where(src[r] >= 0, ends[jnp.clip(src[r], 0, num_chunks - 1)], init[r])
        start = jnp.where(layout.is_first[c], row_init, state)
        end = step(start, *(x[c] for x in per_chunk))
        return (end, starts.at[c].set(start), ends.at[c].set(end)), None

    (_, starts, ends), _ = jax.lax.scan(paired_body, (jnp.zeros_like(init[0]), buf, buf), order)
    return starts, ends


def effective_initial(initial_state: jnp.ndarray, ends: jnp.ndarray, pair_chunk: jnp.ndarray | None) -> jnp.ndarray:
    """Every row's initial state as :func:`scan_chunks` used it (f32)."""
    init = jnp.asarray(initial_state, jnp.float32)
    if pair_chunk is None:
        return init
    src = pair_chunk.astype(jnp.int32)
    picked = ends[jnp.clip(src, 0, ends.shape[0] - 1)]
    return jnp.where((src >= 0).reshape((-1,) + (1,) * (init.ndim - 1)), picked, init)


def final_states(
    chunk_states: jnp.ndarray, layout: ChunkLayout, initial_state: jnp.ndarray, pair_chunk: jnp.ndarray | None = None
) -> jnp.ndarray:
    """Each row's state (f32) after its last chunk, or, when the row has no chunk (no tokens), its
    initial state as :func:`effective_initial` gives it (a paired row's: its producer's chunk state)."""
    first = layout.first_chunk
    has = (first[1:] > first[:-1])[:, None, None, None]
    init = effective_initial(initial_state, chunk_states, pair_chunk)
    return jnp.where(has, chunk_states[jnp.maximum(first[1:] - 1, 0)], init)


def heads_chunks(x: jnp.ndarray, layout: ChunkLayout, chunk_size: int) -> jnp.ndarray:
    """:func:`gather_chunks` head-major: ``[T, H, ...] -> [N, H, C, ...]`` (padding slots are zero)."""
    return jnp.moveaxis(gather_chunks(x, layout, chunk_size), 1, 2)
