"""Variance-preserving and sub-VP processes with a linear beta schedule.

Song et al., ICLR 2021, eqs. 32-33 (VP) and 34 (sub-VP); the log mean coefficient is
``m(t) = -t^2 (beta_max - beta_min) / 4 - t beta_min / 2`` so that ``alpha(t) = exp(m(t))``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from scorelib.processes.base import Process, _finite_floats, _require, broadcast_to_data, register


@dataclasses.dataclass(frozen=True)
class _LinearBeta(Process):
    beta_min: float = 0.1
    beta_max: float = 20.0
    eps: float = 1e-3

    def __post_init__(self):
        _finite_floats(self, "beta_min", "beta_max", "eps")
        _require(self.beta_min > 0, "process.beta_min", "> 0", self.beta_min)
        _require(
            self.beta_max >= self.beta_min,
            "process.beta_max",
            f">= process.beta_min = {self.beta_min}",
            self.beta_max,
        )
        _require(0 <= self.eps < 1, "process.eps", "in [0, 1)", self.eps)

    @property
    def t_min(self) -> float:
        return self.eps

    @property
    def t_max(self) -> float:
        return 1.0

    def beta(self, t):
        """``beta(t) = beta_min + t (beta_max - beta_min)``."""
        return self.beta_min + jnp.asarray(t) * (self.beta_max - self.beta_min)

    def log_mean_coeff(self, t):
        """``m(t) = log alpha(t)``."""
        t = jnp.asarray(t)
        return -0.25 * t**2 * (self.beta_max - self.beta_min) - 0.5 * t * self.beta_min

    def _t_of_m(self, m):
        # Stable root of 0.25 db t^2 + 0.5 b0 t + m = 0 (valid also for db = 0).
        db = self.beta_max - self.beta_min
        return -2.0 * m / (0.5 * self.beta_min + jnp.sqrt(0.25 * self.beta_min**2 - db * m))

    def alpha(self, t):
        return jnp.exp(self.log_mean_coeff(t))


@register
@dataclasses.dataclass(frozen=True)
class VP(_LinearBeta):
    """``alpha(t) = exp(m(t))``, ``sigma(t) = sqrt(1 - alpha(t)^2)``, ``t`` in ``[eps, 1]``.

    Forward SDE ``dx = -beta(t) x / 2 dt + sqrt(beta(t)) dw``; prior N(0, I).

    Raises:
      ValueError: naming the field, unless all fields are finite reals with
        ``0 < beta_min <= beta_max`` and ``0 <= eps < 1``.
    """

    def sigma(self, t):
        return jnp.sqrt(-jnp.expm1(2.0 * self.log_mean_coeff(t)))

    def log_snr(self, t):
        two_m = 2.0 * self.log_mean_coeff(t)
        return two_m - jnp.log(-jnp.expm1(two_m))

    def t_of_log_snr(self, log_snr):
        # exp(-lambda) = exp(-2m) - 1  =>  2m = -softplus(-lambda)
        return self._t_of_m(-0.5 * jax.nn.softplus(-jnp.asarray(log_snr)))

    def t_of_sigma(self, sigma):
        return self._t_of_m(0.5 * jnp.log1p(-(jnp.asarray(sigma) ** 2)))

    def sde(self, x, t):
        beta = broadcast_to_data(self.beta(t), x)
        return -0.5 * beta * x, jnp.sqrt(beta)

    def prior_std(self) -> float:
        return 1.0


@register
@dataclasses.dataclass(frozen=True)
class SubVP(_LinearBeta):
    """``alpha(t) = exp(m(t))``, ``sigma(t) = 1 - alpha(t)^2``, ``t`` in ``[eps, 1]``.

    Forward SDE ``dx = -beta(t) x / 2 dt + sqrt(beta(t) (1 - exp(4 m(t)))) dw``; prior N(0, I).

    Raises:
      ValueError: naming the field, unless all fields are finite reals with
        ``0 < beta_min <= beta_max`` and ``0 <= eps < 1``.
    """

    def sigma(self, t):
        return -jnp.expm1(2.0 * self.log_mean_coeff(t))

    def log_snr(self, t):
        m = self.log_mean_coeff(t)
        return 2.0 * m - 2.0 * jnp.log(-jnp.expm1(2.0 * m))

    def t_of_log_snr(self, log_snr):
        # sigma/alpha = exp(-m) - exp(m) = 2 sinh(-m)
        return self._t_of_m(-jnp.arcsinh(0.5 * jnp.exp(-0.5 * jnp.asarray(log_snr))))

    def t_of_sigma(self, sigma):
        return self._t_of_m(0.5 * jnp.log1p(-jnp.asarray(sigma)))

    def sde(self, x, t):
        beta = self.beta(t)
        g = jnp.sqrt(beta * -jnp.expm1(4.0 * self.log_mean_coeff(t)))
        return -0.5 * broadcast_to_data(beta, x) * x, broadcast_to_data(g, x)

    def prior_std(self) -> float:
        return 1.0
