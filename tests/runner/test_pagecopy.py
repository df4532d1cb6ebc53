"""The page and state copies (``runner/pagecopy.py``) against numpy: destination pages take the
source pages of every attention layer's K and V, destination slots the source slots of every
recurrent layer's conv and SSM pools; padding pairs ``(0, 0)`` and everything else stay unchanged;
more pairs than the width run in several calls; a model without such layers has nothing to copy."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax.models.batch import ModelCache
from radixflow_jax.runner.pagecopy import PageCopier, StateCopier


def _cache(rng: np.random.Generator, layers: int) -> ModelCache:
    kv = tuple((jnp.asarray(rng.standard_normal((6, 4, 2, 3)), jnp.float32),
                jnp.asarray(rng.standard_normal((6, 4, 2, 3)), jnp.float32)) for _ in range(layers))  # fmt: skip
    return ModelCache(kv=kv, conv=(jnp.ones((3, 2, 5)),), ssm=(jnp.ones((3, 4)),))


def test_pages_are_copied_in_every_layer_and_nothing_else_changes() -> None:
    rng = np.random.default_rng(0)
    cache = _cache(rng, 2)
    before = [(np.asarray(k), np.asarray(v)) for k, v in cache.kv]
    copier = PageCopier(4)
    out = copier(cache, [(2, 5), (3, 1)])
    for (k0, v0), (k, v) in zip(before, out.kv):
        want_k, want_v = k0.copy(), v0.copy()
        want_k[[5, 1]], want_v[[5, 1]] = k0[[2, 3]], v0[[2, 3]]
        np.testing.assert_array_equal(np.asarray(k), want_k)
        np.testing.assert_array_equal(np.asarray(v), want_v)
    np.testing.assert_array_equal(np.asarray(out.conv[0]), 1.0)  # recurrent state is not touched
    kept = [np.asarray(k).copy() for k, _ in out.kv]  # ``out`` is donated to the next call
    again = copier(out, [])  # a round without copies: the sink copied onto itself, nothing else
    for k, (k2, _) in zip(kept, again.kv):
        np.testing.assert_array_equal(k, np.asarray(k2))


def test_more_copies_than_the_width_and_no_attention() -> None:
    copier = PageCopier(1)
    cache = _cache(np.random.default_rng(1), 1)
    k0 = np.asarray(cache.kv[0][0]).copy()
    out = copier(cache, [(1, 2), (3, 4)])  # two calls of one pair
    want = k0.copy()
    want[[2, 4]] = k0[[1, 3]]
    np.testing.assert_array_equal(np.asarray(out.kv[0][0]), want)
    bare = ModelCache(kv=(), conv=(jnp.ones((3, 2, 5)),), ssm=(jnp.ones((3, 4)),))
    assert copier(bare, [(1, 2)]) is bare
    with pytest.raises(ValueError, match="width"):
        PageCopier(0)


def test_states_are_copied_in_every_recurrent_pool_and_nothing_else_changes() -> None:
    rng = np.random.default_rng(2)
    conv = tuple(jnp.asarray(rng.standard_normal((7, 2, 5)), jnp.float32) for _ in range(2))
    ssm = tuple(jnp.asarray(rng.standard_normal((7, 3, 4, 4)), jnp.float32) for _ in range(2))
    cache = _cache(rng, 1)._replace(conv=conv, ssm=ssm)
    before = [np.asarray(x).copy() for x in conv + ssm]
    kv = np.asarray(cache.kv[0][0]).copy()
    out = StateCopier(2)(cache, [(1, 6), (2, 5), (3, 4)])  # two calls: 2 pairs, then 1
    for b, a in zip(before, out.conv + out.ssm):
        want = b.copy()
        want[[6, 5, 4]] = b[[1, 2, 3]]
        np.testing.assert_array_equal(np.asarray(a), want)
    np.testing.assert_array_equal(np.asarray(out.kv[0][0]), kv)  # pages are not touched
    bare = ModelCache(kv=out.kv, conv=(), ssm=())
    assert StateCopier(2)(bare, [(1, 2)]) is bare
