"""Loss weights ``lambda`` of the score-matching objectives, in one place.

Every objective's per-example loss is ``lambda * reduce(error^2)`` with a ``[batch]``
weight. The functions take keyword arguments only (so a noise level cannot be passed
where a time is expected) and return arrays of the shape of ``t`` (or ``ve_sigma``):

* DSM (Song et al., ICLR 2021, eq. 7 and Sec. 3.3): :func:`sigma2_weight`
  ``sigma(t)^2``; :func:`likelihood_weight` ``g(t)^2`` (Song et al., "Maximum likelihood
  training of score-based diffusion models", NeurIPS 2021, Thm. 1); :func:`unit_weight` 1;
* EDM (Karras et al., NeurIPS 2022, Table 1): :func:`edm_weight`
  ``(sigma^2 + sigma_data^2) / (sigma sigma_data)^2`` in the VE frame;
* target score matching and its mixtures with DSM (De Bortoli et al., "Target score
  matching", arXiv 2402.08667, 2024): :func:`alpha2_weight` ``alpha(t)^2``,
  :func:`relative_weight`, :func:`kappa_weight` and :func:`fisher_weight` (see each
  function).

:func:`dsm_weight` maps DSM's ``weighting`` names to the first three.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from scorelib._checks import check_choice
from scorelib.processes.base import Process

Array = Any

DSM_WEIGHTINGS = ("sigma2", "likelihood", "none")


def sigma2_weight(*, process: Process, t: Array) -> Array:
    """``sigma(t)^2`` (data units squared): the score-SDE default, which gives the DSM
    label ``-eps / sigma`` unit variance at every noise level (Song et al. 2021, Sec. 3.3).
    """
    return process.sigma(t) ** 2


def likelihood_weight(*, process: Process, t: Array) -> Array:
    """``g(t)^2``: DSM then bounds the negative log-likelihood (Song et al., NeurIPS 2021,
    "Maximum likelihood training of score-based diffusion models", Thm. 1)."""
    return process.g2(t)


def unit_weight(*, t: Array) -> Array:
    """1 at every ``t`` (``weighting='none'``)."""
    return jnp.ones_like(t)


def dsm_weight(weighting: str, *, process: Process, t: Array) -> Array:
    """The DSM weight named ``weighting`` (one of :data:`DSM_WEIGHTINGS`) at times ``t``.

    Args:
      weighting: ``'sigma2'`` (:func:`sigma2_weight`), ``'likelihood'``
        (:func:`likelihood_weight`) or ``'none'`` (:func:`unit_weight`).
      process: the noise process.
      t: ``[batch]`` process times.

    Returns:
      ``[batch]`` weights.

    Raises:
      ValueError: for an unknown ``weighting`` (naming ``objective.weighting``).
    """
    check_choice(weighting, "objective.weighting", DSM_WEIGHTINGS)
    if weighting == "sigma2":
        return sigma2_weight(process=process, t=t)
    if weighting == "likelihood":
        return likelihood_weight(process=process, t=t)
    return unit_weight(t=t)


def edm_weight(*, ve_sigma: Array, sigma_data: float) -> Array:
    """EDM's ``lambda(sigma) = (sigma^2 + sigma_data^2) / (sigma sigma_data)^2``.

    Karras et al. 2022, Table 1 and eq. 8: with the EDM preconditioning it makes
    ``lambda(sigma) c_out(sigma)^2 = 1``, i.e. the network's own target has unit weight.

    Args:
      ve_sigma: VE-frame noise levels (data units, > 0), any shape.
      sigma_data: data standard deviation (data units, > 0).

    Returns:
      weights of the shape of ``ve_sigma`` (units of 1 / data^2).
    """
    return (ve_sigma**2 + sigma_data**2) / (ve_sigma * sigma_data) ** 2


def alpha2_weight(*, process: Process, t: Array) -> Array:
    """``alpha(t)^2``: pure TSM as ``||alpha s_theta - grad log p_0(x_0)||^2`` (De Bortoli et
    al. 2024, Sec. 2); every level weighted by the size of its score. 1 for VE and EDM."""
    return process.alpha(t) ** 2


def relative_weight(*, process: Process, t: Array, sigma_d: float) -> Array:
    """``alpha^2 (sigma_d^2 + ve_sigma^2) / sigma_d^2 = (alpha^2 sigma_d^2 + sigma^2) /
    sigma_d^2``: the inverse of the mean squared score per coordinate of ``N(0, sigma_d^2
    I)`` data noised to ``t`` (which is ``1 / (alpha^2 sigma_d^2 + sigma^2)``), divided by
    ``sigma_d^2``. So each noise level counts by its *relative* score error (``alpha^2`` at
    low noise, ``sigma^2 / sigma_d^2`` at high noise). EDM's weighting of the denoiser
    (Karras et al. 2022, Table 1), written for the score, is ``ve_sigma^2`` times this.

    Args:
      process: the noise process.
      t: ``[batch]`` process times.
      sigma_d: data standard deviation (data units, > 0).
    """
    sd2 = sigma_d**2
    return process.alpha(t) ** 2 * (sd2 + process.ve_sigma(t) ** 2) / sd2


def kappa_weight(*, process: Process, t: Array, kappa: Array) -> Array:
    """``kappa alpha^2 + (1 - kappa) sigma^2``: each label's own weighting (``alpha^2`` for
    the TSM label, ``sigma^2`` for the DSM label) in proportion to its share ``kappa`` of a
    mixed label. Our choice for the DSM/TSM mixtures, not De Bortoli et al.'s.

    Args:
      process: the noise process.
      t: ``[batch]`` process times.
      kappa: ``[batch]`` TSM shares in ``[0, 1]``.
    """
    return kappa * process.alpha(t) ** 2 + (1.0 - kappa) * process.sigma(t) ** 2


def fisher_weight(*, process: Process, t: Array, sigma_data: float, sigma_fisher: float) -> Array:
    """``alpha^2 (ve_sigma^2 + sigma_fisher^2)(ve_sigma^2 + sigma_data^2) / sigma_data^2``:
    unit weight on the network output behind
    :func:`scorelib.nets.precond.fisher_precond`, i.e. ``alpha^2 / c_out_score^2`` (the
    score in process coordinates is the VE frame's divided by ``alpha``), as EDM's
    ``lambda`` is ``1 / c_out^2`` for its denoiser (Karras et al. 2022, Table 1).

    It is ``sigma_fisher^2 alpha^2`` (TSM's ``alpha^2``, scaled) for ``ve_sigma <<
    sigma_fisher``, and EDM's weight written for the score, ``ve_sigma^2 (ve_sigma^2 +
    sigma_data^2) / sigma_data^2``, for ``ve_sigma >> sigma_fisher``. Our choice for the
    DSM/TSM mixtures, not De Bortoli et al.'s.

    Args:
      process: the noise process.
      t: ``[batch]`` process times.
      sigma_data: data standard deviation (data units, > 0).
      sigma_fisher: the data's Fisher length scale (data units, > 0).

    Returns:
      ``[batch]`` weights (units of data^2).
    """
    v2 = process.ve_sigma(t) ** 2
    return process.alpha(t) ** 2 * (v2 + sigma_fisher**2) * (v2 + sigma_data**2) / sigma_data**2
