"""Exact roll-back of a verify row's recurrent state, inside the step (speculative decoding).

A hybrid request's verify row (``RowPlan.num_draft = k``, its span its last known token and ``k``
drafted tokens) reads the request's slot and writes its spare slot (``state_slots``). The model
writes the state after the whole span there; once the step has sampled the token after each
verify point, :func:`keep_accepted` overwrites it, in every recurrent layer's conv and SSM pool,
with the state after the last accepted token, written from the layer's verify lanes
(``models/mixers/lanes.lane_state``).

Invariant (what ``Scheduler._commit_verify`` relies on): after the step, a verify row's slot holds
the state after ``span - k + a`` tokens of its span, where ``a`` is the number of leading drafted
tokens equal to the token the step sampled at the point before each (the greedy rule of
``scheduler/drafts.accepted_length``, uncut by stop tokens or ``max_tokens``). The host computes
the same ``a`` from the returned verify tokens, so it knows which state the slot holds without
reading it back. Kept from the lanes only where ``span - k + a`` is within the lanes' steps; the
scheduler plans hybrid verify rows with one known token (``span = k + 1``), so it always is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from radixflow_jax.models.batch import ModelCache
from radixflow_jax.models.mixers.lanes import VerifyLanes, lane_state
from radixflow_jax.runner.inputs import StepInputs


def accepted_counts(inputs: StepInputs, input_ids: jax.Array, verified: jax.Array, num_decode: int) -> jax.Array:
    """Per row ``[R]``, how many of its drafted tokens are accepted (0 for a row without drafts)."""
    drafts = inputs.verify_drafts
    num_points = inputs.verify_index.shape[0]
    steps = num_points // max(1, drafts.shape[0] - num_decode)
    first = jnp.cumsum(drafts) - drafts  # verify points are laid out in row order
    j = jnp.arange(steps, dtype=jnp.int32)
    point = jnp.clip(first[:, None] + j[None, :], 0, num_points - 1)
    after = jnp.clip(inputs.verify_index[point] + 1, 0, input_ids.shape[0] - 1)  # the drafted token it checks
    match = (j[None, :] < drafts[:, None]) & (verified[point] == input_ids[after])
    return jnp.sum(jnp.cumprod(match.astype(jnp.int32), axis=1), axis=1)


def accepted_steps(inputs: StepInputs, input_ids: jax.Array, verified: jax.Array, num_decode: int) -> jax.Array:
    """Per prefill row, the lane step whose state its slot must hold, or -1 to keep the state
    after its whole span (not a verify row, every drafted token accepted, or out of the lanes)."""
    drafts = inputs.verify_drafts
    steps = inputs.verify_index.shape[0] // max(1, drafts.shape[0] - num_decode)
    accepted = accepted_counts(inputs, input_ids, verified, num_decode)
    span = inputs.cu_seqlens[1:] - inputs.cu_seqlens[:-1]
    step = span - drafts + accepted - 1  # the state after span - k + a tokens
    keep = (drafts > 0) & (accepted < drafts) & (step >= 0) & (step < steps)
    return jnp.where(keep, step, -1)[num_decode:]


def keep_accepted(cache: ModelCache, lanes: tuple[VerifyLanes, ...], inputs: StepInputs, step: jax.Array,
                  num_decode: int) -> ModelCache:  # fmt: skip
    """``cache`` with each prefill row whose ``step`` is set holding its state after ``step + 1``
    tokens in its slot, in every recurrent layer (rows without write the sink slot 0). The written
    values come from the lanes, not from reads of the pools, so the pools stay in place."""
    at = jnp.maximum(step, 0)
    dst = jnp.where(step >= 0, inputs.state_slots[num_decode:], 0)
    states = [lane_state(lane, at) for lane in lanes]
    conv = tuple(p.at[dst].set(c.astype(p.dtype)) for p, (c, _) in zip(cache.conv, states))
    ssm = tuple(p.at[dst].set(s.astype(p.dtype)) for p, (_, s) in zip(cache.ssm, states))
    return cache._replace(conv=conv, ssm=ssm)
