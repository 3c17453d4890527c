"""Target score matching (TSM) and DSM/TSM mixtures.

De Bortoli, Hutchinson, Wirnsberger, Doucet, "Target score matching", arXiv
2402.08667 (2024). With ``x_t = alpha x_0 + sigma eps`` and a target whose clean score
``grad log p_0`` is known, two regression labels have the noisy score ``s_t(x_t)`` as
their conditional mean (Sec. 2, the denoising and target score identities):

* DSM label  ``u_dsm = (alpha x_0 - x_t) / sigma^2 = -eps / sigma``; its conditional
  variance grows like ``d / sigma^2`` as ``sigma -> 0``;
* TSM label  ``u_tsm = grad log p_0(x_0) / alpha``; its conditional variance
  vanishes as ``sigma -> 0`` (the posterior of ``x_0`` concentrates) but it is poor
  at high noise (in VP, ``1 / alpha`` blows up).

Any convex combination ``u = kappa u_tsm + (1 - kappa) u_dsm`` is also unbiased.
The per-example loss is ``lambda(t) reduce((s_theta(x_t, t) - u)^2)``, with the weights
of ``scorelib/objectives/weights.py``.

``kappa`` is a function of the VE-frame noise level ``ve_sigma = sigma(t) / alpha(t)``
(``process.ve_sigma(t)``; equal to ``sigma(t)`` for VE and EDM), so one set of
thresholds means the same thing under every process:

* ``'tsm'``: ``kappa = 1`` (pure TSM); ``'dsm'``: ``kappa = 0`` (pure DSM, identical
  to :class:`scorelib.objectives.DSM` with the same key and time sampling);
* ``'switch'``: ``kappa = 1`` when ``ve_sigma < sigma_switch``, else 0;
* ``'log_linear'``: 1 below ``sigma_lo``, 0 above ``sigma_hi``, linear in
  ``log ve_sigma`` between;
* ``'gaussian_optimal'``: ``kappa = alpha^2 sigma_d^2 / (alpha^2 sigma_d^2 + sigma^2) =
  sigma_d^2 / (sigma_d^2 + ve_sigma^2)``, which makes the label exactly the score (zero
  variance) for ``p_0 = N(mu, sigma_d^2 I)``: there ``u_tsm = -(x_0 - mu) / (alpha
  sigma_d^2)`` and ``u_dsm = (alpha x_0 - x_t) / sigma^2`` are both linear in ``x_0``,
  and this ``kappa`` cancels the ``x_0`` terms of the mixture, leaving the Gaussian
  score ``-(x_t - alpha mu) / (alpha^2 sigma_d^2 + sigma^2)`` (checked in
  ``tests/tsm/test_tsm_objective.py``). ``sigma_d`` defaults to the target's
  ``sigma_data``.

Class-conditional models. The identities hold for each class's law: with ``x_0 ~ p_0(. |
c)``, ``E[grad_{x_0} log p_0(x_0 | c) / alpha | x_t, c] = grad log p_t(x_t | c)`` and the DSM
label is unchanged. So for a conditional source (labels bound by the train step,
``scorelib/training/step.py``) the TSM label of example ``b`` is its target's conditional
clean score ``target.score_given(x_0, c_b) / alpha`` (``scorelib/data/targets.py``), and for
an example whose label was dropped to the null label ``K`` the unconditional
``target.score(x_0) / alpha`` (``score_given`` gives it for ``K``): the data are drawn from
``p_0(. | c)`` and the null examples from the pooled ``p_0``, as label dropout trains them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

from scorelib._checks import check_choice, check_real, is_real, require
from scorelib._pytree import static_pytree
from scorelib.objectives.base import (
    REDUCTIONS,
    Objective,
    example_draws,
    reduce_per_example,
    source_labels,
)
from scorelib.objectives.dsm import check_t_range
from scorelib.objectives.weights import (
    DSM_WEIGHTINGS,
    alpha2_weight,
    dsm_weight,
    fisher_weight,
    kappa_weight,
    relative_weight,
)
from scorelib.processes.base import Process, broadcast_to_data

Array = Any

KAPPAS = ("tsm", "dsm", "switch", "log_linear", "gaussian_optimal")
T_SAMPLINGS = ("uniform", "log_sigma")
WEIGHTINGS = DSM_WEIGHTINGS + ("alpha2", "relative", "kappa", "fisher")


def kappa_schedule(
    kind: str,
    ve_sigma: Array,
    *,
    sigma_switch: float = 0.1,
    sigma_lo: float = 0.01,
    sigma_hi: float = 1.0,
    sigma_d: float = 1.0,
) -> Array:
    """The TSM share ``kappa`` in [0, 1] at VE-frame noise levels ``ve_sigma`` (any shape).

    Args:
      kind: one of :data:`KAPPAS` (see the module docstring).
      ve_sigma: VE-frame noise levels (data units, > 0).
      sigma_switch: threshold of ``'switch'`` (data units).
      sigma_lo, sigma_hi: thresholds of ``'log_linear'`` (data units, ``0 < lo < hi``).
      sigma_d: data standard deviation of ``'gaussian_optimal'`` (data units).

    Returns:
      ``kappa`` of the shape of ``ve_sigma``.

    Raises:
      ValueError: for an unknown ``kind`` (naming ``objective.kappa``).
    """
    check_choice(kind, "objective.kappa", KAPPAS)
    ve_sigma = jnp.asarray(ve_sigma)
    if kind == "tsm":
        return jnp.ones_like(ve_sigma)
    if kind == "dsm":
        return jnp.zeros_like(ve_sigma)
    if kind == "switch":
        return (ve_sigma < sigma_switch).astype(ve_sigma.dtype)
    if kind == "log_linear":
        frac = (math.log(sigma_hi) - jnp.log(ve_sigma)) / (math.log(sigma_hi) - math.log(sigma_lo))
        return jnp.clip(frac, 0.0, 1.0)
    sd2 = sigma_d**2  # gaussian_optimal
    return sd2 / (sd2 + ve_sigma**2)


@static_pytree
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
      sigma_d: data std of ``'gaussian_optimal'``, ``'relative'`` and ``'fisher'``;
        ``None`` -> ``target.sigma_data``.
      kappa_sigma_d: the ``sd`` of ``'gaussian_optimal'``'s kappa alone (data units, > 0),
        leaving the weighting's ``sigma_d``; ``None`` -> ``sigma_d``'s value. For a mixture
        of narrow modes the modes' scale (e.g. the Fisher scale) rather than the overall
        spread: the Gaussian optimum is exact for one isotropic Gaussian only.
      weighting: ``lambda(t)``: ``'sigma2'`` (``sigma(t)^2``, default), ``'likelihood'``
        (``g(t)^2``) or ``'none'`` (1), exactly as :class:`scorelib.objectives.DSM`; or
        ``'alpha2'`` (``alpha(t)^2``), ``'relative'``, ``'kappa'`` or ``'fisher'``
        (``scorelib/objectives/weights.py``). ``'sigma2'`` suits labels whose variance
        grows like ``1/sigma^2`` (DSM); ``'alpha2'`` suits labels whose variance stays
        bounded as ``sigma -> 0`` (TSM, and the mixtures whose ``kappa -> 1`` there).
        ``'fisher'`` is the unit weight of a network behind
        :func:`scorelib.nets.precond.fisher_precond` (train it with a
        ``NetworkScore(sigma_fisher=...)`` of the same ``sigma_d`` and ``sigma_fisher``).
      sigma_fisher: the data's Fisher length scale ``sqrt(d / E ||grad log p_0||^2)`` of
        ``'fisher'`` (data units); ``None`` -> ``target.fisher_scale()``. Refused with
        another weighting.
      reduce: ``'mean'`` or ``'sum'`` over the data axes.
      t_range: ``(lo, hi)`` process times to sample; default ``(t_min, t_max)``.
      t_sampling: ``'uniform'`` in ``t`` (like DSM) or ``'log_sigma'``: ``log
        ve_sigma`` uniform between ``ve_sigma(lo)`` and ``ve_sigma(hi)``, which gives
        every decade of noise the same share (the low-noise regime matters here).

    ``example_losses(source, x0, key) -> (losses [batch], aux)`` with ``aux`` holding
    ``t``, ``ve_sigma`` and ``kappa`` (each ``[batch]``).

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
    kappa_sigma_d: float | None = None
    weighting: str = "sigma2"
    reduce: str = "mean"
    t_range: tuple[float, float] | None = None
    t_sampling: str = "uniform"
    sigma_fisher: float | None = None

    def __post_init__(self):
        check_choice(self.kappa, "objective.kappa", KAPPAS)
        require(
            self.target is not None and hasattr(self.target, "score"),
            "objective.target",
            "a target with a score",
            self.target,
        )
        for f in ("sigma_switch", "sigma_lo", "sigma_hi"):
            v = check_real(getattr(self, f), f"objective.{f}", low=0.0, low_open=True)
            object.__setattr__(self, f, v)
        if not self.sigma_lo < self.sigma_hi:
            raise ValueError(
                "objective.sigma_lo must be < objective.sigma_hi; got "
                f"{self.sigma_lo} >= {self.sigma_hi}"
            )
        for f in ("sigma_d", "kappa_sigma_d"):
            v = getattr(self, f)
            if v is not None:
                require(is_real(v) and v > 0, f"objective.{f}", "> 0 or null", v)
                object.__setattr__(self, f, float(v))
        if self.kappa_sigma_d is not None:
            require(
                self.kappa == "gaussian_optimal",
                "objective.kappa_sigma_d",
                "null unless objective.kappa is 'gaussian_optimal' (the only one that uses it)",
                self.kappa_sigma_d,
            )
        check_choice(self.weighting, "objective.weighting", WEIGHTINGS)
        check_choice(self.reduce, "objective.reduce", REDUCTIONS)
        check_choice(self.t_sampling, "objective.t_sampling", T_SAMPLINGS)
        object.__setattr__(self, "t_range", check_t_range(self.t_range, self.process))
        if self.sigma_fisher is not None:
            require(
                self.weighting == "fisher",
                "objective.sigma_fisher",
                "null unless objective.weighting is 'fisher' (the only one that uses it)",
                self.sigma_fisher,
            )
            v = check_real(self.sigma_fisher, "objective.sigma_fisher", low=0.0, low_open=True)
            object.__setattr__(self, "sigma_fisher", v)
        elif self.weighting == "fisher":
            object.__setattr__(self, "sigma_fisher", float(self.target.fisher_scale()))

    # --- pieces ----------------------------------------------------------------
    @property
    def data_std(self) -> float:
        """``sigma_d`` (data units) used by ``'gaussian_optimal'``, ``'relative'`` and
        ``'fisher'``."""
        return self.sigma_d if self.sigma_d is not None else float(self.target.sigma_data)

    def kappa_of(self, ve_sigma: Array) -> Array:
        """``kappa`` at VE-frame noise levels ``ve_sigma`` (any shape; data units)."""
        return kappa_schedule(
            self.kappa,
            ve_sigma,
            sigma_switch=self.sigma_switch,
            sigma_lo=self.sigma_lo,
            sigma_hi=self.sigma_hi,
            sigma_d=self.kappa_data_std if self.kappa == "gaussian_optimal" else 1.0,
        )

    @property
    def kappa_data_std(self) -> float:
        """The ``sd`` of ``'gaussian_optimal'``'s kappa: ``kappa_sigma_d`` or :attr:`data_std`."""
        return self.kappa_sigma_d if self.kappa_sigma_d is not None else self.data_std

    def weight(self, t: Array) -> Array:
        """``lambda(t)`` at ``t: [batch]``: ``[batch]`` (``scorelib/objectives/weights.py``)."""
        p = self.process
        if self.weighting == "alpha2":
            return alpha2_weight(process=p, t=t)
        if self.weighting == "kappa":
            return kappa_weight(process=p, t=t, kappa=self.kappa_of(p.ve_sigma(t)))
        if self.weighting == "relative":
            return relative_weight(process=p, t=t, sigma_d=self.data_std)
        if self.weighting == "fisher":
            return fisher_weight(
                process=p, t=t, sigma_data=self.data_std, sigma_fisher=self.sigma_fisher
            )
        return dsm_weight(self.weighting, process=p, t=t)

    def times(self, u: Array) -> Array:
        """Training times ``[batch]`` from uniforms ``u: [batch]`` in [0, 1).

        ``t_sampling='uniform'``: ``t = lo + (hi - lo) u``; ``'log_sigma'``: ``log
        ve_sigma(t)`` uniform between ``log ve_sigma(lo)`` and ``log ve_sigma(hi)``
        (clipped to ``[lo, hi]`` against rounding), with ``(lo, hi) = t_range``.
        """
        p = self.process
        lo, hi = self.t_range if self.t_range is not None else (p.t_min, p.t_max)
        if self.t_sampling == "uniform":
            return lo + (hi - lo) * u
        log_lo = jnp.log(p.ve_sigma(jnp.asarray(lo, u.dtype)))
        log_hi = jnp.log(p.ve_sigma(jnp.asarray(hi, u.dtype)))
        t = p.t_of_ve_sigma(jnp.exp(log_lo + u * (log_hi - log_lo)))
        return jnp.clip(t, lo, hi).astype(u.dtype)

    def labels(
        self, x0: Array, t: Array, eps: Array, classes: Array | None = None
    ) -> dict[str, Array]:
        """The regression labels at given ``x0: [b, d]``, ``t: [b]``, ``eps: [b, d]``.

        Returns a dict with ``xt = alpha x0 + sigma eps``, ``u_dsm = -eps / sigma``,
        ``u_tsm = score_p0(x0) / alpha`` (zeros for ``kappa='dsm'``, where the target
        score is never evaluated), ``kappa [b]``, ``ve_sigma [b]`` and the mixed label
        ``u = kappa u_tsm + (1 - kappa) u_dsm`` (arrays ``[b, d]`` unless noted; labels
        in units of 1 / data). De Bortoli et al. 2024, Sec. 2.

        ``classes``: ``None`` (unconditional), or ``[b]`` int class labels in ``[0, K]`` of
        a conditional model (``K = target.num_classes`` the null label): then ``u_tsm =
        target.score_given(x0, classes) / alpha`` (module docstring).

        Raises:
          ValueError: naming ``data.labels`` when ``classes`` are given for a target
            without classes.
        """
        p = self.process
        xt = p.marginal_sample(x0, t, eps)
        alpha = broadcast_to_data(p.alpha(t), x0)
        sigma = broadcast_to_data(p.sigma(t), x0)
        ve_sigma = p.ve_sigma(t)
        kappa = self.kappa_of(ve_sigma)
        k = broadcast_to_data(kappa, x0)
        u_dsm = -eps / sigma
        if self.kappa == "dsm":  # never touch the target score (it may be expensive or absent)
            u_tsm = jnp.zeros_like(x0)
            u = u_dsm
        else:
            if classes is None:
                clean = self.target.score(x0)
            else:
                self.target.require_classes("the TSM label of a class-conditional model")
                clean = self.target.score_given(x0, classes)
            u_tsm = clean / alpha
            u = u_tsm if self.kappa == "tsm" else k * u_tsm + (1.0 - k) * u_dsm
        return {
            "xt": xt,
            "u_dsm": u_dsm,
            "u_tsm": u_tsm,
            "u": u,
            "kappa": kappa,
            "ve_sigma": ve_sigma,
        }

    def example_losses(self, source, x0, key):
        """``lambda(t) reduce((source.score(x_t, t) - u)^2)`` per example.

        With a conditional source (labels bound, e.g. by the train step) the TSM label of
        each example is its class's (:meth:`labels` with the bound labels as ``classes``).

        Args:
          source: a score source (e.g. a ``NetworkScore`` being trained).
          x0: ``[batch, d]`` clean samples of the target (data units).
          key: the step's PRNG key; per-example draws as in :class:`DSM`
            (:func:`scorelib.objectives.example_draws`).

        Returns:
          ``(losses [batch], {"t", "ve_sigma", "kappa"})`` (each ``[batch]``).

        Raises:
          ValueError: naming ``data.labels`` (a target without classes) or
            ``model.num_classes`` (not the target's number of classes) for a source with
            bound labels.
        """
        u, eps = example_draws(key, x0, "uniform")
        t = self.times(u)
        classes = source_labels(source, x0.shape[0])
        if classes is not None and self.kappa != "dsm":
            k = self.target.require_classes("the TSM label of a class-conditional model")
            require(
                source.num_classes == k,
                "model.num_classes",
                f"the target's number of classes ({k}) for its TSM label",
                source.num_classes,
            )
        lab = self.labels(x0, t, eps, classes)
        err = reduce_per_example((source.score(lab["xt"], t) - lab["u"]) ** 2, self.reduce)
        return self.weight(t) * err, {"t": t, "ve_sigma": lab["ve_sigma"], "kappa": lab["kappa"]}

    def example_points(self, x0, key):
        """``(x_t, t)`` of :meth:`example_losses` (:meth:`Objective.example_points`); the
        labels (and the target's score) are not computed."""
        u, eps = example_draws(key, x0, "uniform")
        t = self.times(u)
        return self.process.marginal_sample(x0, t, eps), t


@static_pytree
@dataclasses.dataclass(frozen=True)
class TSM(MixedScoreMatching):
    """Pure target score matching: :class:`MixedScoreMatching` with ``kappa='tsm'``.

    Raises:
      ValueError: if ``kappa`` is anything but ``'tsm'`` (use MixedScoreMatching).
    """

    kappa: str = "tsm"

    def __post_init__(self):
        require(
            self.kappa == "tsm",
            "objective.kappa of TSM",
            "'tsm' (use MixedScoreMatching for the others)",
            self.kappa,
        )
        super().__post_init__()


def label_residuals(
    objective: MixedScoreMatching,
    truth,
    x0: Array,
    t: Array,
    eps: Array,
    classes: Array | None = None,
) -> dict:
    """Squared distance of each regression label to the true noisy score, per example.

    Since ``E[u | x_t] = s_t(x_t)`` for every label, the mean of ``||u - s_t(x_t)||^2``
    over ``(x_0, eps)`` is the conditional label variance ``E_{x_t} tr Cov[u | x_t]``:
    the part of the loss no model can remove, and the noise in its gradient
    (De Bortoli et al. 2024, Sec. 2).

    Args:
      objective: a :class:`MixedScoreMatching` (its ``kappa`` gives ``u``).
      truth: a score source of the exact noisy score under ``objective.process``
        (e.g. ``target.noisy_score(process)``).
      x0: ``[b, d]`` clean samples; t: ``[b]`` process times; eps: ``[b, d]`` noise.
      classes: ``None``, or ``[b]`` class labels (``K`` null) of a conditional model; then
        ``truth`` is a conditional source (e.g. ``target.noisy_score(process,
        conditional=True)``) scored with them, against the class-conditional labels.

    Returns:
      ``{"u", "u_dsm", "u_tsm"}`` -> ``[b]`` squared Euclidean norms (summed over the data
      axes, so DSM's grows like ``d / sigma(t)^2`` at low noise; units of 1 / data^2).
    """
    lab = objective.labels(x0, t, eps, classes)
    s = truth.score(lab["xt"], t) if classes is None else truth.score_given(lab["xt"], t, classes)
    if objective.kappa == "dsm":  # u_tsm was not computed
        tsm = objective.replace(kappa="tsm").labels(x0, t, eps, classes)
        lab = {**lab, "u_tsm": tsm["u_tsm"]}
    return {
        k: jnp.sum((lab[k] - s) ** 2, axis=tuple(range(1, x0.ndim)))
        for k in ("u", "u_dsm", "u_tsm")
    }
