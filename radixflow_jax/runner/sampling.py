"""On-device sampling for a batch of rows: greedy, temperature, top-k, top-p, min-p, per-request seed.

Row ``r`` draws from ``fold_in(key(seed[r]), position[r])``: the stream depends only on the
request's seed and the token position, so outputs do not depend on batching or round boundaries.
``temperature == 0`` means greedy (argmax), exactly.
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
