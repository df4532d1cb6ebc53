"""Verify lanes (``models/mixers/lanes.py``): a prefill row's recurrent state after each of its
first tokens (:func:`lane_state` over the lanes' rank-one terms), for the step to keep a verify
row's state at its last accepted token. Oracle: the state a call over just those tokens of the row
writes to its slot (the chunked scan), for both recurrent mixers, across a chunk boundary; rows
start from their slot's state, as a verify row does."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from radixflow_jax.models.batch import Batch
from radixflow_jax.models.mixers.lanes import lane_state
from tests.models.test_decode_window import HIDDEN, _mixer, _pools


def _call(mixer, x, spans, slots, lane_steps=0):
    cu = np.concatenate([[0], np.cumsum(spans)]).astype(np.int32)
    rows = len(spans)
    batch = Batch(
        cu_seqlens=jnp.asarray(cu), kv_lens=jnp.asarray(np.asarray(spans) + 5, jnp.int32),
        page_table=jnp.ones((rows, 4), jnp.int32), slot_mapping=jnp.zeros(int(cu[-1]), jnp.int32),
        state_slots=jnp.asarray(slots, jnp.int32), source_slots=jnp.asarray(slots, jnp.int32),
        fresh=jnp.zeros(rows, bool),
    )  # fmt: skip
    conv, ssm = _pools(mixer)
    fn = nnx.jit(lambda m, x, b, c, s: m(x, b, c, s, 0, None, lane_steps))
    _, conv, ssm, lanes = fn(mixer, x, batch, conv, ssm)
    return np.asarray(conv), np.asarray(ssm), lanes


@pytest.mark.parametrize("kind", ["gdn", "mamba2"])
def test_lanes_hold_each_prefix_state(kind: str) -> None:
    mixer = _mixer(kind)  # chunk size 4: the 6-token row's lanes cross a chunk boundary
    spans, slots, steps = [6, 3, 2], [3, 5, 7], 5
    x = jnp.asarray(np.random.default_rng(3).normal(size=(sum(spans), HIDDEN)).astype(np.float32))
    _, _, lanes = _call(mixer, x, spans, slots, lane_steps=steps)
    assert lanes.conv.shape[:2] == (steps, 3) and lanes.left.shape[:2] == (3, steps)
    starts = np.concatenate([[0], np.cumsum(spans)])
    for s in range(steps):  # the state after s + 1 tokens of row 0, s of row 1, s - 1 of row 2 (within spans)
        at = [min(max(s - r, 0), span - 1) for r, span in enumerate(spans)]
        conv_at, ssm_at = (np.asarray(a) for a in lane_state(lanes, jnp.asarray(at, jnp.int32)))
        for r, (step, slot) in enumerate(zip(at, slots)):
            conv, ssm, _ = _call(mixer, x[starts[r] : starts[r] + step + 1], [step + 1], [slot])
            np.testing.assert_allclose(ssm_at[r], ssm[slot], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(conv_at[r], conv[slot], rtol=1e-5, atol=1e-6)


def test_no_lanes_without_steps() -> None:
    mixer = _mixer("gdn")
    x = jnp.zeros((3, HIDDEN), jnp.float32)
    assert _call(mixer, x, [3], [2])[2] is None
