"""On-device sampling for a batch of rows: greedy, temperature, top-k, top-p, min-p, per-request seed;
presence / frequency / repetition penalties; log-probabilities of the sampled and the top tokens.

Row ``r`` draws from ``fold_in(key(seed[r]), position[r])``: the stream depends only on the
request's seed and the token position, so outputs do not depend on batching or round boundaries.
``temperature == 0`` means greedy (argmax), exactly.

Penalties (vLLM's / OpenAI's definitions) read a row's context from ``ctx_ids [R, W]`` (-1 = empty)
with ``ctx_out [R, W]`` marking generated tokens: repetition divides positive logits and multiplies
negative ones of every token seen in the prompt or the output; frequency subtracts
``count_in_output * f``; presence subtracts ``p`` once for a token present in the output. Neutral
values (1, 0, 0) leave a row's logits bit-identical.

Logit bias (``apply_bias``): each row carries up to ``B`` entries ``(token id, value, until)``; an
entry adds ``value`` to its token's logit while the row's sampled ``position`` is below ``until``
(``-inf`` values are min_tokens bans of the stop tokens). A round where no entry is active leaves
every logit bit-identical and skips the scatter.

Grammar mask (``apply_mask``, structured outputs): ``mask [R, ceil(V/32)]`` int32, bit ``v % 32`` of
word ``v // 32`` set when token ``v`` is allowed; a row without a grammar is all ones (-1). Disallowed
logits become ``-inf``. A round where every row is all ones leaves the logits bit-identical and
skips the unpacking.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _filter(logits: jax.Array, top_k: jax.Array, top_p: jax.Array, min_p: jax.Array) -> jax.Array:
    """Masks (to -inf) what top-k, top-p and min-p exclude; one row ``[V]``."""
    vocab = logits.shape[-1]
    order = jnp.sort(logits)[::-1]
    kth = jnp.where(top_k > 0, order[jnp.clip(top_k - 1, 0, vocab - 1)], -jnp.inf)
    probs = jax.nn.softmax(order)
    before = jnp.cumsum(probs) - probs  # mass strictly above each sorted entry
    # smallest logit still inside top-p; top_p >= 1 is off (float32 cumsums saturate at 1 on peaked
    # rows, which would otherwise drop the tail)
    cutoff = jnp.where(top_p >= 1.0, -jnp.inf, jnp.min(jnp.where(before < top_p, order, jnp.inf)))
    floor = jnp.log(jnp.maximum(min_p, 1e-30)) + order[0]  # p >= min_p * p_max  <=>  logit >= log(min_p) + max
    keep = (logits >= kth) & (logits >= cutoff) & ((min_p <= 0) | (logits >= floor))
    return jnp.where(keep, logits, -jnp.inf)


def sample(
    logits: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    min_p: jax.Array,
    seed: jax.Array,
    position: jax.Array,
) -> jax.Array:
    """``logits [R, V]`` float32 -> int32 tokens ``[R]``. A round whose rows are all greedy skips
    the filters and draws (a sort of every row, the slowest part on a CPU) at run time."""
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def sampled() -> jax.Array:
        scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
        masked = jax.vmap(_filter)(scaled, top_k, top_p, min_p)

        def draw(row_logits: jax.Array, s: jax.Array, pos: jax.Array) -> jax.Array:
            key = jax.random.fold_in(jax.random.key(s), pos)
            return jax.random.categorical(key, row_logits).astype(jnp.int32)

        drawn = jax.vmap(draw)(masked, seed, position)
        return jnp.where(temperature > 0, drawn, greedy)

    return jax.lax.cond(jnp.any(temperature > 0), sampled, lambda: greedy)


def penalised_rows(presence: jax.Array, frequency: jax.Array, repetition: jax.Array) -> jax.Array:
    """``bool [R]``: the rows with any penalty set."""
    return (presence != 0) | (frequency != 0) | (repetition != 1.0)


def apply_penalties(
    logits: jax.Array,
    ctx_ids: jax.Array,
    ctx_out: jax.Array,
    presence: jax.Array,
    frequency: jax.Array,
    repetition: jax.Array,
) -> jax.Array:
    """``logits [R, V]`` float32 with the penalties of each row applied (see the module docstring)."""
    penalised = penalised_rows(presence, frequency, repetition)
    return jax.lax.cond(
        jnp.any(penalised),
        lambda: _penalise(logits, ctx_ids, ctx_out, presence, frequency, repetition, penalised),
        lambda: logits,
    )


def _penalise(
    logits: jax.Array, ctx_ids: jax.Array, ctx_out: jax.Array, presence: jax.Array, frequency: jax.Array,
    repetition: jax.Array, penalised: jax.Array,
) -> jax.Array:
    """The penalties themselves; run only in rounds where some row is penalised."""
    rows, vocab = logits.shape
    valid = ctx_ids >= 0
    ids = jnp.where(valid, ctx_ids, vocab)  # out of range: dropped by the scatters
    row = jnp.broadcast_to(jnp.arange(rows)[:, None], ids.shape)
    counts = jnp.zeros((rows, vocab), jnp.float32).at[row, ids].add(ctx_out.astype(jnp.float32), mode="drop")
    seen = jnp.zeros((rows, vocab), jnp.bool_).at[row, ids].max(valid, mode="drop")
    rep = repetition[:, None]
    repeated = jnp.where(logits > 0, logits / rep, logits * rep)
    out = jnp.where(seen & (rep != 1.0), repeated, logits)
    out = out - frequency[:, None] * counts - presence[:, None] * (counts > 0)
    return jnp.where(penalised[:, None], out, logits)


def apply_bias(
    logits: jax.Array, ids: jax.Array, values: jax.Array, until: jax.Array, position: jax.Array
) -> jax.Array:
    """``logits [R, V]`` plus each row's active bias entries (``ids / values / until [R, B]``, id -1 = empty)."""
    active = (ids >= 0) & (position[:, None] < until)

    def biased() -> jax.Array:
        rows, vocab = logits.shape
        safe = jnp.where(active, ids, vocab)  # out of range: dropped by the scatter
        row = jnp.broadcast_to(jnp.arange(rows)[:, None], ids.shape)
        return logits.at[row, safe].add(jnp.where(active, values, 0.0), mode="drop")

    return jax.lax.cond(jnp.any(active), biased, lambda: logits)


def apply_mask(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """``logits [R, V]`` with the tokens each row's grammar ``mask [R, ceil(V/32)]`` forbids at ``-inf``."""

    def masked() -> jax.Array:
        v = jnp.arange(logits.shape[-1], dtype=jnp.int32)
        bits = (mask[:, v >> 5] >> (v & 31)[None, :]) & 1
        return jnp.where(bits != 0, logits, -jnp.inf)

    return jax.lax.cond(jnp.any(mask != -1), masked, lambda: logits)


def token_logprobs(logits: jax.Array, tokens: jax.Array, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Log-softmax of ``logits [R, V]``: ``(logprob of tokens[r] [R], top-k ids [R, k], their logprobs [R, k])``."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    chosen = jnp.take_along_axis(logp, tokens[:, None].astype(jnp.int32), axis=-1)[:, 0]
    top_lp, top_ids = jax.lax.top_k(logp, k)
    return chosen, top_ids.astype(jnp.int32), top_lp

