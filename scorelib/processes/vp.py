"""Variance-preserving and sub-VP processes with a linear beta schedule.

Song et al., ICLR 2021, eqs. 32-33 (VP) and 34 (sub-VP); the log mean coefficient is
``m(t) = -t^2 (beta_max - beta_min) / 4 - t beta_min / 2`` so that ``alpha(t) = exp(m(t))``.
Both share ``f(t) = m'(t) = -beta(t) / 2``; they differ in ``sigma(t)`` and ``g(t)^2``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from scorelib._checks import check_real
from scorelib._pytree import static_pytree
from scorelib.processes.base import Process, _check_range_fields, _EpsToOneTime, _finite_floats


@dataclasses.dataclass(frozen=True)
class _LinearBeta(_EpsToOneTime, Process):
    """``beta(t) = beta_min + t (beta_max - beta_min)``, ``alpha(t) = exp(m(t))``, ``t`` in
    ``[eps, 1]``; shared by :class:`VP` and :class:`SubVP`."""

    beta_min: float = 0.1
    beta_max: float = 20.0
    eps: float = 1e-3

    def __post_init__(self):
        _finite_floats(self, "beta_min", "beta_max", "eps")
        _check_range_fields(self, "beta_min", "beta_max", equal_ok=True)
        self._check_eps()

    def beta(self, t):
        """``beta(t) = beta_min + t (beta_max - beta_min)`` (1 / time units); shape of ``t``."""
        return self.beta_min + jnp.asarray(t) * (self.beta_max - self.beta_min)

    def log_mean_coeff(self, t):
        """``m(t) = log alpha(t) = -t^2 (beta_max - beta_min) / 4 - t beta_min / 2``."""
        t = jnp.asarray(t)
        return -0.25 * t**2 * (self.beta_max - self.beta_min) - 0.5 * t * self.beta_min

    def _t_of_m(self, m):
        # Stable root of 0.25 db t^2 + 0.5 b0 t + m = 0 (valid also for db = 0).
        db = self.beta_max - self.beta_min
        return -2.0 * m / (0.5 * self.beta_min + jnp.sqrt(0.25 * self.beta_min**2 - db * m))

    def alpha(self, t):
        """``alpha(t) = exp(m(t))``; same shape as ``t``."""
        return jnp.exp(self.log_mean_coeff(t))

    def f(self, t):
        """``f(t) = d m / dt = -beta(t) / 2``; same shape as ``t``."""
        return -0.5 * self.beta(t)

    def prior_std(self) -> float:
        """1 (the prior is ``N(0, I)``)."""
        return 1.0


@static_pytree
@dataclasses.dataclass(frozen=True)
class VP(_LinearBeta):
    """``alpha(t) = exp(m(t))``, ``sigma(t) = sqrt(1 - alpha(t)^2)``, ``t`` in ``[eps, 1]``.

    Forward SDE ``dx = -beta(t) x / 2 dt + sqrt(beta(t)) dw`` (Song et al. 2021, eq. 32);
    prior N(0, I).

    Raises:
      ValueError: naming the field, unless all fields are finite reals with
        ``0 < beta_min <= beta_max`` and ``0 <= eps < 1``.
    """

    def sigma(self, t):
        """``sqrt(1 - exp(2 m(t)))`` by ``expm1`` (accurate at small ``t``); shape of ``t``."""
        return jnp.sqrt(-jnp.expm1(2.0 * self.log_mean_coeff(t)))

    def log_snr(self, t):
        """``2 m - log(1 - exp(2 m))``; same shape as ``t``."""
        two_m = 2.0 * self.log_mean_coeff(t)
        return two_m - jnp.log(-jnp.expm1(two_m))

    def t_of_log_snr(self, log_snr):
        """Inverse of :meth:`log_snr`: ``2 m = -softplus(-log_snr)``, then the root in ``t``."""
        # exp(-lambda) = exp(-2m) - 1  =>  2m = -softplus(-lambda)
        return self._t_of_m(-0.5 * jax.nn.softplus(-jnp.asarray(log_snr)))

    def t_of_sigma(self, sigma):
        """Inverse of :meth:`sigma` (``0 <= sigma < 1``): ``m = log(1 - sigma^2) / 2``."""
        return self._t_of_m(0.5 * jnp.log1p(-(jnp.asarray(sigma) ** 2)))

    def g2(self, t):
        """``g(t)^2 = beta(t)``; same shape as ``t``."""
        return self.beta(t)


@static_pytree
@dataclasses.dataclass(frozen=True)
class SubVP(_LinearBeta):
    """``alpha(t) = exp(m(t))``, ``sigma(t) = 1 - alpha(t)^2``, ``t`` in ``[eps, 1]``.

    Forward SDE ``dx = -beta(t) x / 2 dt + sqrt(beta(t) (1 - exp(4 m(t)))) dw`` (Song et al.
    2021, eq. 34); prior N(0, I).

    Raises:
      ValueError: naming the field, unless all fields are finite reals with
        ``0 < beta_min <= beta_max`` and ``0 <= eps < 1``.
    """

    def sigma(self, t):
        """``1 - exp(2 m(t))`` by ``expm1``; same shape as ``t``."""
        return -jnp.expm1(2.0 * self.log_mean_coeff(t))

    def log_snr(self, t):
        """``2 m - 2 log(1 - exp(2 m))``; same shape as ``t``."""
        m = self.log_mean_coeff(t)
        return 2.0 * m - 2.0 * jnp.log(-jnp.expm1(2.0 * m))

    def t_of_log_snr(self, log_snr):
        """Inverse of :meth:`log_snr` via ``sigma / alpha = 2 sinh(-m)``."""
        # sigma/alpha = exp(-m) - exp(m) = 2 sinh(-m)
        return self._t_of_m(-jnp.arcsinh(0.5 * jnp.exp(-0.5 * jnp.asarray(log_snr))))

    def t_of_sigma(self, sigma):
        """Inverse of :meth:`sigma` (``0 <= sigma < 1``): ``m = log(1 - sigma) / 2``."""
        return self._t_of_m(0.5 * jnp.log1p(-jnp.asarray(sigma)))

    def g2(self, t):
        """``g(t)^2 = beta(t) (1 - exp(4 m(t)))``; same shape as ``t``."""
        return self.beta(t) * -jnp.expm1(4.0 * self.log_mean_coeff(t))


def ornstein_uhlenbeck(horizon: float = 1.0, eps: float = 1e-3) -> VP:
    """The Ornstein-Uhlenbeck process ``dx = -x dt + sqrt(2) dB`` up to OU time ``horizon``, as
    the VP process with the constant ``beta = 2 horizon`` (no new process: it is exact).

    The OU marginals are ``x_s = e^{-s} x_0 + sqrt(1 - e^{-2s}) eps`` (OU time ``s``). With
    ``beta_min = beta_max = 2 T``, ``m(t) = -T t`` (Song et al. 2021, eq. 33), so
    ``alpha(t) = e^{-T t}``, ``sigma(t) = sqrt(1 - e^{-2 T t})``, ``f = -T``, ``g^2 = 2 T``:
    process time ``t`` in ``[eps, 1]`` is OU time ``s = T t`` (``dx = -T x dt + sqrt(2 T)
    dB``). Every sampler works in VE noise levels, so the time scale changes nothing but the
    labels. The reverse-diffusion Monte Carlo process (Huang et al., ICLR 2024).

    Args:
      horizon: ``T > 0``, the OU time at ``t = 1``.
      eps: the process's ``t_min`` (OU time ``T eps``), in ``[0, 1)``.

    Raises:
      ValueError: naming ``process.horizon`` (finite, > 0) or ``process.eps``.
    """
    horizon = check_real(horizon, "process.horizon", low=0.0, low_open=True)
    return VP(beta_min=2.0 * horizon, beta_max=2.0 * horizon, eps=eps)
