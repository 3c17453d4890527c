"""The variance-exploding process of score SDE (Song et al., ICLR 2021, eq. 30)."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from scorelib._pytree import static_pytree
from scorelib.processes.base import (
    VEFrameProcess,
    _check_range_fields,
    _EpsToOneTime,
    _finite_floats,
)


@static_pytree
@dataclasses.dataclass(frozen=True)
class VE(_EpsToOneTime, VEFrameProcess):
    """``x_t = x_0 + sigma(t) eps``, ``sigma(t) = sigma_min (sigma_max / sigma_min)^t``.

    ``t`` in ``[eps, 1]``. Forward SDE ``dx = sigma(t) sqrt(2 ln(sigma_max/sigma_min)) dw``,
    so that ``d sigma(t)^2 / dt = g(t)^2`` (Song et al. 2021, eq. 30). Prior
    ``N(0, sigma_max^2 I)``.

    Raises:
      ValueError: naming the field, unless all fields are finite reals with
        ``0 < sigma_min < sigma_max`` and ``0 <= eps < 1``.
    """

    sigma_min: float = 0.01
    sigma_max: float = 50.0
    eps: float = 1e-5

    def __post_init__(self):
        _finite_floats(self, "sigma_min", "sigma_max", "eps")
        _check_range_fields(self, "sigma_min", "sigma_max")
        self._check_eps()

    @property
    def _log_ratio(self) -> float:
        return math.log(self.sigma_max / self.sigma_min)

    def sigma(self, t):
        """``sigma_min (sigma_max / sigma_min)^t`` (data units); same shape as ``t``."""
        return self.sigma_min * jnp.exp(jnp.asarray(t) * self._log_ratio)

    def log_snr(self, t):
        """``-2 log sigma(t)``, linear in ``t``; same shape as ``t``."""
        return -2.0 * (math.log(self.sigma_min) + jnp.asarray(t) * self._log_ratio)

    def t_of_log_snr(self, log_snr):
        """Inverse of :meth:`log_snr`; same shape as ``log_snr``."""
        return (-0.5 * jnp.asarray(log_snr) - math.log(self.sigma_min)) / self._log_ratio

    def t_of_sigma(self, sigma):
        """``log(sigma / sigma_min) / log(sigma_max / sigma_min)``; same shape as ``sigma``."""
        return (jnp.log(sigma) - math.log(self.sigma_min)) / self._log_ratio

    def g2(self, t):
        """``g(t)^2 = d sigma(t)^2 / dt = 2 ln(sigma_max / sigma_min) sigma(t)^2``."""
        return 2.0 * self._log_ratio * self.sigma(t) ** 2
