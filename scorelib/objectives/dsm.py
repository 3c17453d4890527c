"""Denoising score matching in the score-SDE form and the EDM loss.

* ``DSM`` (Vincent 2011; Song et al., ICLR 2021, eq. 7): ``t ~ U(t_min, t_max)``,
  ``x_t = alpha x0 + sigma eps`` and per example
  ``lambda(t) * reduce((score(x_t, t) + eps / sigma)^2)`` with
  ``lambda = sigma^2`` (``weighting='sigma2'``, the score-SDE default),
  ``lambda = g(t)^2`` (``'likelihood'``, Song et al. 2021b, "Maximum likelihood
  training of score-based diffusion models", Thm. 1) or ``1`` (``'none'``).
* ``EDMLoss`` (Karras et al., NeurIPS 2022, eq. 8 and Table 1):
  ``ln sigma ~ N(P_mean, P_std^2)``, per example
  ``lambda(sigma) reduce((D(x0 + sigma n; sigma) - x0)^2)``,
  ``lambda = (sigma^2 + sigma_data^2) / (sigma sigma_data)^2``. For processes
  with ``alpha != 1`` sigma is the VE-frame level and ``x_t = alpha(t) (x0 + sigma n)``.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from scorelib.nets.precond import edm_loss_weight
from scorelib.objectives.base import (
    REDUCTIONS,
    Objective,
    example_draws,
    reduce_per_example,
    register,
)
from scorelib.processes.base import Process, broadcast_to_data

DSM_WEIGHTINGS = ("sigma2", "likelihood", "none")


@register
@dataclasses.dataclass(frozen=True)
class DSM(Objective):
    """Denoising score matching on any process.

    Raises:
      ValueError: unknown ``weighting`` or ``reduce``, or a ``t_range`` that is not a
        pair inside ``[process.t_min, process.t_max]``.
    """

    process: Process
    weighting: str = "sigma2"
    reduce: str = "mean"
    t_range: tuple[float, float] | None = None  # default: (process.t_min, process.t_max)

    def __post_init__(self):
        if self.t_range is not None:
            if len(self.t_range) != 2:
                raise ValueError(f"objective.t_range must be a pair (lo, hi); got {self.t_range!r}")
            lo, hi = self.t_range
            if not (self.process.t_min <= lo <= hi <= self.process.t_max):
                raise ValueError(
                    f"objective.t_range must satisfy {self.process.t_min} <= lo <= hi <= "
                    f"{self.process.t_max}; got {self.t_range}"
                )
        if self.weighting not in DSM_WEIGHTINGS:
            raise ValueError(
                f"objective.weighting must be one of {list(DSM_WEIGHTINGS)}; got {self.weighting!r}"
            )
        if self.reduce not in REDUCTIONS:
            raise ValueError(
                f"objective.reduce must be one of {list(REDUCTIONS)}; got {self.reduce!r}"
            )

    def weight(self, t):
        """``lambda(t)``: ``[batch]``."""
        p = self.process
        if self.weighting == "sigma2":
            return p.sigma(t) ** 2
        if self.weighting == "likelihood":
            _, g = p.sde(jnp.zeros((jnp.shape(t)[0], 1)), t)
            return jnp.reshape(g, (-1,)) ** 2 * jnp.ones_like(t)
        return jnp.ones_like(t)

    def per_example(self, source, x0, key):
        p = self.process
        lo, hi = self.t_range if self.t_range is not None else (p.t_min, p.t_max)
        u, eps = example_draws(key, x0, "uniform")
        t = lo + (hi - lo) * u
        xt = p.marginal_sample(x0, t, eps)
        sigma = broadcast_to_data(p.sigma(t), x0)
        err = reduce_per_example((source.score(xt, t) + eps / sigma) ** 2, self.reduce)
        return self.weight(t) * err, {"t": t}


@register
@dataclasses.dataclass(frozen=True)
class EDMLoss(Objective):
    """The EDM training loss with log-normal noise levels.

    Raises:
      ValueError: unless ``P_mean`` is finite, ``P_std > 0``, ``sigma_data > 0`` and
        ``reduce`` is known.
    """

    process: Process
    P_mean: float = -1.2
    P_std: float = 1.2
    sigma_data: float = 0.5
    reduce: str = "mean"

    def __post_init__(self):
        if not math.isfinite(self.P_mean):
            raise ValueError(f"objective.P_mean must be finite; got {self.P_mean}")
        if not self.P_std > 0:
            raise ValueError(f"objective.P_std must be > 0; got {self.P_std}")
        if not self.sigma_data > 0:
            raise ValueError(f"objective.sigma_data must be > 0; got {self.sigma_data}")
        if self.reduce not in REDUCTIONS:
            raise ValueError(
                f"objective.reduce must be one of {list(REDUCTIONS)}; got {self.reduce!r}"
            )

    def per_example(self, source, x0, key):
        p = self.process
        z, n = example_draws(key, x0, "normal")
        sigma = jnp.exp(self.P_mean + self.P_std * z)
        t = p.t_of_ve_sigma(sigma)
        alpha = broadcast_to_data(p.alpha(t), x0)
        xt = alpha * (x0 + broadcast_to_data(sigma, x0) * n)
        err = reduce_per_example((source.denoiser(xt, t) - x0) ** 2, self.reduce)
        return edm_loss_weight(sigma, self.sigma_data) * err, {"sigma": sigma}
