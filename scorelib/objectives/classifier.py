"""Objectives of a noise-conditional classifier ``log p_phi(c | x_t)`` (for classifier guidance).

Both draw, per example ``b`` from its own key ``fold_in(key, b)``
(:func:`scorelib.objectives.example_draws`), a uniform ``u`` and noise ``eps``, the VE noise
level ``sigma = edm_sigma(u)`` of the EDM loss (``ln sigma ~ N(P_mean, P_std^2)``, Karras et
al. 2022, eq. 8 and Table 1, optionally mixed with a log-uniform share ``p_uniform`` over
``sigma_range``: :func:`scorelib.processes.noise_levels.edm_sigma`; EDMLoss draws the same law
from a normal instead of a uniform), the time ``t = t_of_ve_sigma(sigma)`` and ``x_t = alpha(t)
x0 + sigma(t) eps``. A classifier is any object with ``class_log_prob(x, t, labels) ->
[batch]`` (:class:`scorelib.scores.classifier.NoisyClassifier`, or the exact
``PerClassScore.class_log_prob`` in tests).

* :class:`NoisyCrossEntropy`: ``-log p_phi(c | x_t)``, cross-entropy of the label on noised
  inputs, the recipe of score_sde's noise-conditional classifier (Song et al. 2021,
  App. I.4) and of Dhariwal and Nichol 2021 (Sec. 4.1).
* :class:`DLSM`: denoising likelihood score matching (Chao et al., ICLR 2022, "Denoising
  likelihood score matching for conditional score-based data generation", Sec. 3: Theorem 1
  and the loss with the score model in place of the true score; official code
  ``chen-hao-chao/dlsm``, ``losses.py``, ``get_sde_classifier_loss_fn``). The classifier's
  input gradient plus a *frozen* unconditional score must match the conditional DSM target::

      0.5 lambda(t) reduce(|grad_x log p_phi(c | x_t) + s(x_t, t) + eps / sigma(t)|^2)
        + ce_weight * (-log p_phi(c | x_t))

  By Bayes ``grad log p_t(x | c) = grad log p_t(x) + grad log p_t(c | x)``, so with the exact
  score this is conditional DSM in which only the classifier learns; its minimiser is the
  exact ``grad_x log p_t(c | x)`` (the DSM regression of ``-eps / sigma`` on ``(x_t, c)``
  minus ``s``). With a trained score ``s_theta`` the minimiser is ``s_c - s_theta``: the
  classifier also corrects the score's error at the classes.

  **Weighting.** ``lambda = sigma(t)^2`` by default (``weighting='sigma2'``, Song et al. 2021,
  Sec. 3.3): the target ``-eps / sigma`` has variance ``1 / sigma^2`` per coordinate, so
  ``sigma^2`` gives every noise level a residual of unit scale. The official code's default
  ``w = 0`` (its loss is ``0.5 mean|(g + s) sigma^w + eps sigma^(w - 1)|^2``, weight
  ``sigma^(2 w)``) is ``weighting='none'`` here: the low noise levels' ``1 / sigma^2`` then
  dominate the loss and its gradient variance; its ``w = 1`` is ``'sigma2'``. The
  cross-entropy term has unit weight (the official ``weighting_ce = 0``) and coefficient
  ``ce_weight`` (the official ``coef``, default 1: the paper's combined loss).

  **Reduction.** ``reduce='sum'`` over the data axes by default: the paper's squared norm.
  The official code takes ``torch.mean`` over every coordinate (``reduce='mean'``), which
  divides the DLSM term by the dimension ``d`` against the cross-entropy: on the 8x8 digits
  (``d = 64``) a ``'mean'`` DLSM classifier's input gradient came out within 0.1 % (relative
  squared error) of a cross-entropy classifier's trained with the same draws, i.e. the DLSM
  term did next to nothing, while ``'sum'`` changed it by 20-140 % at equal accuracy
  (``configs/experiment/digits_classifier_dlsm.yaml``).

  The frozen score gets no gradient (``lax.stop_gradient``); a class-conditional source is
  used at its null label (the unconditional score). The input gradient is that of the batch
  sum of ``class_log_prob`` (examples are independent), differentiated once more for the
  parameters.

Each objective's ``example_losses(classifier, x0, labels, key) -> (losses [batch], aux)`` and
``__call__(classifier, x0, labels, key) -> (loss, metrics)`` mirror
:class:`scorelib.objectives.Objective` with the labels added. They are pytrees (a
``DLSM``'s score source is a leaf, so a jitted step takes it as an argument, not as a
constant); their hyperparameters are static.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from scorelib._checks import check_choice, check_real, require
from scorelib.objectives.base import REDUCTIONS, example_draws, reduce_per_example
from scorelib.objectives.dsm import EDMLoss
from scorelib.objectives.weights import DSM_WEIGHTINGS, dsm_weight
from scorelib.processes.base import Process, broadcast_to_data
from scorelib.processes.noise_levels import edm_sigma
from scorelib.scores.base import ScoreSource
from scorelib.scores.conditional import ConditionalScore

Array = Any


def check_classifier(classifier) -> None:
    """Require an object with ``class_log_prob(x, t, labels)``.

    Raises:
      ValueError: naming ``classifier``.
    """
    require(
        callable(getattr(classifier, "class_log_prob", None)),
        "classifier",
        "a noise-conditional classifier (class_log_prob(x, t, labels) -> [batch])",
        type(classifier).__name__,
    )


class ClassifierObjective(struct.PyTreeNode):
    """The noise-level and noise draws shared by the classifier objectives (module docstring).

    Fields (static):
      process: the noise process.
      P_mean, P_std: ``ln sigma ~ N(P_mean, P_std^2)`` (EDM: -1.2, 1.2).
      p_uniform: share in ``[0, 1)`` of levels drawn log-uniformly over ``sigma_range``
        (VE levels ``(lo, hi)``, required exactly when ``p_uniform > 0``).

    Raises:
      ValueError: naming ``objective.<field>``, as :class:`scorelib.objectives.EDMLoss`
        (whose checks these are).
    """

    process: Process = struct.field(pytree_node=False)
    P_mean: float = struct.field(pytree_node=False, default=-1.2)
    P_std: float = struct.field(pytree_node=False, default=1.2)
    p_uniform: float = struct.field(pytree_node=False, default=0.0)
    sigma_range: tuple[float, float] | None = struct.field(pytree_node=False, default=None)

    def __post_init__(self):
        # the noise levels are the EDM loss's: its constructor is their one check
        levels = EDMLoss(
            process=self.process,
            P_mean=self.P_mean,
            P_std=self.P_std,
            p_uniform=self.p_uniform,
            sigma_range=self.sigma_range,
        )
        object.__setattr__(self, "P_mean", float(self.P_mean))
        object.__setattr__(self, "P_std", float(self.P_std))
        object.__setattr__(self, "p_uniform", levels.p_uniform)
        object.__setattr__(self, "sigma_range", levels.sigma_range)

    def draws(self, x0: Array, key: jax.Array) -> tuple[Array, Array, Array, Array]:
        """``(sigma [batch], t [batch], eps, x_t)``: the VE level, the process time, the noise
        and ``x_t = alpha(t) x0 + sigma(t) eps`` of each example (module docstring).

        Args:
          x0: ``[batch, *data_shape]`` clean data (data units).
          key: the step's PRNG key; example ``b`` draws from ``fold_in(key, b)``.
        """
        u, eps = example_draws(key, x0, "uniform")
        sigma = edm_sigma(
            u,
            P_mean=self.P_mean,
            P_std=self.P_std,
            p_uniform=self.p_uniform,
            sigma_range=self.sigma_range,
        )
        t = self.process.t_of_ve_sigma(sigma)
        return sigma, t, eps, self.process.marginal_sample(x0, t, eps)

    def example_losses(self, classifier, x0: Array, labels: Array, key) -> tuple[Array, dict]:
        """The loss of each example: ``(losses [batch], aux)``, ``aux`` a dict of ``[batch]``
        arrays.

        Args:
          classifier: an object with ``class_log_prob(x, t, labels) -> [batch]``.
          x0: ``[batch, *data_shape]`` clean data.
          labels: ``[batch]`` int classes of ``x0``.
          key: the step's PRNG key.
        """
        raise NotImplementedError

    def __call__(self, classifier, x0: Array, labels: Array, key) -> tuple[Array, dict]:
        """``(loss, metrics)``: the batch mean of :meth:`example_losses` and the batch means
        of its ``aux`` (with ``loss``).

        Raises:
          ValueError: naming ``classifier`` (no ``class_log_prob``) or ``labels`` (not
            ``[batch]``).
        """
        check_classifier(classifier)
        b = x0.shape[0]
        require(jnp.shape(labels) == (b,), "labels", f"of shape ({b},)", jnp.shape(labels))
        losses, aux = self.example_losses(classifier, x0, labels, key)
        require(losses.shape == (b,), "example_losses", f"of shape ({b},)", losses.shape)
        metrics = {k: jnp.mean(v) for k, v in aux.items()}
        metrics["loss"] = jnp.mean(losses)
        return metrics["loss"], metrics


def _cross_entropy(classifier, xt, t, labels) -> Array:
    """``-log p_phi(c | x_t)`` per example: ``[batch]`` (nats)."""
    return -classifier.class_log_prob(xt, t, labels)


class NoisyCrossEntropy(ClassifierObjective):
    """Cross-entropy of the label on noised inputs, ``-log p_phi(c | x_t)`` per example
    (module docstring; fields those of :class:`ClassifierObjective`)."""

    def example_losses(self, classifier, x0, labels, key):
        """``-log p_phi(c | x_t)`` per example (nats); ``aux``: ``{"sigma"}``, the VE levels.
        Arguments as :meth:`ClassifierObjective.example_losses`."""
        sigma, t, _, xt = self.draws(x0, key)
        ce = _cross_entropy(classifier, xt, t, labels)
        return ce, {"sigma": sigma}


def _null_score(score, x, t) -> Array:
    """The unconditional score of ``score`` at ``(x, t)``: a class-conditional source at its
    null label, any other source as it is."""
    if isinstance(score, ConditionalScore) and score.num_classes > 0:
        return score.score_given(x, t, score.null_labels(x.shape[0]))
    return score.score(x, t)


class DLSM(ClassifierObjective):
    """Denoising likelihood score matching plus cross-entropy (Chao et al., ICLR 2022; module
    docstring).

    Fields (besides :class:`ClassifierObjective`'s):
      score: the frozen unconditional score source (a leaf; e.g. a trained
        ``NetworkScore``, or the exact mixture score), on ``process``.
      weighting: ``lambda`` of the DLSM term: ``'sigma2'`` (default, ``sigma(t)^2``),
        ``'likelihood'`` (``g(t)^2``) or ``'none'`` (1, the official code's default)
        (:func:`scorelib.objectives.weights.dsm_weight`).
      ce_weight: the coefficient of the cross-entropy term (>= 0; 1 the paper's and the
        official default, 0 the DLSM term alone).
      reduce: ``'sum'`` (default, the paper's squared norm) or ``'mean'`` (the official
        code's) over the data axes.

    Raises:
      ValueError: naming ``objective.score`` (not a score source on ``process``),
        ``objective.weighting``, ``objective.ce_weight``, ``objective.reduce``, or the
        noise-level fields.
    """

    score: Any = None
    weighting: str = struct.field(pytree_node=False, default="sigma2")
    ce_weight: float = struct.field(pytree_node=False, default=1.0)
    reduce: str = struct.field(pytree_node=False, default="sum")

    def __post_init__(self):
        super().__post_init__()
        require(
            isinstance(self.score, ScoreSource) and self.score.process == self.process,
            "objective.score",
            f"a frozen score source on the classifier's process {self.process!r}",
            getattr(self.score, "process", type(self.score).__name__),
        )
        check_choice(self.weighting, "objective.weighting", DSM_WEIGHTINGS)
        w = check_real(self.ce_weight, "objective.ce_weight", low=0.0, high_open=True)
        object.__setattr__(self, "ce_weight", w)
        check_choice(self.reduce, "objective.reduce", REDUCTIONS)

    def input_gradient(self, classifier, xt: Array, t: Array, labels: Array):
        """``(log p_phi(c | x_t) [batch], grad_x log p_phi(c | x) at x_t)`` per example (nats,
        units 1 / data): one forward pass and the pullback of ones (the gradient of the batch
        sum; examples are independent)."""
        lp, pullback = jax.vjp(lambda y: classifier.class_log_prob(y, t, labels), xt)
        return lp, pullback(jnp.ones_like(lp))[0]

    def example_losses(self, classifier, x0, labels, key):
        """``0.5 lambda(t) reduce(|g + s + eps / sigma(t)|^2) + ce_weight CE`` per example,
        ``g`` the classifier's input gradient, ``s`` the frozen score (module docstring).

        Returns:
          ``(losses [batch], aux)`` with ``aux``: ``sigma`` (VE levels), ``dlsm`` (the first
          term) and ``ce`` (the cross-entropy, before ``ce_weight``).
        """
        sigma, t, eps, xt = self.draws(x0, key)
        log_p, g = self.input_gradient(classifier, xt, t, labels)
        s = jax.lax.stop_gradient(_null_score(jax.lax.stop_gradient(self.score), xt, t))
        sigma_t = broadcast_to_data(self.process.sigma(t), x0)
        err = reduce_per_example((g + s + eps / sigma_t) ** 2, self.reduce)
        dlsm = 0.5 * dsm_weight(self.weighting, process=self.process, t=t) * err
        ce = -log_p
        return dlsm + self.ce_weight * ce, {"sigma": sigma, "dlsm": dlsm, "ce": ce}


#: ``objective=<name>`` of ``experiments.train_classifier`` -> class.
CLASSIFIER_OBJECTIVES = {"ce": NoisyCrossEntropy, "dlsm": DLSM}
