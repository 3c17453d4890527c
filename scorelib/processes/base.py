"""The noise-process interface shared by every process.

A process is the forward corruption ``x_t = alpha(t) x_0 + sigma(t) eps`` with
``eps ~ N(0, I)``, together with the forward SDE ``dx = f(t) x dt + g(t) dw``
whose marginals it describes (Song et al., ICLR 2021, eqs. 5-6 and App. B). The
SDE coefficients follow from the marginals (Lu et al., "DPM-Solver", NeurIPS 2022,
Sec. 2.1)::

    f(t)   = d log alpha(t) / dt
    g(t)^2 = d sigma(t)^2 / dt - 2 f(t) sigma(t)^2 = -sigma(t)^2 d log_snr(t) / dt

Conventions:

* ``t`` is the process time; ``t = t_min`` is (almost) clean data and
  ``t = t_max`` is the prior. ``t`` is a scalar or a ``[batch]`` array.
* ``ve_sigma(t) = sigma(t) / alpha(t)`` is the noise level of the
  variance-exploding frame ``x / alpha(t)`` (Karras et al. 2022, eq. 4 with
  ``s(t) = alpha(t)``). Sampler time grids are written in this unit, so that
  one grid serves every process; ``log_snr(t) = -2 log ve_sigma(t)``.
* Processes are frozen dataclasses registered as *static* pytrees: they hold
  only Python floats, are hashable, can be passed straight into ``jax.jit``
  and are validated when constructed, before anything is compiled.
* A process writes its primitives (``alpha``, ``sigma``, ``log_snr``, their
  inverses, ``f`` and ``g2``, each in closed form); everything else (``ve_sigma``,
  ``sde``, ``marginal_sample``, ``prior_logp``) is derived here once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from scorelib._checks import check_real, require

Array = Any


def broadcast_to_data(t: Array, x: Array) -> Array:
    """Reshape a time or per-example coefficient so it broadcasts against ``x``.

    Args:
      t: scalar or ``[batch]``.
      x: ``[batch, *data_shape]``.

    Returns:
      ``t`` itself when it is a scalar, else ``t`` reshaped to
      ``[batch, 1, ..., 1]`` (``x.ndim`` axes).

    Raises:
      ValueError: when ``t`` is not a scalar and its shape is not ``[batch]``.
    """
    t = jnp.asarray(t)
    if t.ndim == 0:
        return t
    if t.ndim != 1 or t.shape[0] != x.shape[0]:
        raise ValueError(
            f"t must be a scalar or have shape [batch]=({x.shape[0]},) to match "
            f"x of shape {tuple(x.shape)}; got t of shape {tuple(t.shape)}"
        )
    return t.reshape(t.shape + (1,) * (x.ndim - 1))


def _finite_floats(obj: Any, *names: str) -> None:
    """Check that the named fields of a frozen dataclass are finite real numbers.

    Stores them back as Python floats (so that equal processes hash alike).

    Raises:
      ValueError: naming the field (``process.<name>``) for a string, bool, NaN,
        infinity or anything that is not a real number (e.g. a YAML float that
        arrived as a string).
    """
    for name in names:
        value = check_real(
            getattr(obj, name),
            f"process.{name}",
            low=-math.inf,
            high=math.inf,
            low_open=True,
            high_open=True,
        )
        object.__setattr__(obj, name, value)


def _check_range_fields(obj: Any, low: str, high: str, *, equal_ok: bool = False) -> None:
    """Check ``0 < obj.<low> < obj.<high>`` (``<=`` for the second with ``equal_ok``).

    Raises:
      ValueError: ``process.<low> must be > 0; got ...`` or ``process.<high> must be >
        process.<low> = <value>; got ...`` (``>=`` with ``equal_ok``).
    """
    lo, hi = getattr(obj, low), getattr(obj, high)
    require(lo > 0, f"process.{low}", "> 0", lo)
    above = hi >= lo if equal_ok else hi > lo
    require(above, f"process.{high}", f"{'>=' if equal_ok else '>'} process.{low} = {lo}", hi)


class Process:
    """Base class of noise processes. Subclasses are frozen dataclasses.

    Subclasses implement the primitives ``alpha``, ``sigma``, ``log_snr``,
    ``t_of_log_snr``, ``t_of_sigma``, ``f``, ``g2`` and ``prior_std``, and the
    properties ``t_min``/``t_max`` (floats). Every method taking ``t`` accepts a
    scalar or a ``[batch]`` array and returns an array of the same shape, in the
    floating dtype of ``t`` (float32 for Python floats unless x64 is enabled).
    """

    t_min: float
    t_max: float

    # --- marginals -----------------------------------------------------------
    def alpha(self, t: Array) -> Array:
        """Signal scale ``alpha(t)`` (dimensionless, in ``(0, 1]``); same shape as ``t``."""
        raise NotImplementedError

    def sigma(self, t: Array) -> Array:
        """Noise standard deviation ``sigma(t)`` in data units; same shape as ``t``."""
        raise NotImplementedError

    def log_snr(self, t: Array) -> Array:
        """``log(alpha(t)^2 / sigma(t)^2)`` (natural log); same shape as ``t``."""
        raise NotImplementedError

    def t_of_log_snr(self, log_snr: Array) -> Array:
        """Inverse of :meth:`log_snr`; same shape as ``log_snr``."""
        raise NotImplementedError

    def t_of_sigma(self, sigma: Array) -> Array:
        """Inverse of :meth:`sigma` (``sigma`` in data units, in the range of ``sigma(t)``)."""
        raise NotImplementedError

    def ve_sigma(self, t: Array) -> Array:
        """Noise level of the VE frame ``x / alpha``: ``sigma(t) / alpha(t)`` in data units.

        Karras et al. 2022, eq. 4 with ``s(t) = alpha(t)``; same shape as ``t``.
        """
        return jnp.exp(-0.5 * self.log_snr(t))

    def t_of_ve_sigma(self, ve_sigma: Array) -> Array:
        """Inverse of :meth:`ve_sigma` (``ve_sigma > 0``, data units); same shape."""
        return self.t_of_log_snr(-2.0 * jnp.log(ve_sigma))

    # --- forward SDE ---------------------------------------------------------
    def f(self, t: Array) -> Array:
        """Drift coefficient ``f(t) = d log alpha(t) / dt`` (1 / time units); shape of ``t``.

        The forward SDE's drift is ``f(t) x`` (Song et al. 2021, eq. 5 with an affine
        drift; Lu et al. 2022, Sec. 2.1).
        """
        raise NotImplementedError

    def g2(self, t: Array) -> Array:
        """Squared diffusion coefficient ``g(t)^2 = d sigma^2/dt - 2 f(t) sigma^2``.

        Data units squared per unit time; same shape as ``t``. It is the weight of
        likelihood training (Song et al., "Maximum likelihood training of score-based
        diffusion models", NeurIPS 2021, Thm. 1) and the noise scale of the reverse SDE
        (Song et al., ICLR 2021, eq. 6).
        """
        raise NotImplementedError

    def sde(self, x: Array, t: Array) -> tuple[Array, Array]:
        """Forward SDE coefficients ``(f(t) x, g(t))`` (Song et al., ICLR 2021, eq. 5).

        Args:
          x: ``[batch, *data_shape]``.
          t: scalar or ``[batch]``.

        Returns:
          ``drift`` of the shape of ``x`` and ``diffusion`` ``g(t) = sqrt(g2(t))``
          broadcastable against ``x`` (scalar or ``[batch, 1, ...]``).

        Raises:
          ValueError: if ``t`` is neither a scalar nor ``[batch]``.
        """
        drift = broadcast_to_data(self.f(t), x) * x
        return drift, broadcast_to_data(jnp.sqrt(self.g2(t)), x)

    def prior_std(self) -> float:
        """Standard deviation (data units) of the prior ``N(0, prior_std^2 I)`` at ``t_max``."""
        raise NotImplementedError

    # --- sampling and densities ---------------------------------------------
    def marginal_sample(self, x0: Array, t: Array, eps: Array) -> Array:
        """``x_t = alpha(t) x0 + sigma(t) eps`` (Song et al. 2021, App. B).

        Args:
          x0: ``[batch, *data_shape]`` clean data (data units).
          t: scalar or ``[batch]`` process time.
          eps: ``[batch, *data_shape]`` standard normal noise.

        Returns:
          ``[batch, *data_shape]``.

        Raises:
          ValueError: if ``t`` is neither a scalar nor ``[batch]``.
        """
        return (
            broadcast_to_data(self.alpha(t), x0) * x0 + broadcast_to_data(self.sigma(t), x0) * eps
        )

    def prior_sample(self, key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
        """A draw from the prior ``N(0, prior_std^2 I)``, the start of a reverse process at
        ``t_max`` (Song et al. 2021, Sec. 3.3).

        Args:
          key: one PRNG key.
          shape: ``(batch, *data_shape)``.
          dtype: floating dtype of the draw.

        Returns:
          ``shape`` array in data units.
        """
        return self.prior_std() * jax.random.normal(key, shape, dtype)

    def prior_logp(self, x: Array) -> Array:
        """Log-density (nats) of the prior ``N(0, prior_std^2 I)`` at ``x``.

        The end point of a probability-flow likelihood (Song et al. 2021, Sec. 4.3).

        Args:
          x: ``[batch, *data_shape]``.

        Returns:
          ``[batch]``, summed over the ``d = prod(data_shape)`` coordinates.
        """
        s2 = self.prior_std() ** 2
        d = math.prod(x.shape[1:])
        sq = jnp.sum(jnp.reshape(x, (x.shape[0], -1)) ** 2, axis=-1)
        return -0.5 * d * jnp.log(2 * jnp.pi * s2) - 0.5 * sq / s2

    def replace(self, **changes) -> Process:
        """A copy with some fields changed (validated again, ``ValueError`` as the constructor)."""
        return dataclasses.replace(self, **changes)


class VEFrameProcess(Process):
    """A process with ``alpha(t) = 1`` (VE and EDM): it is already in the VE frame.

    Writes the members that ``alpha = 1`` fixes: ``alpha``, ``ve_sigma = sigma``,
    ``t_of_ve_sigma = t_of_sigma``, ``f = 0``, and the prior ``N(0, sigma_max^2 I)``
    (subclasses have a ``sigma_max`` field). Subclasses write ``sigma`` and its inverses.
    """

    def alpha(self, t):
        """``alpha(t) = 1``; same shape as ``t``."""
        return jnp.ones_like(jnp.asarray(t, dtype=jnp.result_type(t, jnp.float32)))

    def ve_sigma(self, t):
        """``sigma(t)`` (``alpha = 1``)."""
        return self.sigma(t)

    def t_of_ve_sigma(self, ve_sigma):
        """Inverse of :meth:`ve_sigma` (= :meth:`t_of_sigma`)."""
        return self.t_of_sigma(ve_sigma)

    def f(self, t):
        """``f(t) = d log alpha / dt = 0``; same shape as ``t``."""
        return jnp.zeros_like(self.sigma(t))

    def prior_std(self) -> float:
        """``sigma_max``."""
        return float(self.sigma_max)


class _EpsToOneTime:
    """Process time ``t`` in ``[eps, 1]`` (VE, VP, sub-VP; Song et al. 2021): a mixin for a
    process dataclass with an ``eps`` field, checked by :meth:`_check_eps`."""

    eps: float

    def _check_eps(self) -> None:
        """Raises ValueError ``process.eps must be in [0, 1); got ...``."""
        require(0 <= self.eps < 1, "process.eps", "in [0, 1)", self.eps)

    @property
    def t_min(self) -> float:
        """``eps``."""
        return self.eps

    @property
    def t_max(self) -> float:
        """1."""
        return 1.0
