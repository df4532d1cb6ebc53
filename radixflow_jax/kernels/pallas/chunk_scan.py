"""A generic Pallas scan over the chunks of a packed ragged batch (shared by gated delta and SSD).

The caller supplies per-chunk inputs laid out head-major as ``[H_in, N, a, b]`` (``N`` chunks of
:func:`radixflow_jax.kernels.layout.chunk_layout`), initial states ``[R, H, s1, s2]`` float32 and a
``step(*inputs, state) -> (out [C, w], new_state [s1, s2])`` function on loaded float values. One
of the trailing dims of the state and of some inputs / the output is split into ``num_blocks``
column blocks, each scanned by its own grid program (the recurrence is independent per column).

Returns ``(out [H, N, C, W] out_dtype, chunk_states [N, H, s1, s2] f32)`` where
``chunk_states[c]`` is the state after chunk ``c``. The state restarts from
``initial_state[row[c]]`` at every row's first chunk.

Variants:
  * ``"tpu"``: grid ``(H, blocks, N)``, chunk axis ``"arbitrary"``; the state lives in a VMEM
    scratch ref; ``reset[c]`` and ``row[c]`` arrive by scalar prefetch (``row`` drives the
    initial-state ``index_map``). Chunk 0 always resets, so the scratch is never read unset.
    Unused chunks (zero inputs) carry the last state through: a finite placeholder.
  * ``"gpu"``: grid ``(R + 1, H, blocks)``; program ``r < R`` runs row ``r``'s chunks
    ``first_chunk[r] : first_chunk[r + 1]`` in a ``fori_loop`` with the state as the carry, so rows
    run in parallel; program ``r == R`` writes zeros to the unused chunks. Whole-``N`` blocks are
    only indexed with scalars in-kernel, so only the ``[a, b]`` tiles need power-of-two sizes.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from radixflow_jax.kernels.layout import ChunkLayout, effective_initial
from radixflow_jax.kernels.pallas.common import Backend, Ref, compiler_params, is_pow2

_F32 = jnp.float32
Step = Callable[..., tuple[jnp.ndarray, jnp.ndarray]]


class ChunkInput(NamedTuple):
    """One per-chunk kernel input ``[H_in, N, a, b]``; grid head ``h`` reads array head ``h // head_div``."""

    array: jnp.ndarray
    head_div: int = 1
    split_axis: int | None = None  # -1 or -2: this tail dim is split into the column blocks


def _tail(shape: tuple[int, int], split_axis: int | None, num_blocks: int) -> tuple[int, int]:
    """Tail block shape of a ``[..., a, b]`` array whose ``split_axis`` dim is split ``num_blocks`` ways."""
    a, b = shape
    if split_axis == -2:
        return a // num_blocks, b
    if split_axis == -1:
        return a, b // num_blocks
    return a, b


def _tail_index(split_axis: int | None, j: jnp.ndarray) -> tuple[jnp.ndarray | int, jnp.ndarray | int]:
    return (j if split_axis == -2 else 0, j if split_axis == -1 else 0)


def _head(h: jnp.ndarray, div: int) -> jnp.ndarray:
    """``h // div`` for ``h >= 0`` (``lax.div``: ``//`` emits ops Mosaic index maps cannot lower off-TPU)."""
    return h if div == 1 else jax.lax.div(h, div)


def _tpu_kernel(reset_ref: Ref, row_ref: Ref, *refs: Ref, step: Step, num_inputs: int) -> None:
    del row_ref  # consumed by the initial-state index_map
    in_refs, init_ref = refs[:num_inputs], refs[num_inputs]
    o_ref, st_ref, state_ref = refs[num_inputs + 1 :]
    c = pl.program_id(2)

    @pl.when(reset_ref[c] != 0)
    def _reset() -> None:
        state_ref[...] = init_ref[...]

    out, new_state = step(*(r[...] for r in in_refs), state_ref[...])
    o_ref[...] = out.astype(o_ref.dtype)
    st_ref[...] = new_state
    state_ref[...] = new_state


def _gpu_kernel(
    fc_ref: Ref, hi_ref: Ref, *refs: Ref, step: Step, num_inputs: int, num_rows: int, num_chunks: int
) -> None:
    in_refs, init_ref = refs[:num_inputs], refs[num_inputs]
    o_ref, st_ref = refs[num_inputs + 1 :]
    r = pl.program_id(0)
    real = r < num_rows
    lo = fc_ref[r]  # row r's chunks [lo, hi): all of them, or (policy pair's pre-pass) a prefix or none
    hi = jnp.where(real, hi_ref[r], lo)
    start = init_ref[jnp.minimum(r, num_rows - 1)].astype(_F32)

    def body(c: jnp.ndarray, state: jnp.ndarray) -> jnp.ndarray:
        out, new_state = step(*(ref[c] for ref in in_refs), state)
        o_ref[c] = out.astype(o_ref.dtype)
        st_ref[c] = new_state
        return new_state

    jax.lax.fori_loop(lo, hi, body, start)
    o_zero = jnp.zeros(o_ref.shape[1:], o_ref.dtype)
    st_zero = jnp.zeros(st_ref.shape[1:], st_ref.dtype)

    def zero(c: jnp.ndarray, carry: jnp.ndarray) -> jnp.ndarray:
        o_ref[c] = o_zero
        st_ref[c] = st_zero
        return carry

    unused_lo = jnp.where(real, num_chunks, fc_ref[num_rows])  # only program R zeroes
    jax.lax.fori_loop(unused_lo, num_chunks, zero, jnp.int32(0))


class _Plan(NamedTuple):
    """Static block geometry shared by both variants."""

    num_rows: int
    num_heads: int
    num_chunks: int
    num_blocks: int
    in_tails: list[tuple[int, int]]
    state_tail: tuple[int, int]  # state block [s1b, s2b]
    state_split_axis: int
    out_tail: tuple[int, int]  # output block [C, W / blocks]


def _tpu_call(
    step: Step, inputs: Sequence[ChunkInput], plan: _Plan, out_shape: tuple, name: str, interpret: bool
) -> Callable[..., tuple[jnp.ndarray, jnp.ndarray]]:
    split = plan.state_split_axis

    def in_spec(x: ChunkInput, tail: tuple[int, int]) -> pl.BlockSpec:
        return pl.BlockSpec(
            (None, None, *tail), lambda h, j, c, rs, rw: (_head(h, x.head_div), c, *_tail_index(x.split_axis, j))
        )

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,  # reset flags, rows
        grid=(plan.num_heads, plan.num_blocks, plan.num_chunks),
        in_specs=[in_spec(x, t) for x, t in zip(inputs, plan.in_tails)]
        + [pl.BlockSpec((None, None, *plan.state_tail), lambda h, j, c, rs, rw: (rw[c], h, *_tail_index(split, j)))],
        out_specs=[
            pl.BlockSpec((None, None, *plan.out_tail), lambda h, j, c, rs, rw: (h, c, 0, j)),
            pl.BlockSpec((None, None, *plan.state_tail), lambda h, j, c, rs, rw: (c, h, *_tail_index(split, j))),
        ],
        scratch_shapes=[pltpu.VMEM(plan.state_tail, _F32)],
    )
    return pl.pallas_call(
        functools.partial(_tpu_kernel, step=step, num_inputs=len(inputs)),
        out_shape=out_shape,
        grid_spec=grid_spec,
        compiler_params=compiler_params("tpu", ("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        name=f"{name}_tpu",
    )


def _gpu_call(
    step: Step, inputs: Sequence[ChunkInput], plan: _Plan, out_shape: tuple, name: str, interpret: bool
) -> Callable[..., tuple[jnp.ndarray, jnp.ndarray]]:
    tiles = plan.in_tails + [plan.state_tail, plan.out_tail]
    bad = [tail for tail in tiles if not (is_pow2(tail[0]) and is_pow2(tail[1]))]
    if bad:
        raise ValueError(
            f"{name}: the Triton (gpu) variant needs power-of-two tiles (chunk size, head dims, blocks); got {bad}"
        )
    n, split = plan.num_chunks, plan.state_split_axis

    def in_spec(x: ChunkInput, tail: tuple[int, int]) -> pl.BlockSpec:
        return pl.BlockSpec((None, n, *tail), lambda r, h, j: (_head(h, x.head_div), 0, *_tail_index(x.split_axis, j)))

    return pl.pallas_call(
        functools.partial(
            _gpu_kernel, step=step, num_inputs=len(inputs), num_rows=plan.num_rows, num_chunks=plan.num_chunks
        ),
        out_shape=out_shape,
        grid=(plan.num_rows + 1, plan.num_heads, plan.num_blocks),
        in_specs=[pl.BlockSpec((plan.num_rows + 1,), lambda r, h, j: (0,))] * 2  # first chunks, range ends
        + [in_spec(x, t) for x, t in zip(inputs, plan.in_tails)]
        + [pl.BlockSpec((plan.num_rows, None, *plan.state_tail), lambda r, h, j: (0, h, *_tail_index(split, j)))],
        out_specs=[
            pl.BlockSpec((None, n, *plan.out_tail), lambda r, h, j: (h, 0, 0, j)),
            pl.BlockSpec((n, None, *plan.state_tail), lambda r, h, j: (0, h, *_tail_index(split, j))),
        ],
        compiler_params=compiler_params("gpu", ()),
        interpret=interpret,
        name=f"{name}_gpu",
    )


def chunk_scan(
    step: Step,
    inputs: Sequence[ChunkInput],
    initial_state: jnp.ndarray,
    layout: ChunkLayout,
    *,
    out_width: int,
    out_dtype: jnp.dtype,
    state_split_axis: int,
    num_blocks: int,
    backend: Backend,
    interpret: bool,
    name: str,
    pair_chunk: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Runs ``step`` over all chunks; see the module docstring. The output's last dim is split.

    ``pair_chunk int32 [R]`` (policy ``pair``): row ``r`` with ``pair_chunk[r] >= 0`` starts from
    the state after chunk ``pair_chunk[r]``, which belongs to another, unpaired row of the call (see
    ``kernels/layout.scan_chunks``). ``"gpu"``: rows run in parallel programs, so no program can wait
    for another; a call with a paired row first runs a *pre-pass* over only the producers' chunks up
    to their deepest pairing chunk (every other program idles), then the full call with each paired
    row starting from the pre-pass's chunk state. ``"tpu"``: the grid scans every chunk in order with
    one state scratch, so a call with a paired row runs twice in full. A call without one runs once."""
    num_rows, num_heads = initial_state.shape[:2]
    state_shape = initial_state.shape[2:]
    num_chunks, chunk = inputs[0].array.shape[1], inputs[0].array.shape[2]
    if out_width % num_blocks:
        raise ValueError(f"output width {out_width} not divisible into {num_blocks} blocks")
    plan = _Plan(
        num_rows=num_rows,
        num_heads=num_heads,
        num_chunks=num_chunks,
        num_blocks=num_blocks,
        in_tails=[_tail(x.array.shape[2:], x.split_axis, num_blocks) for x in inputs],
        state_tail=_tail(state_shape, state_split_axis, num_blocks),
        state_split_axis=state_split_axis,
        out_tail=(chunk, out_width // num_blocks),
    )
    out_shape = (
        jax.ShapeDtypeStruct((num_heads, num_chunks, chunk, out_width), out_dtype),
        jax.ShapeDtypeStruct((num_chunks, num_heads, *state_shape), _F32),
    )
    arrays = [x.array for x in inputs]
    init = initial_state.astype(_F32)
    if backend == "tpu":
        reset = (layout.is_first | (jnp.arange(num_chunks) == 0)).astype(jnp.int32)  # chunk 0 always resets
        row = jnp.minimum(layout.row, num_rows - 1).astype(jnp.int32)
        call = _tpu_call(step, inputs, plan, out_shape, name, interpret)
        if pair_chunk is None:
            return call(reset, row, *arrays, init)

        def twice() -> tuple[jnp.ndarray, jnp.ndarray]:
            _, first = call(reset, row, *arrays, init)
            return call(reset, row, *arrays, effective_initial(init, first, pair_chunk))

        return jax.lax.cond(jnp.any(pair_chunk >= 0), twice, lambda: call(reset, row, *arrays, init))
    call = _gpu_call(step, inputs, plan, out_shape, name, interpret)
    fc = layout.first_chunk
    ends = jnp.concatenate([fc[1:], fc[num_rows:]])  # program R's range is empty
    if pair_chunk is None:
        return call(fc, ends, *arrays, init)
    src = pair_chunk.astype(jnp.int32)
    producer = jnp.minimum(layout.row[jnp.clip(src, 0, num_chunks - 1)], num_rows - 1)
    # each producer's deepest pairing chunk + 1; 0 for a row nobody pairs with (its range stays empty)
    deepest = jnp.zeros((num_rows + 1,), jnp.int32).at[jnp.where(src >= 0, producer, num_rows)].max(src + 1)
    pre_hi = jnp.where(deepest > 0, deepest, fc)

    def paired() -> tuple[jnp.ndarray, jnp.ndarray]:
        _, first = call(fc, pre_hi, *arrays, init)  # the producers' prefixes only
        return call(fc, ends, *arrays, effective_initial(init, first, pair_chunk))

    return jax.lax.cond(jnp.any(src >= 0), paired, lambda: call(fc, ends, *arrays, init))
