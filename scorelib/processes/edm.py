"""The EDM process: ``alpha(t) = 1``, ``sigma(t) = t`` (Karras et al., NeurIPS 2022, Table 1)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from scorelib._pytree import static_pytree
from scorelib.processes.base import VEFrameProcess, _check_range_fields, _finite_floats


@static_pytree
@dataclasses.dataclass(frozen=True)
class EDM(VEFrameProcess):
    """``x_t = x_0 + t eps``, ``t`` in ``[sigma_min, sigma_max]`` (time is the noise level).

    Forward SDE: ``dx = sqrt(2 t) dw`` (so that ``d sigma^2 / dt = 2 t``; Karras et al.
    2022, eq. 6 with ``s(t) = 1``, ``sigma(t) = t``). Prior ``N(0, sigma_max^2 I)``.

    Raises:
      ValueError: naming the field, unless all fields are finite reals with
        ``0 < sigma_min < sigma_max``.
    """

    sigma_min: float = 0.002
    sigma_max: float = 80.0

    def __post_init__(self):
        _finite_floats(self, "sigma_min", "sigma_max")
        _check_range_fields(self, "sigma_min", "sigma_max")

    @property
    def t_min(self) -> float:
        """``sigma_min``."""
        return self.sigma_min

    @property
    def t_max(self) -> float:
        """``sigma_max``."""
        return self.sigma_max

    def sigma(self, t):
        """``sigma(t) = t`` (data units); same shape as ``t``."""
        return jnp.asarray(t, dtype=jnp.result_type(t, jnp.float32))

    def log_snr(self, t):
        """``-2 log t``; same shape as ``t``."""
        return -2.0 * jnp.log(self.sigma(t))

    def t_of_log_snr(self, log_snr):
        """``t = exp(-log_snr / 2)``; same shape as ``log_snr``."""
        return jnp.exp(-0.5 * log_snr)

    def t_of_sigma(self, sigma):
        """``t = sigma``; same shape as ``sigma``."""
        return jnp.asarray(sigma, dtype=jnp.result_type(sigma, jnp.float32))

    def g2(self, t):
        """``g(t)^2 = d t^2 / dt = 2 t``; same shape as ``t``."""
        return 2.0 * self.sigma(t)
