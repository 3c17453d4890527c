"""A trained network behind EDM preconditioning, as a score source for any process.

For a process with ``alpha != 1`` the network works in the VE frame
``x / alpha(t)`` at noise level ``ve_sigma(t) = sigma(t) / alpha(t)`` (Karras et
al. 2022, Sec. 4 and eq. 4); since ``E[x_0 | x_t] = E[x_0 | x_t / alpha]`` the
denoiser output needs no rescaling.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import nnx, struct

from scorelib.nets.precond import edm_precond
from scorelib.processes.base import broadcast_to_data
from scorelib.scores.base import ScoreSource, check_time_shape

Array = Any


def preconditioned_denoiser(
    graphdef, params, x_ve: Array, sigma: Array, sigma_data: float, *, rngs=None
) -> Array:
    """``D(x; sigma) = c_skip x + c_out F(c_in x; c_noise)`` in the VE frame.

    Args:
      graphdef, params: the network split by ``nnx.split(model, nnx.Param)``; the
        network is called as ``F(x, c_noise, rngs=rngs)``.
      x_ve: ``[batch, *data_shape]`` noisy input in the VE frame.
      sigma: scalar or ``[batch]`` VE noise level (> 0), data units.
      sigma_data: data standard deviation used by the preconditioning.
      rngs: ``nnx.Rngs`` for dropout during training, else ``None`` (deterministic).

    Returns:
      ``[batch, *data_shape]`` denoised estimate of ``x_0``.
    """
    c = edm_precond(sigma, sigma_data)
    c_noise = jnp.broadcast_to(c.c_noise, (x_ve.shape[0],))
    net = nnx.merge(graphdef, params)
    f = net(broadcast_to_data(c.c_in, x_ve) * x_ve, c_noise, rngs=rngs)
    return broadcast_to_data(c.c_skip, x_ve) * x_ve + broadcast_to_data(c.c_out, x_ve) * f


class NetworkScore(ScoreSource):
    """Score source of an EDM-preconditioned network ``F`` (parameters are leaves).

    Fields:
      process: the noise process (static).
      graphdef, params: the network split by ``nnx.split(model, nnx.Param)``; ``params``
        are the pytree leaves (differentiated during training).
      sigma_data: data standard deviation of the preconditioning (static, data units).
      dropout_key: a PRNG key enables dropout (training); ``None`` is deterministic.

    The score follows from :meth:`denoiser` by Tweedie's formula
    (:func:`scorelib.scores.score_from_denoiser`).
    """

    graphdef: Any = struct.field(pytree_node=False, default=None)
    params: Any = None
    sigma_data: float = struct.field(pytree_node=False, default=0.5)
    dropout_key: Any = None  # a PRNG key enables dropout (training); None is deterministic

    def denoiser(self, x, t):
        """``D(x, t) = E[x_0 | x_t = x]`` (data units) by the preconditioned network.

        Karras et al. 2022, eq. 7 and Table 1, applied in the VE frame: ``D = c_skip(s)
        (x / alpha) + c_out(s) F(c_in(s) x / alpha; c_noise(s))`` with ``s = ve_sigma(t)``
        (:func:`preconditioned_denoiser`).

        Args:
          x: ``[batch, *data_shape]`` noisy input in process coordinates.
          t: scalar or ``[batch]`` process time.

        Returns:
          ``[batch, *data_shape]``.

        Raises:
          ValueError: if ``t`` is neither a scalar nor ``[batch]``.
        """
        check_time_shape(x, t)
        alpha = broadcast_to_data(self.process.alpha(t), x)
        sigma = self.process.ve_sigma(t)
        rngs = None if self.dropout_key is None else nnx.Rngs(dropout=self.dropout_key)
        return preconditioned_denoiser(
            self.graphdef, self.params, x / alpha, sigma, self.sigma_data, rngs=rngs
        )
