"""Target score matching (TSM) and DSM/TSM mixtures.

De Bortoli, Hutchinson, Wirnsberger, Doucet, "Target score matching", arXiv
2402.08667 (2024); ``shared/methods/02-target-score-matching.md``. With
``x_t = alpha x_0 + sigma eps`` and a target whose clean score ``grad log p_0`` is
known, two regression labels have the noisy score ``s_t(x_t)`` as their
conditional mean (Sec. 2, the denoising and target score identities):

* DSM label  ``u_dsm = (alpha x_0 - x_t) / sigma^2 = -eps / sigma``; its conditional
  variance grows like ``d / sigma^2`` as ``sigma -> 0``;
* TSM label  ``u_tsm = grad log p_0(x_0) / alpha``; its conditional variance
  vanishes as ``sigma -> 0`` (the posterior of ``x_0`` concentrates) but it is poor
  at high noise (in VP, ``1 / alpha`` blows up).

Any convex combination ``u = kappa u_tsm + (1 - kappa) u_dsm`` is also unbiased.
The per-example loss is ``lambda(t) reduce((s_theta(x_t, t) - u)^2)``.

``kappa`` is a function of the VE-frame noise level ``sigma_ve = sigma(t) /
alpha(t)`` (``process.ve_sigma(t)``; equal to ``sigma(t)`` for VE and EDM), so one
set of thresholds means the same thing under every process:

* ``'tsm'``: ``kappa = 1`` (pure TSM); ``'dsm'``: ``kappa = 0`` (pure DSM, identical
  to :class:`scorelib.objectives.DSM` with the same key and time sampling);
* ``'switch'``: ``kappa = 1`` when ``sigma_ve < sigma_switch``, else 0;
* ``'log_linear'``: 1 below ``sigma_lo``, 0 above ``sigma_hi``, linear in
  ``log sigma_ve`` between;
* ``'gaussian_optimal'``: ``kappa = alpha^2 sigma_d^2 / (alpha^2 sigma_d^2 +
  sigma^2) = sigma_d^2 / (sigma_d^2 + sigma_ve^2)``, which makes the label exactly
  the score (zero variance) for ``p_0 = N(mu, sigma_d^2 I)`` (``methods/02`` Sec. 2.3,
  derived there and checked in ``tests/tsm``). ``sigma_d`` defaults to the target's
  ``sigma_data``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from scorelib.objectives.base import (
    REDUCTIONS,
    Objective,
    example_draws,
    reduce_per_example,
    register,
)
from scorelib.objectives.dsm import DSM, DSM_WEIGHTINGS
from scorelib.processes.base import Process, broadcast_to_data

Array = Any

KAPPAS = ("tsm", "dsm", "switch", "log_linear", "gaussian_optimal")
T_SAMPLINGS = ("uniform", "log_sigma")
WEIGHTINGS = DSM_WEIGHTINGS + ("alpha2", "relative", "kappa")


def kappa_schedule(
    kind: str,
    sigma_ve: Array,
    *,
    sigma_switch: float = 0.1,
    sigma_lo: float = 0.01,
    sigma_hi: float = 1.0,
    sigma_d: float = 1.0,
) -> Array:
    """The TSM weight ``kappa`` in [0, 1] at VE-frame noise levels ``sigma_ve`` (any shape).

    See the module docstring for the kinds. Raises ``ValueError`` for an unknown kind.
    """
    sigma_ve = jnp.asarray(sigma_ve)
    if kind == "tsm":
        return jnp.ones_like(sigma_ve)
    if kind == "dsm":
        return jnp.zeros_like(sigma_ve)
    if kind == "switch":
        return (sigma_ve < sigma_switch).astype(sigma_ve.dtype)
    if kind == "log_linear":
        frac = (math.log(sigma_hi) - jnp.log(sigma_ve)) / (math.log(sigma_hi) - math.log(sigma_lo))
        return jnp.clip(frac, 0.0, 1.0)
    if kind == "gaussian_optimal":
        sd2 = sigma_d**2
        return sd2 / (sd2 + sigma_ve**2)
    raise ValueError(f"objective.kappa must be one of {list(KAPPAS)}; got {kind!r}")


@register
@dataclasses.dataclass(frozen=True)
class MixedScoreMatching(Objective):
    """DSM/TSM mixture ``u = kappa u_tsm + (1 - kappa) u_dsm`` on any process.

    Fields:
      process: the noise process (VE, VP, sub-VP, EDM).
      target: a :class:`scorelib.data.targets.Target` (its ``score`` gives
        ``grad log p_0``; ``x0`` batches come from outside, e.g. ``target.batch``).
      kappa: ``'tsm' | 'dsm' | 'switch' | 'log_linear' | 'gaussian_optimal'``.
      sigma_switch: VE-frame threshold of ``'switch'`` (TSM strictly below it).
      sigma_lo, sigma_hi: VE-frame thresholds of ``'log_linear'``, ``0 < lo < hi``.
      sigma_d: data std of ``'gaussian_optimal'``; ``None`` -> ``target.sigma_data``.
      weighting: ``lambda(t)``: ``'sigma2'`` (``sigma(t)^2``, default), ``'likelihood'``
        (``g(t)^2``) or ``'none'`` (1), exactly as :class:`scorelib.objectives.DSM`; or
        ``'alpha2'`` (``alpha(t)^2``), which makes pure TSM the normalised form
        ``||alpha s_theta - grad log p_0(x_0)||^2`` (``methods/02`` Sec. 2.2) and weights
        every noise level by the size of its score rather than of its DSM label noise
        (equal to ``'none'`` for VE and EDM). ``'sigma2'`` suits labels whose variance
        grows like ``1/sigma^2`` (DSM); ``'alpha2'`` suits labels whose variance stays
        bounded as ``sigma -> 0`` (TSM, and the mixtures whose ``kappa -> 1`` there).
        ``'relative'``: ``alpha^2 (sigma_d^2 + sigma_ve^2) / sigma_d^2``, the inverse of the
        mean squared score of ``N(0, sigma_d^2 I)`` data per coordinate, so that every noise
        level counts by its *relative* score error: ``alpha^2`` at low noise and
        ``sigma^2 / sigma_d^2`` at high noise (EDM's weighting of the denoiser, Karras et
        al. 2022 Table 1, written for the score, is ``sigma_ve^2`` times this).
        ``'kappa'``: ``kappa alpha^2 + (1 - kappa) sigma^2``, each label's own weighting in
        proportion to its share of the mixed label (``'alpha2'`` for pure TSM, ``'sigma2'``
        for pure DSM); our choice for the mixtures, not the paper's.
      reduce: ``'mean'`` or ``'sum'`` over the data axes.
      t_range: ``(lo, hi)`` process times to sample; default ``(t_min, t_max)``.
      t_sampling: ``'uniform'`` in ``t`` (like DSM) or ``'log_sigma'``: ``log
        sigma_ve`` uniform between ``ve_sigma(lo)`` and ``ve_sigma(hi)``, which gives
        every decade of noise the same share (the low-noise regime matters here).

    ``per_example(source, x0, key) -> (loss [batch], aux)`` with ``aux`` holding
    ``t``, ``sigma_ve`` and ``kappa`` (each ``[batch]``).

    Raises:
      ValueError: naming the field, for an unknown ``kappa``/``weighting``/
        ``reduce``/``t_sampling``, thresholds that are not positive or out of order,
        a non-positive ``sigma_d``, or a ``t_range`` outside the process range.
    """

    process: Process
    target: Any
    kappa: str = "gaussian_optimal"
    sigma_switch: float = 0.1
    sigma_lo: float = 0.01
    sigma_hi: float = 1.0
    sigma_d: float | None = None
    weighting: str = "sigma2"
    reduce: str = "mean"
    t_range: tuple[float, float] | None = None
    t_sampling: str = "uniform"

    def __post_init__(self):
        if self.kappa not in KAPPAS:
            raise ValueError(f"objective.kappa must be one of {list(KAPPAS)}; got {self.kappa!r}")
        if self.target is None or not hasattr(self.target, "score"):
            raise ValueError(f"objective.target must be a target with a score; got {self.target!r}")
        for f in ("sigma_switch", "sigma_lo", "sigma_hi"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"objective.{f} must be a number > 0; got {v!r}")
            object.__setattr__(self, f, float(v))
        if not self.sigma_lo < self.sigma_hi:
            raise ValueError(
                "objective.sigma_lo must be < objective.sigma_hi; got "
                f"{self.sigma_lo} >= {self.sigma_hi}"
            )
        if self.sigma_d is not None:
            if not (isinstance(self.sigma_d, (int, float)) and self.sigma_d > 0):
                raise ValueError(f"objective.sigma_d must be > 0 or null; got {self.sigma_d!r}")
            object.__setattr__(self, "sigma_d", float(self.sigma_d))
        if self.weighting not in WEIGHTINGS:
            raise ValueError(
                f"objective.weighting must be one of {list(WEIGHTINGS)}; got {self.weighting!r}"
            )
        if self.reduce not in REDUCTIONS:
            raise ValueError(
                f"objective.reduce must be one of {list(REDUCTIONS)}; got {self.reduce!r}"
            )
        if self.t_sampling not in T_SAMPLINGS:
            raise ValueError(
                f"objective.t_sampling must be one of {list(T_SAMPLINGS)}; got {self.t_sampling!r}"
            )
        if self.t_range is not None:
            lo, hi = (float(v) for v in self.t_range)
            if not (self.process.t_min <= lo <= hi <= self.process.t_max):
                raise ValueError(
                    f"objective.t_range must satisfy {self.process.t_min} <= lo <= hi <= "
                    f"{self.process.t_max}; got {tuple(self.t_range)}"
                )
            object.__setattr__(self, "t_range", (lo, hi))

    # --- pieces ----------------------------------------------------------------
    @property
    def data_std(self) -> float:
        """``sigma_d`` used by ``'gaussian_optimal'``."""
        return self.sigma_d if self.sigma_d is not None else float(self.target.sigma_data)

    def kappa_of(self, sigma_ve: Array) -> Array:
        """``kappa`` at VE-frame noise levels (any shape)."""
        return kappa_schedule(
            self.kappa,
            sigma_ve,
            sigma_switch=self.sigma_switch,
            sigma_lo=self.sigma_lo,
            sigma_hi=self.sigma_hi,
            sigma_d=self.data_std if self.kappa == "gaussian_optimal" else 1.0,
        )

    def weight(self, t: Array) -> Array:
        """``lambda(t)``: ``[batch]`` (DSM's weightings, and ``alpha(t)^2``)."""
        if self.weighting == "alpha2":
            return self.process.alpha(t) ** 2
        if self.weighting == "kappa":
            k = self.kappa_of(self.process.ve_sigma(t))
            return k * self.process.alpha(t) ** 2 + (1.0 - k) * self.process.sigma(t) ** 2
        if self.weighting == "relative":
            sd2 = self.data_std**2
            return self.process.alpha(t) ** 2 * (sd2 + self.process.ve_sigma(t) ** 2) / sd2
        return DSM(self.process, weighting=self.weighting).weight(t)

    def times(self, u: Array) -> Array:
        """Training times ``[batch]`` from uniforms ``u: [batch]`` in [0, 1), per
        ``t_range`` and ``t_sampling`` (uniform in t, or log-uniform in VE-frame sigma)."""
        p = self.process
        lo, hi = self.t_range if self.t_range is not None else (p.t_min, p.t_max)
        if self.t_sampling == "uniform":
            return lo + (hi - lo) * u
        log_lo = jnp.log(p.ve_sigma(jnp.asarray(lo, u.dtype)))
        log_hi = jnp.log(p.ve_sigma(jnp.asarray(hi, u.dtype)))
        t = p.t_of_ve_sigma(jnp.exp(log_lo + u * (log_hi - log_lo)))
        return jnp.clip(t, lo, hi).astype(u.dtype)

    def sample_t(self, key: jax.Array, batch: int, dtype=jnp.float32) -> Array:
        """``batch`` training times from one key (see :meth:`times`)."""
        return self.times(jax.random.uniform(key, (batch,), dtype=dtype))

    def labels(self, x0: Array, t: Array, eps: Array) -> dict[str, Array]:
        """The regression labels at given ``x0: [b, d]``, ``t: [b]``, ``eps: [b, d]``.

        Returns a dict with ``xt``, ``u_dsm = -eps / sigma``, ``u_tsm = score_p0(x0) /
        alpha``, ``kappa [b]``, ``sigma_ve [b]`` and the mixed label
        ``u = kappa u_tsm + (1 - kappa) u_dsm`` (arrays ``[b, d]`` unless noted).
        """
        p = self.process
        xt = p.marginal_sample(x0, t, eps)
        alpha = broadcast_to_data(p.alpha(t), x0)
        sigma = broadcast_to_data(p.sigma(t), x0)
        sigma_ve = p.ve_sigma(t)
        kappa = self.kappa_of(sigma_ve)
        k = broadcast_to_data(kappa, x0)
        u_dsm = -eps / sigma
        if self.kappa == "dsm":  # never touch the target score (it may be expensive or absent)
            u_tsm = jnp.zeros_like(x0)
            u = u_dsm
        else:
            u_tsm = self.target.score(x0) / alpha
            u = u_tsm if self.kappa == "tsm" else k * u_tsm + (1.0 - k) * u_dsm
        return {
            "xt": xt,
            "u_dsm": u_dsm,
            "u_tsm": u_tsm,
            "u": u,
            "kappa": kappa,
            "sigma_ve": sigma_ve,
        }

    def per_example(self, source, x0, key):
        """``lambda(t) reduce((source.score(x_t, t) - u)^2)``: ``([batch], aux)``.

        Args:
          source: a score source (e.g. a ``NetworkScore`` being trained).
          x0: ``[batch, d]`` clean samples of the target.
          key: PRNG key; per-example draws as in :class:`DSM` (``example_draws``).
        """
        u, eps = example_draws(key, x0, "uniform")
        t = self.times(u)
        lab = self.labels(x0, t, eps)
        err = reduce_per_example((source.score(lab["xt"], t) - lab["u"]) ** 2, self.reduce)
        return self.weight(t) * err, {"t": t, "sigma_ve": lab["sigma_ve"], "kappa": lab["kappa"]}


@register
@dataclasses.dataclass(frozen=True)
class TSM(MixedScoreMatching):
    """Pure target score matching: :class:`MixedScoreMatching` with ``kappa='tsm'``.

    Raises:
      ValueError: if ``kappa`` is anything but ``'tsm'`` (use MixedScoreMatching).
    """

    kappa: str = "tsm"

    def __post_init__(self):
        if self.kappa != "tsm":
            raise ValueError(
                f"objective.kappa of TSM must be 'tsm'; got {self.kappa!r} (use MixedScoreMatching)"
            )
        super().__post_init__()


def label_residuals(objective: MixedScoreMatching, truth, x0: Array, t: Array, eps: Array) -> dict:
    """Squared distance of each regression label to the true noisy score, per example.

    Since ``E[u | x_t] = s_t(x_t)`` for every label, the mean of ``||u - s_t(x_t)||^2``
    over ``(x_0, eps)`` is the conditional label variance ``E_{x_t} tr Cov[u | x_t]``:
    the part of the loss no model can remove, and the noise in its gradient
    (De Bortoli et al. 2024, Sec. 2; ``methods/02`` Sec. 2.2).

    Args:
      objective: a :class:`MixedScoreMatching` (its ``kappa`` gives ``u``).
      truth: a score source of the exact noisy score under ``objective.process``
        (e.g. ``target.noisy_score(process)``).
      x0: ``[b, d]`` clean samples; t: ``[b]`` process times; eps: ``[b, d]`` noise.

    Returns:
      ``{"u", "u_dsm", "u_tsm"}`` -> ``[b]`` squared Euclidean norms (summed over the data
      axes, so DSM's grows like ``d / sigma_ve^2`` at low noise).
    """
    lab = objective.labels(x0, t, eps)
    s = truth.score(lab["xt"], t)
    if objective.kappa == "dsm":  # u_tsm was not computed
        lab = {**lab, "u_tsm": objective.replace(kappa="tsm").labels(x0, t, eps)["u_tsm"]}
    return {
        k: jnp.sum((lab[k] - s) ** 2, axis=tuple(range(1, x0.ndim)))
        for k in ("u", "u_dsm", "u_tsm")
    }
