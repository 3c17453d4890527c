"""SURE-Score: a score model learned from training data corrupted by known Gaussian noise.

Aali, Arvinte, Kumar and Tamir, "Solving inverse problems with score-based generative priors
learned from noisy data", arXiv 2305.01166, 2023. The training examples are ``y = x +
sigma_n n``, ``n ~ N(0, I)``, with ``sigma_n`` known and the clean ``x`` never seen
(:func:`scorelib.data.noisy.noisy_dataset`). One network, through its EDM denoiser ``D(x,
sigma)`` (and Tweedie's formula for the score), is trained with two terms per example:

1. **SURE** for the denoiser at the data's own noise level, ``h(y) = D(y, sigma_n)``.
   Stein's unbiased risk estimate (Stein, "Estimation of the mean of a multivariate normal
   distribution", Ann. Statist. 1981; Ramani, Blu and Unser, "Monte-Carlo SURE: a black-box
   optimization of regularization parameters for general denoising algorithms", IEEE TIP
   2008)::

       SURE(h, y) = |y - h(y)|^2 + 2 sigma_n^2 div h(y) - d sigma_n^2,
       E_n[SURE(h, x + sigma_n n)] = E_n |h(x + sigma_n n) - x|^2   for every x,

   so it is the denoiser's squared error against the clean data, computed without them
   (:func:`sure_risk`). Its minimiser over all ``h`` is the posterior mean ``E[x | y]``,
   which is what ``D(., sigma_n)`` means. ``div h`` is estimated with probes
   (:mod:`scorelib.divergence`): ``'jvp'`` ``b^T J b`` with ``J b`` by ``jax.jvp``, or
   ``'fd'`` ``b^T (h(y + eps b) - h(y)) / eps``, the paper's Monte-Carlo form.
2. **DSM on the denoised estimate** ``x_hat = h(y)``: the EDM loss (Karras et al. 2022,
   eq. 8; :class:`scorelib.objectives.EDMLoss`) with ``x_hat`` as the clean example, over
   EDM's log-normal noise levels, so that the network learns the score at every noise level
   of a distribution of denoised, not noisy, examples.

Per example (``reduce`` over the ``d`` coordinates, ``lambda`` EDM's weight
:func:`scorelib.objectives.weights.edm_weight`)::

    loss = sure_weight * lambda(sigma_n) * reduce(SURE(h, y))
           + lambda(sigma) * reduce((D(x_t, t) - x_hat)^2),   x_t = alpha(t) (x_hat + sigma n').

With ``lambda(sigma_n)`` the SURE term is, in expectation, the EDM loss at ``sigma =
sigma_n`` against the unknown clean example: the two terms are on one scale and
``sure_weight = 1`` weighs them as EDM weighs its noise levels.

**Divergence estimator: ``'jvp'`` by default.** Each probe's ``b^T J b`` is exact, so the
estimate is unbiased for any network and its only error is the probes' variance. The finite
difference adds a bias of order ``eps`` (the denoiser's curvature) and, in float32, a
rounding error of order ``ulp(|h|) / eps`` that the gradient of the loss inherits (divided
by ``eps`` again). The costs are alike: with one probe, one forward-mode product against one
more network evaluation (the gradient then differentiates through the ``jvp``, reverse over
forward, which JAX does natively). ``'fd'`` is kept for the paper's form and for a source
that forward mode cannot differentiate.

Our choices, not read from the paper (its loss weighting and schedules are unverified here;
Aali et al. 2023): ``x_hat`` enters the DSM term through
``stop_gradient`` (the denoiser is trained by SURE alone; DSM cannot move ``x_hat`` towards
estimates that are easier to score); the weight ``lambda(sigma_n)``; EDM's noise levels and
preconditioning for the DSM term.

**SURE is unbiased for a denoiser that does not depend on the noise it is evaluated on.**
Trained on one fixed noisy copy of each example, a flexible network can fit those copies
(``h(y_i) ~ y_i`` with a small Jacobian there, so the training SURE falls below zero towards
``-sigma_n^2`` per coordinate) while its error on fresh noise grows: on the 1,438 8x8 digits
at ``sigma_n = 0.5`` an MLP of width 256 starts to after about 400 steps of batch 128
(``benchmarks/sure_digits.py``). SURE on *held-out* noisy examples (``aux["sure"]`` of
:meth:`SURE.example_losses` on them) estimates the error on fresh noise from noisy data
alone, for early stopping or model selection. Fitting the copies bounds the training SURE
below by about ``-sigma_n^2`` per coordinate; a lower value needs a negative divergence
estimate, which no posterior-mean denoiser has (its Jacobian ``Cov[x | y] / sigma_n^2`` is
positive semi-definite): the network then exploits SURE being unbounded below. The digits
table's sigma_n = 0.5 run reached -5.7 against that bound of -2 (after the weight
``lambda(0.5) = 8``; docs/sure.md); monitoring the divergence term catches it.

Keys: the step's key is split into two streams, ``fold_in(key, 0)`` for the DSM term
(example ``b``'s noise level and noise from ``fold_in(fold_in(key, 0), b)``, as
:class:`EDMLoss` draws them) and ``fold_in(key, 1)`` for the probes (example ``b``'s from
``fold_in(fold_in(key, 1), b)``, :func:`scorelib.divergence.probe_vectors` over ``d``
coordinates, reshaped to the data shape). The denoiser is applied to one example at a
time (``vmap``), so an example's loss does not depend on its batch, whatever the source.

Class labels: with a conditional source (labels bound by the train step), each example's
SURE denoiser ``h(y) = D(y, sigma_n | c)`` is the source bound to that example's own label
(:func:`scorelib.objectives.base.example_source`), and the DSM term scores the batch with
its labels, so the loss is the conditional one example by example.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_choice, check_int, check_real, require
from scorelib._pytree import static_pytree
from scorelib.divergence import ESTIMATORS, PROBE_NOISES, probe_vectors, value_and_divergence
from scorelib.keys import example_keys
from scorelib.objectives.base import Objective, example_source, source_labels
from scorelib.objectives.dsm import EDMLoss, edm_loss_like
from scorelib.objectives.weights import edm_weight
from scorelib.processes.base import Process

Array = Any

FD_STEP = 1e-3  # default finite-difference step (data units; images in [-1, 1])


def sure_risk(
    denoise,
    y: Array,
    probes: Array,
    *,
    sigma_n: float,
    divergence: str = "jvp",
    eps=None,
    labels: Array | None = None,
) -> tuple[Array, Array]:
    """Stein's unbiased risk estimate of a denoiser, per example (module docstring).

    ``SURE(h, y) = |y - h(y)|^2 + 2 sigma_n^2 div h(y) - d sigma_n^2``, with ``div h``
    estimated from the probes; for ``y = x + sigma_n n``, ``E_n[SURE] = E_n |h(y) - x|^2``.

    Args:
      denoise: ``h``, one example ``[*data_shape] -> [*data_shape]`` (applied per example).
      y: ``[batch, *data_shape]`` noisy examples (data units).
      probes: ``[batch, probes, *data_shape]`` probes with ``E[b b^T] = I`` per example
        (:func:`scorelib.divergence.probe_vectors`); their estimates are averaged.
      sigma_n: the noise standard deviation of ``y`` (a Python float > 0, data units).
      divergence: ``'jvp'`` or ``'fd'`` (:func:`scorelib.divergence.value_and_divergence`).
      eps: the finite-difference step (``'fd'`` only; data units, > 0).
      labels: ``None``, or ``[batch]`` per-example values (class labels) mapped with the
        examples: ``denoise(y_b, labels_b)`` is then called (the divergence is taken in
        ``y_b`` only).

    Returns:
      ``(h, risk)``: ``h = denoise(y)`` ``[batch, *data_shape]`` and ``risk`` ``[batch]``,
      summed over the ``d`` coordinates (data units squared).

    Raises:
      ValueError: naming ``sigma_n``, ``divergence`` or ``eps`` (as ``step``), or ``probes``
        whose shape is not ``[batch, P, *data_shape]``.

    Source: Stein 1981; Ramani, Blu and Unser 2008 (the Monte-Carlo divergence).
    """
    sigma_n = check_real(sigma_n, "sigma_n", low=0.0, low_open=True)
    require(
        probes.ndim == y.ndim + 1
        and probes.shape[0] == y.shape[0]
        and probes.shape[2:] == y.shape[1:],
        "probes",
        f"[batch, P, *data_shape] with batch, data_shape of y {y.shape}",
        probes.shape,
    )
    d = math.prod(y.shape[1:])
    if labels is None:
        h, div = jax.vmap(
            lambda yb, bb: value_and_divergence(denoise, yb, bb, estimator=divergence, step=eps)
        )(y, probes)
    else:
        require(
            np.shape(labels)[:1] == (y.shape[0],),
            "labels",
            f"one per example of y ({y.shape[0]})",
            np.shape(labels),
        )
        h, div = jax.vmap(
            lambda yb, bb, lb: value_and_divergence(
                lambda z: denoise(z, lb), yb, bb, estimator=divergence, step=eps
            )
        )(y, probes, labels)
    sq = jnp.sum((y - h) ** 2, axis=tuple(range(1, y.ndim)))
    return h, sq + 2.0 * sigma_n**2 * div - d * sigma_n**2


@static_pytree
@dataclasses.dataclass(frozen=True)
class SURE(Objective):
    """SURE-Score's objective on noisy training data (module docstring).

    Fields:
      process: the noise process.
      sigma_n: the training data's noise standard deviation (data units, > 0): a noise level
        the process reaches. The Hydra entry points pass ``data.noise_sigma``.
      sure_weight: the SURE term's weight (> 0) against the DSM term's 1.
      probes: divergence probes per example (>= 1); their estimates are averaged.
      probe: ``'rademacher'`` (default; the smaller variance) or ``'gaussian'``.
      divergence: ``'jvp'`` (default) or ``'fd'``.
      eps: ``'fd'`` only: the finite-difference step (data units, > 0; default
        :data:`FD_STEP`); refused with ``'jvp'``.
      P_mean, P_std, sigma_data, reduce: the DSM term's, as :class:`EDMLoss`; ``sigma_data``
        also gives the SURE term's weight ``lambda(sigma_n)``, ``reduce`` its reduction.

    Raises:
      ValueError: naming ``objective.<field>`` for a value out of range (as above and as
        :class:`EDMLoss`).
    """

    process: Process
    sigma_n: float
    sure_weight: float = 1.0
    probes: int = 1
    probe: str = "rademacher"
    divergence: str = "jvp"
    eps: float | None = None
    P_mean: float = -1.2
    P_std: float = 1.2
    sigma_data: float = 0.5
    reduce: str = "mean"

    def __post_init__(self):
        s = check_real(self.sigma_n, "objective.sigma_n", low=0.0, low_open=True)
        object.__setattr__(self, "sigma_n", s)
        w = check_real(self.sure_weight, "objective.sure_weight", low=0.0, low_open=True)
        object.__setattr__(self, "sure_weight", w)
        check_int(self.probes, "objective.probes", low=1)
        check_choice(self.probe, "objective.probe", PROBE_NOISES)
        check_choice(self.divergence, "objective.divergence", ESTIMATORS)
        if self.divergence == "jvp":
            require(
                self.eps is None,
                "objective.eps",
                "null with objective.divergence=jvp (it is the finite-difference step)",
                self.eps,
            )
        else:
            eps = FD_STEP if self.eps is None else self.eps
            eps = check_real(eps, "objective.eps", low=0.0, low_open=True)
            object.__setattr__(self, "eps", eps)
        _ = self.dsm  # validates P_mean, P_std, sigma_data and reduce, naming objective.<field>
        p = self.process
        t = float(p.t_of_ve_sigma(s))
        lo, hi = float(p.ve_sigma(p.t_min)), float(p.ve_sigma(p.t_max))
        require(
            math.isfinite(t) and p.t_min <= t <= p.t_max,
            "objective.sigma_n",
            f"a noise level of the process, in [{lo:.4g}, {hi:.4g}]",
            s,
        )

    @property
    def dsm(self) -> EDMLoss:
        """The DSM term: :class:`EDMLoss` with this objective's ``P_mean, P_std, sigma_data,
        reduce``."""
        return edm_loss_like(self)

    def example_losses(self, source, x0, key):
        """``sure_weight lambda(sigma_n) reduce(SURE) + lambda(sigma) reduce((D - x_hat)^2)``.

        Args:
          source: a score source; its ``denoiser`` is trained (data units).
          x0: ``[batch, *data_shape]`` the *noisy* training examples ``y`` (data units).
          key: the step's PRNG key (two streams, module docstring).

        Returns:
          ``(losses [batch], aux)``, ``aux`` of ``[batch]`` arrays: ``sigma`` the DSM term's
          VE-frame noise levels, ``sure`` the reduced SURE estimate of the denoiser's squared
          error at ``sigma_n`` against the clean data (data units squared), ``dsm`` the DSM
          term.
        """
        p = self.process
        y = x0
        shape = y.shape[1:]
        d = math.prod(shape)
        t_n = p.t_of_ve_sigma(jnp.asarray(self.sigma_n, y.dtype))
        alpha_n = p.alpha(t_n)

        labels = source_labels(source, y.shape[0])

        def denoise(yb, lb=None):  # h(y) = D(alpha(t_n) y, t_n [| c]): y in the VE frame
            return example_source(source, lb).denoiser((alpha_n * yb)[None], t_n)[0]

        def draw(k):
            return jnp.reshape(probe_vectors(k, self.probes, d, self.probe), (self.probes, *shape))

        probes = jax.vmap(draw)(example_keys(jax.random.fold_in(key, 1), y.shape[0]))
        h, risk = sure_risk(
            denoise,
            y,
            probes,
            sigma_n=self.sigma_n,
            divergence=self.divergence,
            eps=self.eps,
            labels=labels,
        )
        sure = risk / d if self.reduce == "mean" else risk
        dsm, aux = self.dsm.example_losses(
            source, jax.lax.stop_gradient(h), jax.random.fold_in(key, 0)
        )
        lam = edm_weight(ve_sigma=self.sigma_n, sigma_data=self.sigma_data)
        losses = self.sure_weight * lam * sure + dsm
        return losses, {"sigma": aux["sigma"], "sure": sure, "dsm": dsm}
