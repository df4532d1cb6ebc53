"""What the recurrent mixers (Gated DeltaNet, Mamba2) share: the depthwise causal conv,
:func:`recurrent_mix`, the one routine that splits a call into decode rows (one-step updates) and
prefill rows (packed chunked scan), writes every row's state back to its slot and emits the
requested checkpoints, and :class:`RecurrentMixer`, the call around it. The mixers only say how
their inputs are projected, how conv outputs become kernel inputs, which kernels run and how the
output is gated (:class:`MixSpec`), so checkpoint correctness lives here, once.

Rows ``[:num_decode]`` own the first ``num_decode`` token slots, one token each, and run in the
contiguous slot window ``[decode_base, decode_base + num_decode)`` (:class:`DecodeWindow`); the
rest of the rows form a packed ragged batch over the remaining slots (see ``models/batch.py``).
"""

from __future__ import annotations

import abc
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from radixflow_jax.kernels import ops
from radixflow_jax.kernels.layout import chunk_ending_at, effective_initial
from radixflow_jax.models.batch import Batch
from radixflow_jax.models.config import GdnConfig, MambaConfig
from radixflow_jax.models.layers import Linear
from radixflow_jax.models.mixers.lanes import LaneTerms, VerifyLanes, verify_lanes


class DepthwiseConv1d(nnx.Module):
    """Holds the HF ``conv1d.weight [C, 1, K]`` (and optional bias) of a depthwise causal conv."""

    def __init__(self, channels: int, kernel: int, *, bias: bool, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.weight = nnx.Param((jax.random.normal(rngs.params(), (channels, 1, kernel)) * 0.2).astype(dtype))
        self.bias = nnx.Param(jnp.zeros((channels,), dtype)) if bias else None

    def kernel(self) -> jax.Array:
        return self.weight[...][:, 0, :]

    def bias_or_none(self) -> jax.Array | None:
        return self.bias[...] if self.bias is not None else None


def run_conv(
    conv: DepthwiseConv1d, x: jax.Array, batch: Batch, state: jax.Array, num_decode: int
) -> tuple[jax.Array, jax.Array]:
    """Causal conv + SiLU over packed ``x [T, C]``; ``state [R, K-1, C]`` -> ``(y [T, C], new [R, ...])``."""
    num_rows = batch.state_slots.shape[0]
    ys, states = [], []
    if num_decode:
        y, s = ops.causal_conv1d_update(x[:num_decode], conv.kernel(), conv.bias_or_none(), state[:num_decode])
        ys.append(y)
        states.append(s)
    if num_rows > num_decode:
        cu = batch.cu_seqlens[num_decode:] - num_decode
        y, s = ops.causal_conv1d(x[num_decode:], conv.kernel(), conv.bias_or_none(), cu, state[num_decode:])
        ys.append(y)
        states.append(s)
    elif x.shape[0] > num_decode:
        ys.append(jnp.zeros_like(x[num_decode:]))
    return jnp.concatenate(ys, axis=0), jnp.concatenate(states, axis=0)


class Emits(NamedTuple):
    """Checkpoints a call writes: the state of row ``rows[m]`` after ``offsets[m]`` tokens of its
    span goes to slot ``slots[m]``. Offsets of prefill rows are 0, a multiple of the kernel chunk, or
    the span length; a decode row's offset is always 1. Padding entries write slot 0."""

    rows: jax.Array  # int32 [M]
    offsets: jax.Array  # int32 [M]
    slots: jax.Array  # int32 [M]


def emitted_states(
    emits: Emits,
    num_decode: int,
    chunk_size: int,
    decode: tuple[jax.Array, jax.Array] | None,
    prefill: tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array] | None,
) -> tuple[jax.Array, jax.Array]:
    """``(conv [M, K-1, C], ssm [M, ...])`` of every emit.

    ``decode``: the decode rows' new ``(conv, ssm)``: a decode row emits only after its one token
    (offset 1, ``runner/inputs.build_arrays`` refuses anything else), so its initial state is never
    read here and XLA may fuse the read of it into the one-step update; padding entries (row 0,
    offset 0) write the sink slot and may read anything. ``prefill``: ``(conv inputs [Tp, C],
    cu_seqlens [Rp+1], initial conv [Rp, ...], initial ssm [Rp, ...], chunk_states [Nc, ...])`` of the
    prefill rows (row ``r`` of the batch is prefill row ``r - num_decode``)."""
    convs, ssms, use_decode = [], [], emits.rows < num_decode
    if decode is not None:
        idx = jnp.clip(emits.rows, 0, num_decode - 1)
        conv_new, ssm_new = decode
        convs.append(conv_new[idx])
        ssms.append(ssm_new[idx])
    if prefill is not None:
        x, cu, conv0, ssm0, chunk_states = prefill
        rows = jnp.clip(emits.rows - num_decode, 0, conv0.shape[0] - 1)
        lens = cu[1:] - cu[:-1]
        offsets = jnp.clip(emits.offsets, 0, lens[rows])
        chunk = jnp.clip(chunk_ending_at(cu, rows, offsets, chunk_size), 0, chunk_states.shape[0] - 1)
        at_start = (offsets == 0).reshape((-1,) + (1,) * (ssm0.ndim - 1))
        convs.append(ops.conv_states_at(x, cu, conv0, rows, offsets))
        ssms.append(jnp.where(at_start, ssm0[rows], chunk_states[chunk]))
    if len(convs) == 1:
        return convs[0], ssms[0]
    sel_c = use_decode.reshape((-1,) + (1,) * (convs[0].ndim - 1))
    sel_s = use_decode.reshape((-1,) + (1,) * (ssms[0].ndim - 1))
    return jnp.where(sel_c, convs[0], convs[1]), jnp.where(sel_s, ssms[0], ssms[1])


def write_emits(
    conv_pool: jax.Array, ssm_pool: jax.Array, emits: Emits | None, states: tuple[jax.Array, jax.Array] | None
) -> tuple[jax.Array, jax.Array]:
    if emits is None or states is None:
        return conv_pool, ssm_pool
    conv, ssm = states
    return conv_pool.at[emits.slots].set(conv.astype(conv_pool.dtype)), ssm_pool.at[emits.slots].set(ssm)


def initial_states(
    conv_pool: jax.Array, ssm_pool: jax.Array, batch: Batch, first: int = 0
) -> tuple[jax.Array, jax.Array]:
    """The ``(conv, ssm)`` state of rows ``[first:]`` before their spans: read from ``source_slots``
    (or ``state_slots``), zero for ``fresh`` rows. All reads of a layer happen before its writes."""
    src = (batch.state_slots if batch.source_slots is None else batch.source_slots)[first:]
    conv0, ssm0 = conv_pool[src], ssm_pool[src]
    if batch.fresh is not None:
        fresh = batch.fresh[first:]
        conv0 = jnp.where(fresh[:, None, None], jnp.zeros((), conv0.dtype), conv0)
        ssm0 = jnp.where(fresh.reshape((-1,) + (1,) * (ssm0.ndim - 1)), 0.0, ssm0)
    return conv0, ssm0


class DecodeWindow(NamedTuple):
    """The decode region's states, read in place: decode row ``r`` runs in slot ``base + r``
    (``Batch.decode_base``), so its states are one contiguous window of each pool, read by the
    one-step update without a gather. A decode-only call writes the window back in place
    (:meth:`write`); a call that also has prefill rows writes every row with one scatter after all
    of its reads (XLA then updates the donated pools in place; an in-place window write before the
    prefill rows' reads would make it copy the pools). On a 64-row decode round of
    ``benchmarks/vs_transformers.py`` this took the round from about 70 to about 47 ms (2026-12-01,
    docs/perf-log.md). A decode row is real exactly when ``state_slots[r] == base + r``; a
    padding decode row leaves its window slot's state as it was (the window write puts it back, the
    scatter sends it to the sink slot 0), so it never changes a slot some other row or checkpoint
    owns. Decode rows never start from another slot's checkpoint and are never fresh (the runner
    puts such one-token rows in the prefill region, ``runner/window.py``)."""

    base: jax.Array  # int32 scalar
    real: jax.Array  # bool [d]
    conv: jax.Array  # [d, K-1, C]: the window of the conv pool
    ssm: jax.Array  # [d, ...]: the window of the state pool

    @staticmethod
    def read(conv_pool: jax.Array, ssm_pool: jax.Array, batch: Batch, d: int) -> "DecodeWindow":
        if batch.decode_base is None:
            raise ValueError("a call with decode rows needs Batch.decode_base (the slot of decode row 0)")
        if d > ssm_pool.shape[0]:
            raise ValueError(f"a decode region of {d} rows does not fit a pool of {ssm_pool.shape[0]} slots")
        base = jnp.clip(jnp.asarray(batch.decode_base, jnp.int32), 0, ssm_pool.shape[0] - d)
        real = batch.state_slots[:d] == base + jnp.arange(d, dtype=jnp.int32)
        conv = jax.lax.dynamic_slice_in_dim(conv_pool, base, d, 0)
        return DecodeWindow(base, real, conv, jax.lax.dynamic_slice_in_dim(ssm_pool, base, d, 0))

    def write(
        self, conv_pool: jax.Array, ssm_pool: jax.Array, conv_new: jax.Array, ssm_new: jax.Array | None
    ) -> tuple[jax.Array, jax.Array]:
        """The pools with the real decode rows' new states in their window slots (in place, as long
        as no read of the pools before this write is ordered after it). ``ssm_new`` None: the
        state pool's window was already written by an in-place update (``DecodeInPlaceFn``)."""
        conv = jax.lax.dynamic_update_slice_in_dim(conv_pool, _pick(self.real, conv_new, self.conv), self.base, 0)
        if ssm_new is None:
            return conv, ssm_pool
        return conv, jax.lax.dynamic_update_slice_in_dim(ssm_pool, _pick(self.real, ssm_new, self.ssm), self.base, 0)

    def copy_emits(self, conv_pool: jax.Array, ssm_pool: jax.Array, emits: Emits) -> tuple[jax.Array, jax.Array]:
        """Writes every emit of a decode-only call after :meth:`write`: the state of decode row
        ``rows[m]`` (its new state, in its window slot) copied slot to slot, one emit per loop step,
        so each read of the pool is ordered before its write and the pools stay in place (a gather
        of the emitted states fused into one scatter would read the pool it writes, and XLA copies
        the pool then). Padding entries copy into the sink slot 0."""
        d = self.real.shape[0]
        src = self.base + jnp.clip(emits.rows, 0, d - 1)

        def one(m: jax.Array, pools: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
            return tuple(
                jax.lax.dynamic_update_slice_in_dim(p, jax.lax.dynamic_slice_in_dim(p, src[m], 1, 0), emits.slots[m], 0)
                for p in pools
            )

        return jax.lax.fori_loop(0, emits.rows.shape[0], one, (conv_pool, ssm_pool))


Inputs = tuple[jax.Array, ...]
DecodeFn = Callable[[Inputs, jax.Array], tuple[jax.Array, jax.Array]]
# (inputs, ssm_pool, window base, real rows) -> (out, ssm_pool with the real rows' new states in the window)
DecodeInPlaceFn = Callable[[Inputs, jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
ChunkedFn = Callable[[Inputs, jax.Array, jax.Array, "jax.Array | None"], tuple[jax.Array, jax.Array, jax.Array]]


class RecurrentKernels(NamedTuple):
    """A mixer's kernel calls for :func:`recurrent_mix`: ``decode`` (the decode rows' one-step
    update), ``chunked`` (the prefill rows' chunked scan), ``lane_terms`` (what verify lanes keep of
    a row's first tokens, ``models/mixers/lanes.py``) and, optionally, ``decode_in_place`` (the
    one-step update writing the state pool's window itself)."""

    decode: DecodeFn
    chunked: ChunkedFn
    lane_terms: LaneTerms
    decode_in_place: DecodeInPlaceFn | None = None


def _pick(mask: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
    return jnp.where(mask.reshape((-1,) + (1,) * (old.ndim - 1)), new.astype(old.dtype), old)


class _Pairing(NamedTuple):
    """Where each paired consumer row (``batch.pair_emit[r] >= 0``, policy ``pair``, never a decode
    row) starts: its producer's state at the pairing depth, inside the same layer call. The producer
    row ``prow`` wrote emit ``pair_emit[r]`` after ``depth`` tokens of its span."""

    paired: jax.Array  # bool [R]
    prow: jax.Array  # int32 [R], the producer row (meaningless where not paired)
    depth: jax.Array  # int32 [R], tokens of the producer's span before the pairing point

    @staticmethod
    def of(batch: Batch, emits: Emits) -> "_Pairing":
        src = jnp.clip(batch.pair_emit, 0, emits.rows.shape[0] - 1)
        cu = batch.cu_seqlens.astype(jnp.int32)
        prow = jnp.clip(emits.rows[src], 0, batch.state_slots.shape[0] - 1)
        depth = jnp.clip(emits.offsets[src], 0, (cu[1:] - cu[:-1])[prow])
        return _Pairing(batch.pair_emit >= 0, prow, depth)

    def conv_initial(self, conv_in: jax.Array, batch: Batch, conv0: jax.Array) -> jax.Array:
        """Paired rows' conv state := the producer's after ``depth`` tokens (read from the conv
        inputs, so it needs no pass over the producer first)."""
        at = ops.conv_states_at(conv_in, batch.cu_seqlens, conv0, self.prow, self.depth)
        return _pick(self.paired, at, conv0)

    def ssm_initial(
        self, ssm0: jax.Array, decode_new: jax.Array | None, d: int, chunk_size: int, cu_prefill: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``(ssm0, pair_chunk)`` of the prefill rows (``ssm0 [R - d]``; ``decode_new``: the decode
        rows' new states, or None): a paired row whose producer is a decode row (which emits only
        after its one token) or pairs at depth 0 gets its state here; one that pairs inside a
        prefill producer's span gets the index of the producer's chunk ending at ``depth``
        (``depth`` is on the chunk grid or the span end), which the chunked scan starts it from."""
        prow, depth, paired = self.prow[d:], self.depth[d:], self.paired[d:]
        local = jnp.clip(prow - d, 0, ssm0.shape[0] - 1)
        direct = ssm0[local]
        if decode_new is not None:
            after_one = decode_new[jnp.clip(prow, 0, d - 1)]
            direct = jnp.where((prow < d).reshape((-1,) + (1,) * (ssm0.ndim - 1)), after_one, direct)
        in_scan = paired & (prow >= d) & (depth > 0)
        ssm0 = _pick(paired & ~in_scan, direct, ssm0)
        chunk = chunk_ending_at(cu_prefill, local, depth, chunk_size)
        return ssm0, jnp.where(in_scan, chunk, -1)


def recurrent_mix(
    conv: DepthwiseConv1d,
    conv_in: jax.Array,
    batch: Batch,
    conv_pool: jax.Array,
    ssm_pool: jax.Array,
    num_decode: int,
    emits: Emits | None,
    chunk_size: int,
    prepare: Callable[[jax.Array], Inputs],
    kernels: RecurrentKernels,
    lane_steps: int = 0,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, VerifyLanes | None]:
    """One recurrent layer's state traffic around its kernels.

    ``conv_in [T, C]``: the conv inputs; ``prepare(conv_out [T, C])`` -> per-token kernel inputs
    (every array ``[T, ...]``); ``kernels``: ``decode(inputs[:d], ssm[:d]) -> (out, new_ssm)`` is the one-step
    update of the decode rows; ``chunked(inputs[d:], cu_seqlens, ssm[d:], pair_chunk) -> (out,
    final_ssm, chunk_states)`` the chunked scan of the prefill rows (``pair_chunk``: None, or per
    prefill row the chunk whose end state it starts from, see ``kernels/layout.scan_chunks``);
    ``decode_in_place`` (optional): the same one-step update, writing the real decode rows' window
    of the state pool itself, for decode-only calls (``ops.gated_delta_decode_window``).
    Returns ``(core_out [T, ...] (the kernels' dtype), conv_out [T, C], conv_pool, ssm_pool, lanes)``:
    every row's state after its span goes to its slot (:class:`DecodeWindow` says how: the
    decode rows' window, the prefill rows' ``state_slots[r]``; padding rows change nothing but the
    sink slot 0), then every emit's state to its slot. Padding tokens of the prefill region get a
    zero output. Prefill rows start from :func:`initial_states` (copy-on-write of checkpoints
    happens here, as a read of the source, before any write); paired consumer rows
    (``batch.pair_emit``) from their producer's in-call state (:class:`_Pairing`), in the same
    single pass: a consumer never pairs with another paired row (the scheduler and
    ``build_arrays`` refuse it), so its producer's state exists when the scan reaches it. ``lanes``:
    :func:`~radixflow_jax.models.mixers.lanes.verify_lanes` with ``lane_steps`` > 0, else None."""
    num_tokens, num_rows, d = conv_in.shape[0], batch.state_slots.shape[0], num_decode
    window = DecodeWindow.read(conv_pool, ssm_pool, batch, d) if d else None
    conv0_p = ssm_p = None
    if num_rows > d:
        conv0_p, ssm_p = initial_states(conv_pool, ssm_pool, batch, d)
    conv0 = jnp.concatenate([x for x in (window.conv if window else None, conv0_p) if x is not None], axis=0)
    pairing = None
    if batch.pair_emit is not None and emits is not None and num_rows > d:
        pairing = _Pairing.of(batch, emits)
        conv0 = pairing.conv_initial(conv_in, batch, conv0)
    conv_out, conv_new = run_conv(conv, conv_in, batch, conv0, d)
    inputs = prepare(conv_out)
    outs, decode_new, lanes, prefill_src = [], None, None, None
    if window is not None and num_rows == d and kernels.decode_in_place is not None:
        o, ssm_pool = kernels.decode_in_place(tuple(x[:d] for x in inputs), ssm_pool, window.base, window.real)
        outs.append(o)
    elif window is not None:
        o, decode_new = kernels.decode(tuple(x[:d] for x in inputs), window.ssm)
        outs.append(o)
    if num_rows > d:
        cu = batch.cu_seqlens[d:] - d
        pair_chunk = None
        if pairing is not None:
            ssm_p, pair_chunk = pairing.ssm_initial(ssm_p, decode_new, d, chunk_size, cu)
        own = tuple(x[d:] for x in inputs)
        o, final, chunk_states = kernels.chunked(own, cu, ssm_p, pair_chunk)
        outs.append(o)
        if lane_steps:  # a verify variant: the rows' states after each of their first tokens
            lanes = verify_lanes(conv_in[d:], cu, conv0[d:], ssm_p, own, kernels.lane_terms, lane_steps)
        # emits at offset 0 of a paired row read the state it started from
        prefill_src = (conv_in[d:], cu, conv0[d:], effective_initial(ssm_p, chunk_states, pair_chunk), chunk_states)
    elif num_tokens > d:
        outs.append(jnp.zeros((num_tokens - d,) + outs[0].shape[1:], outs[0].dtype))
    core = jnp.concatenate(outs, axis=0)
    if num_rows == d:  # decode only: the window in place
        conv_pool, ssm_pool = window.write(conv_pool, ssm_pool, conv_new, decode_new)
    else:  # one scatter after every read (a padding decode row writes the sink slot 0)
        ssm_new = final if window is None else jnp.concatenate([decode_new, final], axis=0)
        conv_pool = conv_pool.at[batch.state_slots].set(conv_new.astype(conv_pool.dtype))
        ssm_pool = ssm_pool.at[batch.state_slots].set(ssm_new)
    if emits is not None and num_rows == d:
        conv_pool, ssm_pool = window.copy_emits(conv_pool, ssm_pool, emits)
    elif emits is not None:  # a decode row emits after its one token: its new state
        decode_src = (conv_new[:d], decode_new) if window is not None else None
        emitted = emitted_states(emits, d, chunk_size, decode_src, prefill_src)
        conv_pool, ssm_pool = write_emits(conv_pool, ssm_pool, emits, emitted)
    return core, conv_out, conv_pool, ssm_pool, lanes


class MixSpec(NamedTuple):
    """One call of a recurrent mixer as its :meth:`RecurrentMixer.spec` says it:
    ``conv_in [T, C]``, ``prepare`` and ``kernels`` for :func:`recurrent_mix`, and
    ``finish(core_out, conv_out) -> [T, D]``, the input of the mixer's ``out_proj``."""

    conv_in: jax.Array
    prepare: Callable[[jax.Array], Inputs]
    kernels: RecurrentKernels
    finish: Callable[[jax.Array, jax.Array], jax.Array]


class RecurrentMixer(nnx.Module):
    """A recurrent mixer's call: :meth:`spec` of the tokens, :func:`recurrent_mix` of the spec over
    ``conv1d`` at ``cfg.chunk_size``, then ``out_proj`` of the finished output. All state traffic
    (slots, checkpoints, pairing) is :func:`recurrent_mix`'s."""

    cfg: GdnConfig | MambaConfig
    conv1d: DepthwiseConv1d
    out_proj: Linear

    @abc.abstractmethod
    def spec(self, x: jax.Array) -> MixSpec:
        """The mixer's projections of ``x [T, hidden]`` and what :func:`recurrent_mix` runs."""

    def __call__(
        self,
        x: jax.Array,
        batch: Batch,
        conv_pool: jax.Array,
        ssm_pool: jax.Array,
        num_decode: int,
        emits: Emits | None = None,
        lane_steps: int = 0,
    ) -> tuple[jax.Array, jax.Array, jax.Array, VerifyLanes | None]:
        """``(out [T, hidden], conv_pool, ssm_pool, lanes)``; rows ``[:num_decode]`` are decode rows;
        ``lanes``: :func:`recurrent_mix`'s verify lanes (None without ``lane_steps``)."""
        spec, chunk = self.spec(x), self.cfg.chunk_size
        core, conv_out, conv_pool, ssm_pool, lanes = recurrent_mix(
            self.conv1d, spec.conv_in, batch, conv_pool, ssm_pool, num_decode, emits, chunk, spec.prepare, spec.kernels,
            lane_steps,
        )
        return self.out_proj(spec.finish(core, conv_out)), conv_pool, ssm_pool, lanes
