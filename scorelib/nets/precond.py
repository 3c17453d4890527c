"""EDM preconditioning (Karras et al., NeurIPS 2022, Table 1 and eq. 7).

``D(x; sigma) = c_skip(sigma) x + c_out(sigma) F(c_in(sigma) x; c_noise(sigma))``, with::

    c_skip  = sigma_data^2 / (sigma^2 + sigma_data^2)
    c_out   = sigma sigma_data / sqrt(sigma^2 + sigma_data^2)
    c_in    = 1 / sqrt(sigma^2 + sigma_data^2)
    c_noise = ln(sigma) / 4

``sigma`` here is the noise level of the VE frame (``ve_sigma`` of a process).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

Array = Any


class Precond(NamedTuple):
    """The EDM coefficients, each of the shape of ``sigma`` (``c_noise`` dimensionless,
    ``c_out`` in data units, ``c_in`` in 1 / data units, ``c_skip`` dimensionless)."""

    c_skip: Array
    c_out: Array
    c_in: Array
    c_noise: Array


def edm_precond(sigma: Array, sigma_data: float) -> Precond:
    """The four EDM coefficients at noise level ``sigma`` (scalar or ``[batch]``, > 0).

    Args:
      sigma: VE-frame noise level (data units, > 0; ``c_noise`` is ``-inf`` at 0).
      sigma_data: data standard deviation (data units, > 0).

    Returns:
      :class:`Precond` of arrays of the shape of ``sigma``.

    Source: Karras et al. 2022, Table 1 ("Ours" column). The loss weight that goes with
    it is :func:`scorelib.objectives.weights.edm_weight`.
    """
    sigma = jnp.asarray(sigma)
    sd2 = sigma_data**2
    denom = sigma**2 + sd2
    return Precond(
        c_skip=sd2 / denom,
        c_out=sigma * sigma_data / jnp.sqrt(denom),
        c_in=1.0 / jnp.sqrt(denom),
        c_noise=0.25 * jnp.log(sigma),
    )
