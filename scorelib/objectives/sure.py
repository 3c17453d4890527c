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

The authors' loss (``utcsilab/score-diffusion-training``, ``losses.py``) and ours: their
DSM gradient reaches the denoiser through ``x_hat`` (``dsm_into_denoiser=True``, the default;
``False`` is this codebase's first choice, ``stop_gradient``); their DSM term is summed over
the pixels, weighted by ``sigma^2`` in score space and by an unpublished ``score_wt`` times the
epoch index, so it is zero in the first epoch and grows (``dsm_weight``, ``dsm_ramp_steps``:
a linear ramp to a cap); their SURE has weight 1 per pixel and ours ``lambda(sigma_n)``; their
network is noise-unconditional (NCSNv2: the score is ``f(x) / sigma``) where ours is EDM's
sigma-conditioned denoiser, over EDM's noise levels.

**SURE is unbiased for a denoiser that does not depend on the noise it is evaluated on.**
Trained on one fixed noisy copy of each example, a flexible network can fit those copies
while its error on fresh noise grows: on the 1,438 8x8 digits at ``sigma_n = 0.5`` an MLP of
width 256 starts to after about 400 steps of batch 128 (``benchmarks/sure_digits.py``).
Fitting the copies (``h(y_i) = y_i``) with a Jacobian near 0 there brings SURE to ``-sigma_n^2``
per coordinate, no lower. A lower training SURE needs a negative divergence estimate: the
network makes ``b^T J b < 0`` at its training points, which no posterior-mean denoiser does
(its Jacobian ``Cov[x | y] / sigma_n^2`` is symmetric positive semi-definite, so every
probe's ``b^T J b >= 0``). SURE is linear in the divergence and so unbounded below: the
network is rewarded for making it negative, and the parts ``aux["sure_residual"]`` and
``aux["sure_divergence"]`` (logged by training) show it. Two guards:
``nonnegative_divergence`` clips the estimate at 0 (SURE is then bounded below by
``-sigma_n^2`` per coordinate and a negative divergence earns nothing), and SURE on
*held-out* noisy examples (``data.holdout``: ``aux["sure"]`` of :meth:`SURE.example_losses`
on them) estimates the error on fresh noise from noisy data alone, for early stopping or
model selection.

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
    nonnegative_divergence: bool = False,
    parts: bool = False,
) -> tuple:
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
      nonnegative_divergence: clip the divergence estimate at 0 (the guard of
        :class:`SURE`: a posterior-mean denoiser's Jacobian is positive semi-definite, so
        every probe's ``b^T J b`` is >= 0; the clipped SURE is bounded below by ``-d
        sigma_n^2``).
      parts: also return ``{"residual": |y - h|^2, "divergence": div h}`` (each
        ``[batch]``; the divergence after the clip).

    Returns:
      ``(h, risk)``, or ``(h, risk, parts)``: ``h = denoise(y)`` ``[batch, *data_shape]``
      and ``risk`` ``[batch]``, summed over the ``d`` coordinates (data units squared).

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
    if nonnegative_divergence:
        div = jnp.maximum(div, 0.0)
    risk = sq + 2.0 * sigma_n**2 * div - d * sigma_n**2
    return (h, risk, {"residual": sq, "divergence": div}) if parts else (h, risk)


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
      dsm_into_denoiser: the DSM term's gradient reaches the denoiser through ``x_hat =
        h(y)`` (default, the authors' loss: score consistency pulls the denoised estimates
        towards points the network scores well); ``False``: ``x_hat`` enters through
        ``stop_gradient`` (the denoiser is trained by SURE alone).
      dsm_weight: the DSM term's weight (> 0; 1: EDM's per-coordinate scale). The authors'
        DSM is summed over the ``d`` coordinates against a per-coordinate SURE: ``d`` here
        with ``reduce='mean'`` (times their unpublished ``score_wt``).
      dsm_ramp_steps: ``> 0``: the DSM weight grows linearly from 0 over this many training
        steps, then stays at ``dsm_weight`` (the authors' weight grows with the epoch index
        without a cap); ``0``: constant. Needs the step (:attr:`uses_step`).
      nonnegative_divergence: clip the divergence estimate at 0 (:func:`sure_risk`): a guard
        against the network driving SURE below what any posterior-mean denoiser reaches.

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
    dsm_into_denoiser: bool = True
    dsm_weight: float = 1.0
    dsm_ramp_steps: int = 0
    nonnegative_divergence: bool = False

    @property
    def uses_step(self) -> bool:
        """The loss changes with the step (a DSM ramp): the train step passes it."""
        return self.dsm_ramp_steps > 0

    def __post_init__(self):
        for f in ("dsm_into_denoiser", "nonnegative_divergence"):
            require(
                isinstance(getattr(self, f), bool),
                f"objective.{f}",
                "true or false",
                getattr(self, f),
            )
        w = check_real(self.dsm_weight, "objective.dsm_weight", low=0.0, low_open=True)
        object.__setattr__(self, "dsm_weight", w)
        check_int(self.dsm_ramp_steps, "objective.dsm_ramp_steps", low=0)
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

    def example_losses(self, source, x0, key, step=None):
        """``sure_weight lambda(sigma_n) reduce(SURE) + r(step) dsm_weight lambda(sigma)
        reduce((D - x_hat)^2)``, ``r`` the ramp (1 without one).

        Args:
          source: a score source; its ``denoiser`` is trained (data units).
          x0: ``[batch, *data_shape]`` the *noisy* training examples ``y`` (data units).
          key: the step's PRNG key (two streams, module docstring).
          step: the training step (needed with ``dsm_ramp_steps > 0``).

        Returns:
          ``(losses [batch], aux)``, ``aux`` of ``[batch]`` arrays: ``sigma`` the DSM term's
          VE-frame noise levels, ``sure`` the reduced SURE estimate of the denoiser's squared
          error at ``sigma_n`` against the clean data (data units squared), its parts
          ``sure_residual`` (``reduce |y - h|^2``) and ``sure_divergence`` (``reduce(2
          sigma_n^2 div h)``, so that ``sure = sure_residual + sure_divergence - sigma_n^2``
          per coordinate with ``reduce='mean'``), ``dsm`` the DSM term (unweighted).

        Raises:
          ValueError: naming ``objective.dsm_ramp_steps`` when a ramp has no step (e.g.
            under a penalty wrapper that does not pass it).
        """
        require(
            step is not None or self.dsm_ramp_steps == 0,
            "objective.dsm_ramp_steps",
            "0 where the training step is not passed (a train step that does not pass it)",
            self.dsm_ramp_steps,
        )
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
        h, risk, part = sure_risk(
            denoise,
            y,
            probes,
            sigma_n=self.sigma_n,
            divergence=self.divergence,
            eps=self.eps,
            labels=labels,
            nonnegative_divergence=self.nonnegative_divergence,
            parts=True,
        )
        scale = 1.0 / d if self.reduce == "mean" else 1.0
        x_hat = h if self.dsm_into_denoiser else jax.lax.stop_gradient(h)
        dsm, aux = self.dsm.example_losses(source, x_hat, jax.random.fold_in(key, 0))
        lam = edm_weight(ve_sigma=self.sigma_n, sigma_data=self.sigma_data)
        w_dsm = self.dsm_weight
        if self.dsm_ramp_steps > 0:
            w_dsm = w_dsm * jnp.minimum(jnp.asarray(step, jnp.float32) / self.dsm_ramp_steps, 1.0)
        losses = self.sure_weight * lam * risk * scale + w_dsm * dsm
        return losses, {
            "sigma": aux["sigma"],
            "sure": risk * scale,
            "sure_residual": part["residual"] * scale,
            "sure_divergence": 2.0 * self.sigma_n**2 * part["divergence"] * scale,
            "dsm": dsm,
        }


def denoiser_sure(
    source,
    y: Array,
    *,
    sigma_n: float,
    key: jax.Array,
    probes: int = 8,
    clean: Array | None = None,
    batch_size: int = 256,
) -> dict:
    """SURE of a score source's denoiser at ``sigma_n`` on noisy examples, with its parts,
    per coordinate: for monitoring a trained model (held-out SURE, :class:`SURE`'s guard).

    The denoiser is ``h(y) = D(alpha(t_n) y, t_n)`` with ``t_n`` the time of VE-frame noise
    level ``sigma_n`` (as :class:`SURE` trains it); ``div h`` by ``probes`` Rademacher probes
    per example with exact ``b^T J b`` (:func:`sure_risk`, ``'jvp'``), example ``i``'s from
    ``fold_in(key, i)``.

    Args:
      source: a score source (its ``process`` reaches ``sigma_n``).
      y: ``[n, *data_shape]`` noisy examples ``x + sigma_n n`` (data units).
      sigma_n: their noise standard deviation (data units, > 0).
      key: the probes' key.
      probes: probes per example (>= 1).
      clean: ``None``, or the clean ``[n, *data_shape]`` examples: then also the true error.
      batch_size: examples per compiled call (memory only, not the numbers).

    Returns:
      ``{"sure", "residual", "divergence", "se"}`` and, with ``clean``, ``"mse"``: means
      over examples and coordinates (data units squared); ``sure = residual + divergence -
      sigma_n^2``, ``divergence`` the term ``2 sigma_n^2 div h / d``, ``se`` the standard
      error of ``sure`` over examples. For examples independent of the denoiser,
      ``E[sure] = E[mse]`` (Stein 1981).

    Raises:
      ValueError: naming ``sigma_n``, ``probes``, ``batch_size``, ``y`` or ``clean``.
    """
    sigma_n = check_real(sigma_n, "sigma_n", low=0.0, low_open=True)
    probes = check_int(probes, "probes", low=1)
    batch_size = check_int(batch_size, "batch_size", low=1)
    y = jnp.asarray(y, jnp.float32)
    require(y.ndim >= 2 and y.shape[0] >= 1, "y", "[n, *data_shape] with n >= 1", y.shape)
    if clean is not None:
        require(np.shape(clean) == y.shape, "clean", f"the shape of y {y.shape}", np.shape(clean))
    p = source.process
    shape, d = y.shape[1:], math.prod(y.shape[1:])
    t_n = p.t_of_ve_sigma(jnp.float32(sigma_n))
    alpha_n = p.alpha(t_n)

    @jax.jit
    def part(yb, first):
        keys = example_keys(key, yb.shape[0], first)
        b = jax.vmap(lambda k: probe_vectors(k, probes, d, "rademacher"))(keys)
        b = jnp.reshape(b, (yb.shape[0], probes, *shape))
        h, risk, parts = sure_risk(
            lambda z: source.denoiser((alpha_n * z)[None], t_n)[0],
            yb,
            b,
            sigma_n=sigma_n,
            parts=True,
        )
        return h, risk / d, parts["residual"] / d, 2.0 * sigma_n**2 * parts["divergence"] / d

    chunks = [part(y[i : i + batch_size], i) for i in range(0, y.shape[0], batch_size)]
    h, sure, res, div = (
        np.concatenate([np.asarray(c[j], np.float64) for c in chunks]) for j in range(4)
    )
    out = {
        "sure": float(sure.mean()),
        "residual": float(res.mean()),
        "divergence": float(div.mean()),
        "se": float(sure.std(ddof=1) / math.sqrt(sure.size)) if sure.size > 1 else math.nan,
    }
    if clean is not None:
        out["mse"] = float(np.mean((h - np.asarray(clean, np.float64)) ** 2))
    return out
