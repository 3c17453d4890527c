"""Shared by the cascade tests: a small :class:`scorelib.nets.Cascade` with every parameter
random (its zero-initialised output layers would make module 2 the identity), and the exact
Tweedie pair of Gaussian data."""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from scorelib.nets import Cascade
from scorelib.processes import EDM

#: The two LocalMLPs' fields: small, both sides of ``sigma_local = 0.3`` exercised.
SMALL = dict(sigma_local=0.3, radius=1, local_width=8, local_depth=1, width=16, depth=1, emb_dim=8)


def random_cascade(sigma_data=0.5, blend="snr", scale=0.3, seed=1):
    """``(graphdef, params)`` of a ``[4, 4, 1]`` cascade, params ``scale N(0, 1)``."""
    net = Cascade((4, 4, 1), sigma_data=sigma_data, blend=blend, **SMALL, rngs=nnx.Rngs(0))
    g, p = nnx.split(net, nnx.Param)
    leaves, tree = jax.tree.flatten(p)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noise = [
        scale * jax.random.normal(k, v.shape, v.dtype) for k, v in zip(keys, leaves, strict=True)
    ]
    return g, jax.tree.unflatten(tree, noise)


@dataclasses.dataclass
class ExactPair:
    """Tweedie's ``E[x0 | x_t]`` of ``N(0, s^2 I)`` under EDM in both modules, module 2 offset
    by ``b`` (an object with ``cascade_denoisers``)."""

    s: float
    b: float = 0.0
    process: EDM = dataclasses.field(default_factory=EDM)

    def cascade_denoisers(self, x, t):
        sigma = jnp.reshape(t, (-1,) + (1,) * (x.ndim - 1))
        d = self.s**2 / (self.s**2 + sigma**2) * x
        return d, d + self.b
