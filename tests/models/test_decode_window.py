"""The decode window (``models/mixers/recurrent.DecodeWindow``): decode rows read and write their
states as one contiguous window of slots. Oracle: the same token run as a one-token *prefill* row
(the chunked scan, whose states are gathered by slot), for both recurrent mixers. Window positions
without a decode row must leave their slot as it was (a checkpoint, a free slot) or, in a mixed
round, hold the prefill row that owns that slot."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from radixflow_jax.models.batch import Batch
from radixflow_jax.models.config import GdnConfig, MambaConfig
from radixflow_jax.models.mixers.gdn import GatedDeltaNet
from radixflow_jax.models.mixers.mamba2 import Mamba2
from radixflow_jax.models.mixers.recurrent import Emits

HIDDEN, SLOTS, PAGE = 32, 10, 4


def _mixer(kind: str) -> nnx.Module:
    rngs = nnx.Rngs(0)
    if kind == "gdn":
        cfg = GdnConfig(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8, conv_kernel=4, packed=False,
                        chunk_size=4)  # fmt: skip
        return GatedDeltaNet(cfg, HIDDEN, 1e-6, dtype=jnp.float32, rngs=rngs)
    cfg = MambaConfig(num_heads=4, head_dim=8, state_size=8, n_groups=2, conv_kernel=4, conv_bias=True, proj_bias=False,
                      chunk_size=4, dt_limit=(0.0, float("inf")), norm_eps=1e-6)  # fmt: skip
    return Mamba2(cfg, HIDDEN, dtype=jnp.float32, rngs=rngs)


def _pools(mixer: nnx.Module) -> tuple[jax.Array, jax.Array]:
    cfg = mixer.cfg
    rng = np.random.default_rng(1)
    conv = rng.normal(size=(SLOTS, cfg.conv_kernel - 1, cfg.conv_dim)).astype(np.float32)
    if isinstance(cfg, GdnConfig):
        ssm = rng.normal(size=(SLOTS, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim)) * 0.1
    else:
        ssm = rng.normal(size=(SLOTS, cfg.num_heads, cfg.head_dim, cfg.state_size)) * 0.1
    return jnp.asarray(conv), jnp.asarray(ssm.astype(np.float32))


def _run(mixer, x, spans, slots, num_decode, base, emits=None, sources=None):
    """One call over rows of ``spans`` tokens (the first ``num_decode`` in the decode region)."""
    cu = np.concatenate([[0], np.cumsum(spans)]).astype(np.int32)
    rows = len(spans)
    batch = Batch(
        cu_seqlens=jnp.asarray(cu), kv_lens=jnp.asarray(np.asarray(spans) + 5, jnp.int32),
        page_table=jnp.ones((rows, 4), jnp.int32), slot_mapping=jnp.zeros(int(cu[-1]), jnp.int32),
        state_slots=jnp.asarray(slots, jnp.int32),
        source_slots=jnp.asarray(slots if sources is None else sources, jnp.int32),
        fresh=jnp.zeros(rows, bool), decode_base=jnp.asarray(base, jnp.int32),
    )  # fmt: skip
    conv, ssm = _pools(mixer)
    if emits is not None:
        emits = Emits(*(jnp.asarray(e, jnp.int32) for e in emits))
    fn = nnx.jit(lambda m, x, b, c, s, e: m(x, b, c, s, num_decode, e))
    out, conv, ssm, _ = fn(mixer, x, batch, conv, ssm, emits)
    return np.asarray(out), np.asarray(conv), np.asarray(ssm)


@pytest.mark.parametrize("kind", ["gdn", "mamba2"])
def test_decode_window_equals_prefill_rows_and_keeps_other_slots(kind: str) -> None:
    mixer = _mixer(kind)
    x = jnp.asarray(np.random.default_rng(2).normal(size=(7, HIDDEN)).astype(np.float32))
    conv0, ssm0 = (np.asarray(p) for p in _pools(mixer))
    # decode region of 4 rows from slot 3: real rows at window positions 0 and 2 (slots 3, 5);
    # position 1 (slot 4) belongs to the prefill row of 3 tokens, position 3 (slot 6) is a checkpoint
    # that must stay as it was; the decode row of slot 5 emits after its token into slot 8
    spans, slots = [1, 1, 1, 1, 3], [3, 0, 5, 0, 4]
    xs = jnp.concatenate([x[:1], x[1:2] * 0, x[2:3], x[3:4] * 0, x[4:7]])
    emits = ([2, 0], [1, 0], [8, 0])
    out, conv, ssm = _run(mixer, xs, spans, slots, 4, 3, emits)
    # oracle: the same rows, every one in the prefill region (states gathered by slot)
    ref_out, ref_conv, ref_ssm = _run(mixer, jnp.concatenate([x[:1], x[2:3], x[4:7]]), [1, 1, 3], [3, 5, 4], 0, 0)
    np.testing.assert_allclose(out[[0, 2, 4, 5, 6]], ref_out, atol=1e-5)
    for slot in (3, 4, 5):
        np.testing.assert_allclose(conv[slot], ref_conv[slot], atol=1e-5)
        np.testing.assert_allclose(ssm[slot], ref_ssm[slot], atol=1e-5)
    np.testing.assert_array_equal(ssm[6], ssm0[6])  # the checkpoint under a padding position
    np.testing.assert_array_equal(conv[6], conv0[6])
    for slot in (1, 2, 7, 9):  # outside the window, never named
        np.testing.assert_array_equal(ssm[slot], ssm0[slot])
    np.testing.assert_allclose(ssm[8], ref_ssm[5], atol=1e-5)  # the decode row's emit
    np.testing.assert_allclose(conv[8], ref_conv[5], atol=1e-5)
    # a decode-only round (the window written in place): same states for the decode rows,
    # the prefill row's slot 4 (now a padding position) unchanged
    out, conv, ssm = _run(mixer, xs[:4], [1, 1, 1, 1], [3, 0, 5, 0], 4, 3, emits)
    np.testing.assert_allclose(out[[0, 2]], ref_out[:2], atol=1e-5)
    for slot in (3, 5):
        np.testing.assert_allclose(ssm[slot], ref_ssm[slot], atol=1e-5)
        np.testing.assert_allclose(conv[slot], ref_conv[slot], atol=1e-5)
    for slot in (4, 6):
        np.testing.assert_array_equal(ssm[slot], ssm0[slot])
        np.testing.assert_array_equal(conv[slot], conv0[slot])
    np.testing.assert_allclose(ssm[8], ref_ssm[5], atol=1e-5)


def test_a_call_with_decode_rows_needs_the_window_base() -> None:
    mixer = _mixer("gdn")
    conv, ssm = _pools(mixer)
    batch = Batch(jnp.asarray([0, 1], jnp.int32), jnp.asarray([3], jnp.int32), jnp.ones((1, 4), jnp.int32),
                  jnp.zeros(1, jnp.int32), jnp.asarray([2], jnp.int32))  # fmt: skip
    with pytest.raises(ValueError, match="decode_base"):
        mixer(jnp.zeros((1, HIDDEN)), batch, conv, ssm, 1)
