"""The smoothed closed-form score (sigma-CFDM): the training-set score averaged over input
perturbations.

Scarvelis, Saez de Ocariz Borde and Solomon, "Closed-form diffusion models" (arXiv
2310.12395, TMLR 2025), Sec. 4: the exact score of a training set only reproduces training
points; averaging it over Gaussian perturbations of its input,

    s_sigma(x, t) = E_eps[ score(x + sigma_s eps, t) ],

gives a training-free model whose samples are barycentres of at most ``M`` training points
when the ``M`` Monte-Carlo draws ``eps_1..eps_M`` are held fixed along a trajectory (their
Thm. 1). As in the paper's algorithm (and every port of it) the average is taken over the
posterior mean only, the ``x`` of Tweedie's formula is not perturbed:

    D_sigma(x, t) = (1/M) sum_m D(x + sigma_s eps_m, t),
    s_sigma(x, t) = (alpha(t) D_sigma(x, t) - x) / sigma(t)^2.

The perturbation is in process coordinates (for :class:`~scorelib.processes.rectified.
RectifiedFlow`, the flow state ``x_s`` of the paper). The posterior means come from an
*estimator*: the exact streamed softmax (:class:`~scorelib.scores.empirical.EmpiricalScore`)
or the nearest-neighbour estimator (:class:`~scorelib.scores.neighbours.NeighbourScore`).

Draws. The source holds one key per example of the batch it will be called on
(:meth:`SmoothedScore.for_examples`, by :func:`scorelib.keys.example_keys`): example ``b``
draws ``eps_m = normal(fold_in(fold_in(k_b, 0), m))``, the same at every step (``redraw =
False``, the paper), or ``normal(fold_in(fold_in(fold_in(k_b, 0), bits(t_b)), m))``, new
at every time (``redraw = True``, a different estimator: an unbiased estimate of
``s_sigma`` at each step, as in the JAX port). The estimator's own draws (the uniform
points of the nearest-neighbour estimator) use ``fold_in(key_bm, bits(t_b))`` with
``key_bm`` the key of ``eps_m``: new at every time, as in the paper's algorithm. A sample
therefore depends on its key and global index only, never on its batch.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from scorelib._checks import check_int, check_real, require
from scorelib.keys import example_keys
from scorelib.processes.base import broadcast_to_data
from scorelib.scores.base import ScoreSource, check_query, flatten

Array = Any


def time_bits(t: Array, batch: int) -> Array:
    """``[batch]`` uint32: the float32 bit pattern of each example's time (a key salt)."""
    t = jnp.broadcast_to(jnp.asarray(t, jnp.float32), (batch,))
    return jax.lax.bitcast_convert_type(t, jnp.uint32)


def perturbation_keys(keys: jax.Array, t: Array, M: int, redraw: bool) -> jax.Array:
    """``[batch, M]`` keys of the smoothing draws (module docstring, "Draws")."""
    base = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, 0)
    if redraw:
        base = jax.vmap(jax.random.fold_in)(base, time_bits(t, keys.shape[0]))
    return jax.vmap(lambda k: jax.vmap(lambda m: jax.random.fold_in(k, m))(jnp.arange(M)))(base)


class SmoothedScore(ScoreSource):
    """``s_sigma`` of a training set: the posterior mean averaged over ``M`` perturbations.

    Fields:
      estimator: the posterior-mean estimator (``EmpiricalScore`` or ``NeighbourScore``),
        with the same process.
      keys: ``[batch]`` per-example keys, or ``None`` until :meth:`for_examples`.
      sigma_s: the smoothing scale (data units, process coordinates; a scalar leaf).
      M: Monte-Carlo draws per query (static).
      redraw: new draws at every time instead of one set per trajectory (static).
    """

    estimator: Any = None
    keys: Array = None
    sigma_s: Array = 0.0  # a leaf: a sweep over sigma_s compiles once
    M: int = struct.field(pytree_node=False, default=1)
    redraw: bool = struct.field(pytree_node=False, default=False)

    @classmethod
    def create(cls, estimator, *, sigma_s: float, M: int, redraw: bool = False) -> SmoothedScore:
        """Wrap a posterior-mean estimator (its ``process`` becomes this source's).

        Args:
          estimator: an ``EmpiricalScore`` or ``NeighbourScore``.
          sigma_s: ``>= 0`` (0: the exact score of the estimator, whatever ``M``).
          M: ``>= 1``.
          redraw: see the module docstring.

        Raises:
          ValueError: naming ``score.sigma_s``, ``score.M`` or ``score.redraw``.
        """
        sigma_s = check_real(sigma_s, "score.sigma_s", low=0.0)
        M = check_int(M, "score.M", low=1)
        require(isinstance(redraw, bool), "score.redraw", "a bool", redraw)
        return cls(
            process=estimator.process, estimator=estimator, sigma_s=sigma_s, M=M, redraw=redraw
        )

    @property
    def data_shape(self) -> tuple:
        """The shape of one training point."""
        return self.estimator.data_shape

    def expected_data_shape(self) -> tuple[tuple, Any]:
        """The estimator's: queries are ``[batch, *data_shape]`` like its training set."""
        return self.estimator.expected_data_shape()

    def for_examples(self, key: jax.Array, batch: int, first_index: Array = 0) -> SmoothedScore:
        """A copy that draws for examples ``first_index .. first_index + batch - 1`` of ``key``.

        Raises:
          ValueError: if ``batch < 1``.
        """
        return self.replace(keys=example_keys(key, batch, first_index))

    def denoiser(self, x, t):
        """``(1/M) sum_m D(x + sigma_s eps_m, t)``; shape of ``x`` (data units).

        ``x: [batch, *data_shape]`` in process coordinates, ``t`` a scalar or ``[batch]``.

        Raises:
          ValueError: if the source has no keys or keys for another batch size, naming
            ``x`` (its shape and the training set's) unless it is ``[batch, *data_shape]``,
            or ``t`` unless it is a scalar or ``[batch]``.
        """
        check_query(self, x, t)
        xf = flatten(x)
        b, d = xf.shape
        require(
            self.keys is not None and self.keys.shape[0] == b,
            "SmoothedScore.keys",
            f"one key per example of the batch ({b}); call for_examples(key, {b}, first_index)",
            None if self.keys is None else f"{self.keys.shape[0]} keys",
        )
        pk = perturbation_keys(self.keys, t, self.M, self.redraw)  # [b, M]
        eps = jax.vmap(jax.vmap(lambda k: jax.random.normal(k, (d,), xf.dtype)))(pk)
        xp = (xf[:, None, :] + self.sigma_s * eps).reshape(b * self.M, d)
        a = broadcast_to_data(self.process.alpha(t), xf)
        s = broadcast_to_data(self.process.ve_sigma(t), xf)
        rep = lambda v: jnp.repeat(v, self.M, axis=0) if jnp.ndim(v) else v  # noqa: E731
        y = xp / rep(a)
        # the estimator's own draws (the NN estimator's uniform points): new at every time
        est_keys = jax.vmap(jax.random.fold_in)(pk.reshape(-1), time_bits(t, b).repeat(self.M))
        mean = self.estimator.posterior_mean(y, rep(s), est_keys)
        return jnp.reshape(jnp.mean(mean.reshape(b, self.M, d), axis=1), x.shape)
