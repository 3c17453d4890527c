"""The noise-process interface shared by every process.

A process is the forward corruption ``x_t = alpha(t) x_0 + sigma(t) eps`` with
``eps ~ N(0, I)``, together with the forward SDE ``dx = f(x, t) dt + g(t) dw``
whose marginals it describes (Song et al., ICLR 2021, eqs. 5-6 and App. B).

Conventions (see ``shared/DESIGN.md``):

* ``t`` is the process time; ``t = t_min`` is (almost) clean data and
  ``t = t_max`` is the prior. ``t`` is a scalar or a ``[batch]`` array.
* ``ve_sigma(t) = sigma(t) / alpha(t)`` is the noise level of the
  variance-exploding frame ``x / alpha(t)`` (Karras et al. 2022, eq. 4 with
  ``s(t) = alpha(t)``). Sampler time grids are written in this unit, so that
  one grid serves every process; ``log_snr(t) = -2 log ve_sigma(t)``.
* Processes are frozen dataclasses registered as *static* pytrees: they hold
  only Python floats, are hashable, can be passed straight into ``jax.jit``
  and are validated when constructed, before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp

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


def _require(cond: bool, field: str, allowed: str, value: Any) -> None:
    if not cond:
        raise ValueError(f"{field} must be {allowed}; got {value!r}")


def _finite_floats(obj: Any, *names: str) -> None:
    """Check that the named fields of a frozen dataclass are finite real numbers.

    Stores them back as Python floats (so that equal processes hash alike).

    Raises:
      ValueError: naming the field (``process.<name>``) for a string, bool, NaN,
        infinity or anything that is not a real number (e.g. a YAML float that
        arrived as a string).
    """
    for name in names:
        value = getattr(obj, name)
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        _require(ok and math.isfinite(value), f"process.{name}", "a finite real number", value)
        object.__setattr__(obj, name, float(value))


class Process:
    """Base class of noise processes. Subclasses are frozen dataclasses.

    Subclasses implement ``alpha``, ``sigma``, ``log_snr``, ``t_of_log_snr``,
    ``t_of_sigma``, ``sde`` and ``prior_std``; and the fields
    ``t_min``/``t_max`` (floats).
    """

    t_min: float
    t_max: float

    # --- marginals -----------------------------------------------------------
    def alpha(self, t: Array) -> Array:
        """Signal scale alpha(t); same shape as ``t``."""
        raise NotImplementedError

    def sigma(self, t: Array) -> Array:
        """Noise standard deviation sigma(t) in data units; same shape as ``t``."""
        raise NotImplementedError

    def log_snr(self, t: Array) -> Array:
        """``log(alpha(t)^2 / sigma(t)^2)``; same shape as ``t``."""
        raise NotImplementedError

    def t_of_log_snr(self, log_snr: Array) -> Array:
        """Inverse of :meth:`log_snr`."""
        raise NotImplementedError

    def t_of_sigma(self, sigma: Array) -> Array:
        """Inverse of :meth:`sigma` (sigma in data units, in the range of sigma(t))."""
        raise NotImplementedError

    def ve_sigma(self, t: Array) -> Array:
        """Noise level of the VE frame ``x / alpha``: ``sigma(t) / alpha(t)``."""
        return jnp.exp(-0.5 * self.log_snr(t))

    def t_of_ve_sigma(self, ve_sigma: Array) -> Array:
        """Inverse of :meth:`ve_sigma` (``ve_sigma > 0``)."""
        return self.t_of_log_snr(-2.0 * jnp.log(ve_sigma))

    # --- forward SDE ---------------------------------------------------------
    def sde(self, x: Array, t: Array) -> tuple[Array, Array]:
        """Forward SDE coefficients ``(f(x, t), g(t))``.

        Args:
          x: ``[batch, *data_shape]``.
          t: scalar or ``[batch]``.

        Returns:
          ``drift`` of the shape of ``x`` and ``diffusion`` g(t) broadcastable
          against ``x`` (scalar or ``[batch, 1, ...]``).
        """
        raise NotImplementedError

    def prior_std(self) -> float:
        """Standard deviation of the prior N(0, prior_std^2 I) at ``t_max``."""
        raise NotImplementedError

    # --- sampling and densities ---------------------------------------------
    def marginal_sample(self, x0: Array, t: Array, eps: Array) -> Array:
        """``x_t = alpha(t) x0 + sigma(t) eps``; ``x0, eps: [batch, *data_shape]``."""
        return (
            broadcast_to_data(self.alpha(t), x0) * x0 + broadcast_to_data(self.sigma(t), x0) * eps
        )

    def prior_sample(self, key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
        """A draw from the prior N(0, prior_std^2 I) of shape ``shape = (batch, *data_shape)``."""
        return self.prior_std() * jax.random.normal(key, shape, dtype)

    def prior_logp(self, x: Array) -> Array:
        """Log-density of the prior at ``x: [batch, *data_shape]``; returns ``[batch]``."""
        s2 = self.prior_std() ** 2
        d = math.prod(x.shape[1:])
        sq = jnp.sum(jnp.reshape(x, (x.shape[0], -1)) ** 2, axis=-1)
        return -0.5 * d * jnp.log(2 * jnp.pi * s2) - 0.5 * sq / s2

    def replace(self, **changes) -> Process:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def register(cls):
    """Make a frozen-dataclass process a static (leafless, hashable) pytree."""
    jax.tree_util.register_static(cls)
    return cls
