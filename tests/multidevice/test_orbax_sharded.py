"""orbax restore straight into the sharded layout: ``load_sharded`` on a ``radixflow convert``
directory gives every parameter its target ``NamedSharding`` on arrival, with the same values and
layout as loading on one device and sharding afterwards (Qwen3.5's re-striped ``in_proj_qkv`` and
conv weight included). Parameters only: no step compiles here."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

from radixflow_jax.models import weights
from radixflow_jax.models.api import convert, load
from radixflow_jax.models.sharding import ShardedModel, load_sharded, param_spec, restriped, shard_model


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> str:
    return convert("tiny-qwen3.5", str(tmp_path_factory.mktemp("orbax") / "tiny"))


def test_restore_arrives_sharded_and_equals_load_then_shard(converted: str, monkeypatch) -> None:
    arrived = {}
    real = weights.load_orbax_state

    def spy(*args, **kwargs):  # the restored arrays, before ShardedModel re-stripes anything
        graphdef, state = real(*args, **kwargs)
        arrived.update({p: x for p, x in jax.tree_util.tree_leaves_with_path(state)})
        return graphdef, state

    monkeypatch.setattr(weights, "load_orbax_state", spy)
    direct = load_sharded(converted, "float32", 2, first_device=2)
    assert isinstance(direct, ShardedModel)
    cfg = direct.config
    assert arrived, "the orbax path was not taken"
    split = 0
    for path, x in arrived.items():
        assert isinstance(x.sharding, NamedSharding) and sorted(d.id for d in x.devices()) == [2, 3]
        spec = param_spec(cfg, path, x.ndim, 2)
        if restriped(cfg, path):
            assert x.sharding.is_fully_replicated
        else:
            assert x.sharding.spec == spec, path
            split += not x.sharding.is_fully_replicated
    assert split > 10  # most weights arrived split over the two devices
    via_one = shard_model(load(converted), 2, first_device=2)
    got = jax.tree_util.tree_leaves_with_path(direct.params)
    want = dict(jax.tree_util.tree_leaves_with_path(via_one.params))
    assert len(got) == len(want)
    for path, x in got:
        y = want[path]
        assert x.sharding == y.sharding, path
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
