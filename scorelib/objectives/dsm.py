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
  Optionally (``p_uniform > 0``) a share of the noise levels is drawn log-uniformly over
  ``sigma_range`` instead (:func:`edm_sigma`), a floor of training mass at noise levels
  the log-normal almost never draws but a sampler visits (EDM's grid starts at
  ``sigma_max = 80``, where the default log-normal has density ~1e-6).

The weights live in ``scorelib/objectives/weights.py``; the noise-level draws
(:func:`log_normal_sigma`, :func:`edm_sigma`) in ``scorelib/processes/noise_levels.py``.
"""

from __future__ import annotations

import dataclasses
import math

from scorelib._checks import check_choice, check_real, require
from scorelib._pytree import static_pytree
from scorelib.objectives.base import REDUCTIONS, Objective, example_draws, reduce_per_example
from scorelib.objectives.weights import DSM_WEIGHTINGS, dsm_weight, edm_weight
from scorelib.processes.base import Process, broadcast_to_data
from scorelib.processes.noise_levels import edm_sigma, log_normal_sigma


def check_t_range(t_range, process: Process) -> tuple[float, float] | None:
    """``t_range`` as a float pair ``(lo, hi)`` with ``t_min <= lo <= hi <= t_max``, or None.

    Raises:
      ValueError: naming ``objective.t_range`` for anything else.
    """
    if t_range is None:
        return None
    require(len(t_range) == 2, "objective.t_range", "a pair (lo, hi)", t_range)
    lo, hi = (float(v) for v in t_range)
    require(
        process.t_min <= lo <= hi <= process.t_max,
        "objective.t_range",
        f"a pair with {process.t_min} <= lo <= hi <= {process.t_max}",
        tuple(t_range),
    )
    return lo, hi


@static_pytree
@dataclasses.dataclass(frozen=True)
class DSM(Objective):
    """Denoising score matching on any process (Song et al., ICLR 2021, eq. 7).

    Fields:
      process: the noise process.
      weighting: ``'sigma2'``, ``'likelihood'`` or ``'none'`` (:func:`weight`).
      reduce: ``'mean'`` or ``'sum'`` over the data axes.
      t_range: ``(lo, hi)`` process times to sample; default ``(t_min, t_max)``.

    Raises:
      ValueError: unknown ``weighting`` or ``reduce``, or a ``t_range`` that is not a
        pair inside ``[process.t_min, process.t_max]``.
    """

    process: Process
    weighting: str = "sigma2"
    reduce: str = "mean"
    t_range: tuple[float, float] | None = None  # default: (process.t_min, process.t_max)

    def __post_init__(self):
        object.__setattr__(self, "t_range", check_t_range(self.t_range, self.process))
        check_choice(self.weighting, "objective.weighting", DSM_WEIGHTINGS)
        check_choice(self.reduce, "objective.reduce", REDUCTIONS)

    def weight(self, t):
        """``lambda(t)`` at ``t: [batch]``: ``[batch]`` (:func:`weights.dsm_weight`)."""
        return dsm_weight(self.weighting, process=self.process, t=t)

    def example_losses(self, source, x0, key):
        """``lambda(t) reduce((source.score(x_t, t) + eps / sigma(t))^2)`` per example.

        ``t = lo + (hi - lo) u`` with ``u ~ U[0, 1)`` and ``eps`` from each example's own
        key (:func:`scorelib.objectives.example_draws`), ``x_t = alpha(t) x0 + sigma(t)
        eps``.

        Args:
          source: a score source; its ``score`` is trained (units of 1 / data).
          x0: ``[batch, *data_shape]`` clean data (data units).
          key: the step's PRNG key.

        Returns:
          ``(losses [batch], {"t": [batch]})``.
        """
        t, eps, xt = self._draws(x0, key)
        sigma = broadcast_to_data(self.process.sigma(t), x0)
        err = reduce_per_example((source.score(xt, t) + eps / sigma) ** 2, self.reduce)
        return self.weight(t) * err, {"t": t}

    def _draws(self, x0, key):
        """``(t [batch], eps, x_t)`` of :meth:`example_losses`."""
        p = self.process
        lo, hi = self.t_range if self.t_range is not None else (p.t_min, p.t_max)
        u, eps = example_draws(key, x0, "uniform")
        t = lo + (hi - lo) * u
        return t, eps, p.marginal_sample(x0, t, eps)

    def example_points(self, x0, key):
        """``(x_t, t)`` of :meth:`example_losses` (:meth:`Objective.example_points`)."""
        t, _, xt = self._draws(x0, key)
        return xt, t


@static_pytree
@dataclasses.dataclass(frozen=True)
class EDMLoss(Objective):
    """The EDM training loss with log-normal noise levels (Karras et al. 2022, eq. 8).

    Fields:
      process: the noise process (``sigma`` below is its VE-frame level).
      P_mean, P_std: ``ln sigma ~ N(P_mean, P_std^2)`` (Table 1: -1.2, 1.2).
      sigma_data: data standard deviation of the weight (Table 1: 0.5).
      reduce: ``'mean'`` or ``'sum'`` over the data axes.
      p_uniform: share in ``[0, 1)`` of noise levels drawn log-uniformly over
        ``sigma_range`` instead of from the log-normal (:func:`edm_sigma`); 0 (the
        default) is EDM's loss exactly. The weight stays EDM's ``lambda(sigma)`` (unit
        weight on the network output at every sigma), so the floor changes only where
        the network is trained, not how much an example counts.
      sigma_range: ``(lo, hi)``, VE-frame noise levels of the log-uniform part (e.g. the
        sampler's ``(sigma_min, sigma_max)``); required when ``p_uniform > 0`` and
        refused when it is 0.

    Raises:
      ValueError: naming the field, unless ``P_mean`` is finite, ``P_std > 0``,
        ``sigma_data > 0``, ``reduce`` is known, ``0 <= p_uniform < 1``, and
        ``sigma_range`` is a pair ``0 < lo < hi < inf`` exactly when ``p_uniform > 0``.
    """

    process: Process
    P_mean: float = -1.2
    P_std: float = 1.2
    sigma_data: float = 0.5
    reduce: str = "mean"
    p_uniform: float = 0.0
    sigma_range: tuple[float, float] | None = None

    def __post_init__(self):
        inf = math.inf
        check_real(
            self.P_mean, "objective.P_mean", low=-inf, high=inf, low_open=True, high_open=True
        )
        check_real(self.P_std, "objective.P_std", low=0.0, low_open=True, high_open=True)
        check_real(self.sigma_data, "objective.sigma_data", low=0.0, low_open=True, high_open=True)
        check_choice(self.reduce, "objective.reduce", REDUCTIONS)
        p = check_real(self.p_uniform, "objective.p_uniform", low=0.0, high=1.0, high_open=True)
        object.__setattr__(self, "p_uniform", p)
        if p == 0.0:
            require(
                self.sigma_range is None,
                "objective.sigma_range",
                "null when objective.p_uniform is 0 (it is used only by the log-uniform part)",
                self.sigma_range,
            )
            return
        r = self.sigma_range
        require(
            r is not None and len(r) == 2,
            "objective.sigma_range",
            "a pair (lo, hi) of noise levels when objective.p_uniform > 0",
            r,
        )
        lo = check_real(r[0], "objective.sigma_range", low=0.0, low_open=True)
        hi = check_real(r[1], "objective.sigma_range", low=0.0, low_open=True)
        require(lo < hi, "objective.sigma_range", "a pair with lo < hi", tuple(r))
        object.__setattr__(self, "sigma_range", (lo, hi))

    def example_losses(self, source, x0, key):
        """``lambda(sigma) reduce((source.denoiser(x_t, t) - x0)^2)`` per example.

        ``sigma = exp(P_mean + P_std z)``, ``z ~ N(0, 1)``, ``t = t_of_ve_sigma(sigma)`` and
        ``x_t = alpha(t) (x0 + sigma n)`` with ``z, n`` from each example's own key;
        ``lambda`` is :func:`scorelib.objectives.weights.edm_weight`. With ``p_uniform >
        0`` the example's scalar draw is a uniform ``u`` instead of ``z`` and ``sigma =
        edm_sigma(u, ...)``.

        Args:
          source: a score source; its ``denoiser`` is trained (data units).
          x0: ``[batch, *data_shape]`` clean data (data units).
          key: the step's PRNG key.

        Returns:
          ``(losses [batch], {"sigma": [batch]})``, ``sigma`` the VE-frame noise levels.
        """
        sigma, t, xt = self._draws(x0, key)
        err = reduce_per_example((source.denoiser(xt, t) - x0) ** 2, self.reduce)
        return edm_weight(ve_sigma=sigma, sigma_data=self.sigma_data) * err, {"sigma": sigma}

    def _draws(self, x0, key):
        """``(sigma [batch], t [batch], x_t)`` of :meth:`example_losses`."""
        p = self.process
        if self.p_uniform == 0.0:  # EDM's draws exactly (z ~ N(0, 1) from the example's key)
            z, n = example_draws(key, x0, "normal")
            sigma = log_normal_sigma(z, P_mean=self.P_mean, P_std=self.P_std)
        else:
            u, n = example_draws(key, x0, "uniform")
            sigma = edm_sigma(
                u,
                P_mean=self.P_mean,
                P_std=self.P_std,
                p_uniform=self.p_uniform,
                sigma_range=self.sigma_range,
            )
        t = p.t_of_ve_sigma(sigma)
        alpha = broadcast_to_data(p.alpha(t), x0)
        return sigma, t, alpha * (x0 + broadcast_to_data(sigma, x0) * n)

    def example_points(self, x0, key):
        """``(x_t, t)`` of :meth:`example_losses` (:meth:`Objective.example_points`)."""
        _, t, xt = self._draws(x0, key)
        return xt, t


def edm_loss_like(objective) -> EDMLoss:
    """The :class:`EDMLoss` with ``objective``'s ``process, P_mean, P_std, sigma_data, reduce``
    (the EDM term or draws of an objective built on it: SURE, Cas-DM's loss)."""
    return EDMLoss(
        process=objective.process,
        P_mean=objective.P_mean,
        P_std=objective.P_std,
        sigma_data=objective.sigma_data,
        reduce=objective.reduce,
    )
