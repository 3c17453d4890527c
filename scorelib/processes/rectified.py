"""The rectified-flow convention of closed-form diffusion, written once as a process.

Closed-form diffusion (Scarvelis, Saez de Ocariz Borde and Solomon, "Closed-form diffusion
models", arXiv 2310.12395, Sec. 3) and rectified flow (Liu et al., ICLR 2023) write
``x_s = s x_1 + (1 - s) x_0`` with noise ``x_0 ~ N(0, I)`` at flow time ``s = 0`` and data
``x_1`` at ``s = 1``. In the library's convention (process time ``t``, clean data at
``t_min``) this is the process

    alpha(t) = 1 - t,   sigma(t) = t,   t = 1 - s,

so every score source built on :class:`RectifiedFlow` answers in flow coordinates, and the
flow's velocity follows from the denoiser ``D = E[x_1 | x_s = x]`` (Liu et al. 2023, eq. 1
with the conditional expectation; Scarvelis et al., eq. for ``v``)::

    v(x, s) = (D(x, t) - x) / (1 - s) = (x + (1 - s) score(x, t)) / s.

``flow_time`` / ``process_time`` convert the two clocks; ``flow_velocity`` the denoiser.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from scorelib._checks import require
from scorelib._pytree import static_pytree
from scorelib.processes.base import Process, _finite_floats, broadcast_to_data

Array = Any


def flow_time(t: Array) -> Array:
    """Rectified-flow time ``s = 1 - t`` of process time ``t`` (dimensionless; same shape)."""
    return 1.0 - jnp.asarray(t)


def process_time(s: Array) -> Array:
    """Process time ``t = 1 - s`` of rectified-flow time ``s`` (same shape)."""
    return 1.0 - jnp.asarray(s)


def flow_velocity(x: Array, s: Array, denoised: Array) -> Array:
    """Velocity ``v = (D - x) / (1 - s)`` of the rectified flow ``x_s = s x_1 + (1 - s) x_0``.

    Args:
      x: ``[batch, *data_shape]`` the state at flow time ``s``.
      s: scalar or ``[batch]`` flow time in ``[0, 1)``.
      denoised: ``[batch, *data_shape]`` ``D = E[x_1 | x_s = x]`` (data units).

    Returns:
      ``[batch, *data_shape]``, data units per unit flow time.

    Raises:
      ValueError: if ``s`` is neither a scalar nor ``[batch]``.
    """
    return (denoised - x) / (1.0 - broadcast_to_data(s, x))


@static_pytree
@dataclasses.dataclass(frozen=True)
class RectifiedFlow(Process):
    """``x_t = (1 - t) x_0 + t eps`` for ``t`` in ``[t_min, t_max]`` (``t = 1 - s``).

    Forward SDE coefficients from the marginals (Lu et al., "DPM-Solver", NeurIPS 2022,
    Sec. 2.1): ``f = -1 / (1 - t)``, ``g^2 = 2 t / (1 - t)``. Prior ``N(0, I)`` (``t -> 1``).

    Raises:
      ValueError: naming the field unless ``0 < eps_min < 1`` and
        ``0 < eps_max < 1 - eps_min``.
    """

    eps_min: float = 1e-4
    eps_max: float = 1e-3

    def __post_init__(self):
        _finite_floats(self, "eps_min", "eps_max")
        require(0 < self.eps_min < 1, "process.eps_min", "in (0, 1)", self.eps_min)
        require(
            0 < self.eps_max < 1 - self.eps_min,
            "process.eps_max",
            f"in (0, 1 - process.eps_min = {1 - self.eps_min})",
            self.eps_max,
        )

    @property
    def t_min(self) -> float:
        """``eps_min`` (flow time ``1 - eps_min``)."""
        return self.eps_min

    @property
    def t_max(self) -> float:
        """``1 - eps_max`` (flow time ``eps_max``)."""
        return 1.0 - self.eps_max

    def alpha(self, t):
        """``1 - t``; same shape as ``t``."""
        return 1.0 - jnp.asarray(t, dtype=jnp.result_type(t, jnp.float32))

    def sigma(self, t):
        """``t`` (data units); same shape as ``t``."""
        return jnp.asarray(t, dtype=jnp.result_type(t, jnp.float32))

    def ve_sigma(self, t):
        """``t / (1 - t)`` (data units), computed directly (no ``exp(log)``)."""
        return self.sigma(t) / self.alpha(t)

    def log_snr(self, t):
        """``2 log((1 - t) / t)``; same shape as ``t``."""
        return 2.0 * (jnp.log(self.alpha(t)) - jnp.log(self.sigma(t)))

    def t_of_log_snr(self, log_snr):
        """``t = sigmoid(-log_snr / 2)``; same shape as ``log_snr``."""
        return jax.nn.sigmoid(-0.5 * jnp.asarray(log_snr))

    def t_of_ve_sigma(self, ve_sigma):
        """``t = ve_sigma / (1 + ve_sigma)``; same shape."""
        v = jnp.asarray(ve_sigma, dtype=jnp.result_type(ve_sigma, jnp.float32))
        return v / (1.0 + v)

    def t_of_sigma(self, sigma):
        """``t = sigma``."""
        return jnp.asarray(sigma, dtype=jnp.result_type(sigma, jnp.float32))

    def f(self, t):
        """``d log alpha / dt = -1 / (1 - t)``; same shape as ``t``."""
        return -1.0 / self.alpha(t)

    def g2(self, t):
        """``d sigma^2/dt - 2 f sigma^2 = 2 t / (1 - t)``; same shape as ``t``."""
        return 2.0 * self.sigma(t) / self.alpha(t)

    def prior_std(self) -> float:
        """1 (``x_0 ~ N(0, I)``)."""
        return 1.0
