"""Small vector fields with known Jacobians, as score sources: a linear field ``A x``, a
non-conservative two-layer net and a gradient field ``grad phi`` (shared by the tests of the
Jacobian asymmetry, the QCSBM penalty and its metric)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from scorelib.processes import EDM
from scorelib.scores import ScoreSource


class LinearField(ScoreSource):
    """``s(x, t) = A x`` on flattened examples (time-independent); ``J = A``."""

    A: jnp.ndarray = None

    def score(self, x, t):
        xf = jnp.reshape(x, (x.shape[0], -1))
        return jnp.reshape(xf @ self.A.T, x.shape)


class TinyNet(ScoreSource):
    """A non-conservative two-layer field ``W2 tanh(W1 x + b1 + t c)``."""

    W1: jnp.ndarray = None
    b1: jnp.ndarray = None
    c: jnp.ndarray = None
    W2: jnp.ndarray = None

    def score(self, x, t):
        xf = jnp.reshape(x, (x.shape[0], -1))
        tb = jnp.broadcast_to(jnp.asarray(t, xf.dtype), (x.shape[0],))[:, None]
        return jnp.reshape(jnp.tanh(xf @ self.W1.T + self.b1 + tb * self.c) @ self.W2.T, x.shape)


class GradientNet(ScoreSource):
    """``s = grad_x phi(x, t)`` of a scalar net: a gradient field (symmetric Jacobian)."""

    W: jnp.ndarray = None
    v: jnp.ndarray = None

    def score(self, x, t):
        def phi(z, tb):
            return jnp.sum(self.v * jnp.tanh(self.W @ z + tb)) - 0.1 * jnp.sum(z**4)

        xf = jnp.reshape(x, (x.shape[0], -1))
        tb = jnp.broadcast_to(jnp.asarray(t, xf.dtype), (x.shape[0],))
        return jnp.reshape(jax.vmap(jax.grad(phi))(xf, tb), x.shape)


def tiny_net(seed: int = 0, d: int = 5, h: int = 7, process=None, scale: float = 0.6) -> TinyNet:
    """A :class:`TinyNet` ``R^d -> R^d`` with ``h`` hidden units and N(0, scale^2) weights."""
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.normal(size=s) * scale, jnp.float32)  # noqa: E731
    return TinyNet(process=process or EDM(), W1=f(h, d), b1=f(h), c=f(h), W2=f(d, h))


def random_matrix(seed: int, d: int, k_scale: float = 1.0) -> np.ndarray:
    """``S + k_scale K``: a random symmetric part plus a scaled antisymmetric part."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(d, d))
    k = rng.normal(size=(d, d))
    return (s + s.T) / 2 + k_scale * (k - k.T) / 2
