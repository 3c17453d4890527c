"""The EDM process: ``alpha(t) = 1``, ``sigma(t) = t`` (Karras et al., NeurIPS 2022, Table 1)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from scorelib.processes.base import Process, _finite_floats, _require, register


@register
@dataclasses.dataclass(frozen=True)
class EDM(Process):
    """``x_t = x_0 + t eps``, ``t`` in ``[sigma_min, sigma_max]``.

    Forward SDE: ``dx = sqrt(2 t) dw`` (so that ``d sigma^2 / dt = 2 t``).

    Raises:
      ValueError: naming the field, unless all fields are finite reals with
        ``0 < sigma_min < sigma_max``.
    """

    sigma_min: float = 0.002
    sigma_max: float = 80.0

    def __post_init__(self):
        _finite_floats(self, "sigma_min", "sigma_max")
        _require(self.sigma_min > 0, "process.sigma_min", "> 0", self.sigma_min)
        _require(
            self.sigma_max > self.sigma_min,
            "process.sigma_max",
            f"> process.sigma_min = {self.sigma_min}",
            self.sigma_max,
        )

    @property
    def t_min(self) -> float:
        return self.sigma_min

    @property
    def t_max(self) -> float:
        return self.sigma_max

    def alpha(self, t):
        return jnp.ones_like(jnp.asarray(t, dtype=jnp.result_type(t, jnp.float32)))

    def sigma(self, t):
        return jnp.asarray(t, dtype=jnp.result_type(t, jnp.float32))

    def log_snr(self, t):
        return -2.0 * jnp.log(self.sigma(t))

    def t_of_log_snr(self, log_snr):
        return jnp.exp(-0.5 * log_snr)

    def t_of_sigma(self, sigma):
        return jnp.asarray(sigma, dtype=jnp.result_type(sigma, jnp.float32))

    def ve_sigma(self, t):
        return self.sigma(t)

    def t_of_ve_sigma(self, ve_sigma):
        return self.t_of_sigma(ve_sigma)

    def sde(self, x, t):
        from scorelib.processes.base import broadcast_to_data

        g = jnp.sqrt(2.0 * self.sigma(t))
        return jnp.zeros_like(x), broadcast_to_data(g, x)

    def prior_std(self) -> float:
        return float(self.sigma_max)
