"""MTP drafts inside the step (speculative method ``mtp``; ``models/mtp.py``).

A model loaded with its MTP layers drafts in every step, after the rows are sampled:

1. each token slot's *next* token: ``StepInputs.mtp_next`` where the host knows it (the row's next
   token, or the prompt token after a chunk), else the token the step sampled at that slot (a
   row's last slot; every slot of a verify row, whose accepted drafts equal those samples);
2. one MTP step over every slot, from the trunk's final-norm hidden states, writing the MTP
   layer's KV on the rows' pages (``ModelCache.mtp``);
3. each row's draft: the MTP guess at its last accepted slot (its last slot, or for a verify row
   the slot of its last known token plus the drafts accepted, ``runner/rollback.accepted_counts``),
   greedy.

Invariant: a row's draft guesses the token after the token the step sampled for it, so it is the
next round's first drafted token. A draft is a guess: where the MTP KV of a position was written
with another next token (a prefix hit's last cached position, a rider's shared last slot) the
guess may be worse, never the output (verification is exact).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from radixflow_jax.models.batch import Batch, ModelCache
from radixflow_jax.models.hybrid import HybridLM
from radixflow_jax.runner.inputs import StepInputs
from radixflow_jax.runner.rollback import accepted_counts


def mtp_drafts(
    model: HybridLM,
    hidden: jax.Array,
    input_ids: jax.Array,
    batch: Batch,
    cache: ModelCache,
    inputs: StepInputs,
    sampled: tuple[jax.Array, jax.Array],
    num_decode: int,
) -> tuple[ModelCache, jax.Array]:
    """``hidden [T, H]``: the trunk's output at every slot; ``sampled``: the rows' sampled tokens
    ``[R]`` and the verify points' ``[V]``. Returns the pools with the MTP KV written and each
    row's drafted token ``[R]`` (rows that sample nothing: a guess nobody reads)."""
    tokens, verified = sampled
    num_slots = hidden.shape[0]
    # only rows with tokens write their sample: padding rows and riders point at another row's slot
    span = inputs.cu_seqlens[1:] - inputs.cu_seqlens[:-1]
    rows_at = jnp.where(span > 0, inputs.logits_index, num_slots)
    at_slot = jnp.zeros((num_slots,), jnp.int32).at[rows_at].set(tokens.astype(jnp.int32), mode="drop")
    last = inputs.logits_index
    if verified.shape[0]:
        real = jnp.arange(verified.shape[0]) < jnp.sum(inputs.verify_drafts)  # padding points sit at slot 0
        points_at = jnp.where(real, inputs.verify_index, num_slots)
        at_slot = at_slot.at[points_at].set(verified.astype(jnp.int32), mode="drop")
        accepted = accepted_counts(inputs, input_ids, verified, num_decode)
        last = last - inputs.verify_drafts + accepted  # the slot of the last accepted token
    next_tokens = jnp.where(inputs.mtp_next >= 0, inputs.mtp_next, at_slot)
    m, kv = model.mtp_step(next_tokens, hidden, batch, cache.mtp[0], num_decode=num_decode)
    cache = cache._replace(mtp=(kv, *cache.mtp[1:]))
    guesses = jnp.argmax(model.logits(m[last]), axis=-1).astype(jnp.int32)
    return cache, guesses
