"""``clip_groups`` (``make_optimizer``'s clip): each named top-level entry of the gradient is
clipped by its own norm, equal to ``optax.clip_by_global_norm`` applied to that entry alone,
so scaling one entry's gradient leaves the other's clipped gradient unchanged, where the
global clip couples them."""

import jax.numpy as jnp
import numpy as np
import optax

from scorelib.training.optim import clip_transform, make_optimizer


def clipped(tx, grads):
    return tx.update(grads, tx.init(grads))[0]


def test_each_group_is_clipped_alone():
    grads = {
        "first": {"w": jnp.asarray([3.0, 4.0, 0.0])},
        "second": {"w": jnp.asarray([0.1, 0.2]), "b": jnp.asarray([0.05])},
    }
    big = {**grads, "second": {"w": jnp.asarray([300.0, 0.0]), "b": jnp.asarray([400.0])}}
    groups = ("first", "second")
    alone = optax.clip_by_global_norm(1.0)
    for g in (grads, big):
        got = clipped(clip_transform(1.0, groups), g)
        for name in groups:
            want = clipped(alone, g[name])
            for k in want:
                np.testing.assert_allclose(got[name][k], want[k], rtol=1e-6)
    a, b = clipped(clip_transform(1.0, groups), grads), clipped(clip_transform(1.0, groups), big)
    np.testing.assert_array_equal(a["first"]["w"], b["first"]["w"])  # [0.6, 0.8, 0]
    c, d = clipped(clip_transform(1.0), grads), clipped(clip_transform(1.0), big)
    assert not np.allclose(c["first"]["w"], d["first"]["w"])  # one global norm couples them
    # make_optimizer runs it before Adam
    tx = make_optimizer(1e-3, 0, 1.0, clip_groups=groups)
    assert tx.update(big, tx.init(big), big)[0]["second"]["b"].shape == (1,)
