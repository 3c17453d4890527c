"""Time-dependent importance reweighting of the EDM loss for a biased training set (TIW-DSM).

Kim, Na, Kim and Moon (ICLR 2024), "Training unbiased diffusion models from biased dataset"
(code: ``alsdudrla10/TIW-DSM``). The training examples come from a biased law ``q``; a small
reference set comes from the unbiased law ``p``. With the time-dependent density ratio of
the noised laws ``w_t(x) = p_t(x) / q_t(x)`` (``x_t = alpha(t) (x0 + sigma n)``), per
example ``x0 ~ q``::

    lambda(sigma) w_t(x_t) reduce((D(x_t, t) - x0 - alpha sigma^2 grad_x log w_t(x_t))^2)

is the EDM loss (Karras et al. 2022, eq. 8) on ``p`` up to a constant that does not depend
on the network. In score units the bracket is ``s - grad log q(x_t | x0) - grad log w_t``
times ``sigma_t^2 / alpha`` (``sigma_t = alpha sigma``), and ``E_q[w_t(x_t) f(x_t, x0)] =
E_p[f]`` for any ``f`` whose ``x0``-dependence is through ``q(x0 | x_t)``: the reweighting
turns the ``x_t``-marginal into ``p_t``, and the correction turns the regression target
``E_q[grad log q(x_t | x0) | x_t] = grad log q_t`` into ``grad log q_t + grad log w_t = grad
log p_t``. The correction is what removes the bias: with the weight alone
(``mode='reweight'``) the pointwise minimiser is still ``q``'s score (``w_t`` depends on
``x_t`` only, so it cancels); with the correction alone the pointwise minimiser is ``p``'s
score too, but its errors are weighted by ``q_t`` instead of ``p_t`` (the same at infinite
capacity, not for a finite network). ``mode='iw'`` is the
time-independent importance weighting the paper compares with: weight ``w_0(x0)`` (the
ratio of the clean laws, read at the process's first time), no correction; it is unbiased
too, with the ratio of the clean laws, which a discriminator estimates worst.

The ratio is an explicit pytree (:class:`ExactLogRatio` for two mixtures, the tests' oracle;
:class:`ClassifierLogRatio` for a noise-conditional discriminator,
``scorelib.scores.NoisyClassifier`` trained to tell reference (class 1) from biased (class
0) examples). The weight goes through f-distill's pipeline
(:func:`scorelib.distill.ratio.ratio_from_logits`: clamped log ratio, clipped ratio, no
gradient); the correction uses the unclipped ``grad_x log w_t`` (clipping it would move the
minimiser). Stop-gradient: the ratio's parameters are not trained here. Like the smoothed
objective, this one holds arrays (the discriminator's parameters), so it is a pytree, not a
static objective.

The released code differs (noted here, not copied): its weight is ``2 d`` and its target
correction ``sigma^2 grad_x d`` with ``d`` the discriminator's probability, not ``log w``;
this module implements the paper's objective, checked against the exact ratio of two
Gaussians in ``tests/objectives/test_tiw.py``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from scorelib._checks import check_choice, check_int, check_real, require
from scorelib.distill.ratio import ratio_from_logits
from scorelib.objectives.base import Objective, example_draws, reduce_per_example
from scorelib.objectives.dsm import EDMLoss
from scorelib.objectives.weights import edm_weight
from scorelib.processes.base import broadcast_to_data
from scorelib.processes.noise_levels import log_normal_sigma

Array = Any

#: What the ratio does in the loss (module docstring).
MODES = ("tiw", "reweight", "iw")


class ExactLogRatio(struct.PyTreeNode):
    """``log w_t(x) = log p_t(x) - log q_t(x)`` of two sources with a ``log_prob(x, t)``
    (e.g. two :class:`scorelib.scores.MixtureScore` on the same process): the oracle.

    Fields:
      reference: the unbiased law's source (``p``).
      biased: the training law's source (``q``).

    Raises:
      ValueError: naming ``reference``/``biased`` (no ``log_prob``, or another process than
        the other's: their times would mean different noise levels).
    """

    reference: Any = None
    biased: Any = None

    def __post_init__(self):
        for name in ("reference", "biased"):
            src = getattr(self, name)
            require(
                callable(getattr(src, "log_prob", None)),
                name,
                "a source with log_prob(x, t) (e.g. a MixtureScore)",
                type(src).__name__,
            )
        require(
            self.reference.process == self.biased.process,
            "biased",
            f"a source on the reference's process ({self.reference.process})",
            self.biased.process,
        )

    @property
    def process(self):
        """The two sources' process."""
        return self.reference.process

    def log_ratio(self, x: Array, t: Array) -> Array:
        """``[batch]`` ``log p_t(x) - log q_t(x)`` at ``x: [batch, *data_shape]``, ``t``."""
        return self.reference.log_prob(x, t) - self.biased.log_prob(x, t)


class ClassifierLogRatio(struct.PyTreeNode):
    """``log w_t(x) = logit_ref(x, t) - logit_biased(x, t) - log(n_ref / n_biased)`` of a
    noise-conditional classifier trained by cross-entropy to tell reference examples
    (class ``reference``) from biased ones (class ``biased``): at the optimum of the loss the
    logit difference is ``log(n_ref p_t / (n_biased q_t))``, with ``n`` each class's share of
    the classifier's training batches (``prior_log_odds = log(n_ref / n_biased)``, 0 for
    balanced batches).

    Fields:
      classifier: a ``scorelib.scores.NoisyClassifier`` (its ``logits(x, t)``).
      reference, biased: the two class indices (static).
      prior_log_odds: ``log(n_ref / n_biased)`` of its training batches (static).
    """

    classifier: Any = None
    reference: int = struct.field(pytree_node=False, default=1)
    biased: int = struct.field(pytree_node=False, default=0)
    prior_log_odds: float = struct.field(pytree_node=False, default=0.0)

    @property
    def process(self):
        """The classifier's process (``None`` when it has none)."""
        return getattr(self.classifier, "process", None)

    def log_ratio(self, x: Array, t: Array) -> Array:
        """``[batch]`` log ratio at ``x: [batch, *data_shape]``, ``t``."""
        logits = self.classifier.logits(x, t)
        return logits[:, self.reference] - logits[:, self.biased] - self.prior_log_odds


def grad_log_ratio(log_ratio, x: Array, t: Array) -> Array:
    """``grad_x log w_t(x)``, ``[batch, *data_shape]`` (example ``b``'s log ratio depends on
    ``x[b]`` only, so the gradient of the batch sum is each example's own)."""
    return jax.grad(lambda z: jnp.sum(log_ratio.log_ratio(z, t)))(x)


class TIWLoss(Objective, struct.PyTreeNode):
    """The EDM loss on a biased training set, reweighted (and corrected) by a density ratio
    (TIW-DSM, Kim et al., ICLR 2024; module docstring). Losses are per example in the EDM
    loss's units (``lambda(sigma)`` times squared data units), ``[batch]``.

    Fields:
      process: the noise process (``sigma`` is its VE-frame level).
      log_ratio: an :class:`ExactLogRatio` or :class:`ClassifierLogRatio` (a pytree).
      mode: ``'tiw'`` (weight ``w_t(x_t)`` and the score correction), ``'reweight'`` (the
        weight only: learns the biased law), or ``'iw'`` (time-independent weight
        ``w_0(x0)``, no correction).
      P_mean, P_std, sigma_data, reduce: the EDM loss's (:class:`EDMLoss`).
      logit_clip, ratio_min, ratio_max: the weight's clipping
        (:func:`~scorelib.distill.ratio.ratio_from_logits`).

    Raises:
      ValueError: naming ``objective.<field>`` (``mode`` unknown, the EDM loss's fields out
        of range, ``0 < ratio_min < ratio_max``, ``logit_clip > 0``), or ``objective.log_ratio``
        for an object without ``log_ratio(x, t)``.
    """

    process: Any = struct.field(pytree_node=False, default=None)
    log_ratio: Any = None
    mode: str = struct.field(pytree_node=False, default="tiw")
    P_mean: float = struct.field(pytree_node=False, default=-1.2)
    P_std: float = struct.field(pytree_node=False, default=1.2)
    sigma_data: float = struct.field(pytree_node=False, default=0.5)
    reduce: str = struct.field(pytree_node=False, default="mean")
    logit_clip: float = struct.field(pytree_node=False, default=10.0)
    ratio_min: float = struct.field(pytree_node=False, default=0.01)
    ratio_max: float = struct.field(pytree_node=False, default=100.0)

    def __post_init__(self):
        require(self.process is not None, "objective.process", "a noise process", None)
        EDMLoss(  # the EDM loss's own checks, one home for them
            self.process, self.P_mean, self.P_std, self.sigma_data, self.reduce
        )
        check_choice(self.mode, "objective.mode", MODES)
        require(
            callable(getattr(self.log_ratio, "log_ratio", None)),
            "objective.log_ratio",
            "an object with log_ratio(x, t) (ExactLogRatio, ClassifierLogRatio)",
            type(self.log_ratio).__name__,
        )
        own = getattr(self.log_ratio, "process", None)
        require(
            own is None or own == self.process,
            "objective.log_ratio",
            f"a ratio on the objective's process ({self.process}): its times are noise levels",
            own,
        )
        check_real(self.logit_clip, "objective.logit_clip", low=0.0, low_open=True)
        lo = check_real(self.ratio_min, "objective.ratio_min", low=0.0, low_open=True)
        hi = check_real(self.ratio_max, "objective.ratio_max", low=0.0, low_open=True)
        require(lo < hi, "objective.ratio_max", f"a number > objective.ratio_min ({lo})", hi)

    def weights(self, x: Array, t: Array) -> Array:
        """``[batch]`` clipped ratios ``w_t(x)`` (no gradient)."""
        logr = self.log_ratio.log_ratio(x, t)[:, None]
        return ratio_from_logits(
            logr, logit_clip=self.logit_clip, ratio_min=self.ratio_min, ratio_max=self.ratio_max
        )

    def weights_at(self, x0: Array, sigma: float, noise: Array) -> Array:
        """``[batch]`` weights ``w_t(x_t)`` of clean examples ``x0: [batch, *data_shape]``
        noised at VE level ``sigma`` with standard normals ``noise`` (``x_t = alpha(t) (x0 +
        sigma noise)``): the weights the loss gives them at that noise level, for
        diagnostics.

        Raises:
          ValueError: naming ``sigma`` (not > 0) or ``noise`` (another shape than ``x0``).
        """
        sigma = check_real(sigma, "sigma", low=0.0, low_open=True)
        x0, noise = jnp.asarray(x0), jnp.asarray(noise, jnp.asarray(x0).dtype)
        require(noise.shape == x0.shape, "noise", f"of x0's shape {x0.shape}", noise.shape)
        p = self.process
        t = p.t_of_ve_sigma(jnp.full((x0.shape[0],), sigma, x0.dtype))
        xt = broadcast_to_data(p.alpha(t), x0) * (x0 + sigma * noise)
        return self.weights(xt, t)

    def example_losses(self, source, x0, key):
        """Per example, by ``mode`` (module docstring), with EDM's draws of ``(sigma, n)``.

        Args:
          source: a score source; its ``denoiser`` is trained (data units).
          x0: ``[batch, *data_shape]`` biased training examples (data units).
          key: the step's PRNG key.

        Returns:
          ``(losses [batch], {"sigma": [batch], "weight": [batch]})``.
        """
        sigma, t, xt = self._draws(x0, key)
        p = self.process
        target = x0
        if self.mode == "iw":
            t0 = jnp.full_like(t, p.t_min)
            w = self.weights(x0 * broadcast_to_data(p.alpha(t0), x0), t0)
        else:
            w = self.weights(xt, t)
        if self.mode == "tiw":
            g = jax.lax.stop_gradient(grad_log_ratio(self.log_ratio, xt, t))
            scale = broadcast_to_data(p.alpha(t) * sigma**2, x0)
            target = x0 + scale * g
        err = reduce_per_example((source.denoiser(xt, t) - target) ** 2, self.reduce)
        loss = w * edm_weight(ve_sigma=sigma, sigma_data=self.sigma_data) * err
        return loss, {"sigma": sigma, "weight": w}

    def _draws(self, x0, key):
        z, n = example_draws(key, x0, "normal")
        sigma = log_normal_sigma(z, P_mean=self.P_mean, P_std=self.P_std)
        t = self.process.t_of_ve_sigma(sigma)
        alpha = broadcast_to_data(self.process.alpha(t), x0)
        return sigma, t, alpha * (x0 + broadcast_to_data(sigma, x0) * n)

    def example_points(self, x0, key):
        """``(x_t, t)`` of :meth:`example_losses`."""
        _, t, xt = self._draws(x0, key)
        return xt, t


def effective_sample_fraction(weights) -> float:
    """Kish's effective sample size of importance weights as a fraction of their number,
    ``(sum w)^2 / (n sum w^2)`` in ``(0, 1]`` (1: equal weights; ``1/n``: one weight holds
    everything): how much of a reweighted batch still trains.

    Raises:
      ValueError: naming ``weights`` (not a non-empty array of finite numbers >= 0, not all
        0).
    """
    w = np.asarray(weights, np.float64).reshape(-1)
    require(
        w.size >= 1 and bool(np.all(np.isfinite(w) & (w >= 0))) and w.sum() > 0,
        "weights",
        "a non-empty array of finite numbers >= 0, not all 0",
        w.size,
    )
    return float(w.sum() ** 2 / (w.size * np.sum(w**2)))


def classifier_log_ratio(classifier, *, n_reference: int, n_biased: int) -> ClassifierLogRatio:
    """The :class:`ClassifierLogRatio` of a two-class noise-conditional classifier trained on
    batches holding the reference (class 1) and biased (class 0) examples in the proportion
    ``n_reference : n_biased``.

    Raises:
      ValueError: naming ``n_reference``/``n_biased`` (integers >= 1) or ``classifier`` (not
        two classes).
    """
    a = check_int(n_reference, "n_reference", low=1)
    b = check_int(n_biased, "n_biased", low=1)
    require(
        classifier.num_classes == 2, "classifier", "a two-class classifier", classifier.num_classes
    )
    return ClassifierLogRatio(classifier=classifier, prior_log_odds=math.log(a / b))


__all__ = [
    "TIWLoss",
    "ExactLogRatio",
    "ClassifierLogRatio",
    "classifier_log_ratio",
    "effective_sample_fraction",
    "MODES",
]
