"""EDM preconditioning (Karras et al., NeurIPS 2022, Table 1 and eq. 7), and its
Fisher-scaled variant for labels that stay exact at low noise (target score matching).

``D(x; sigma) = c_skip(sigma) x + c_out(sigma) F(c_in(sigma) x; c_noise(sigma))``, with::

    c_skip  = sigma_data^2 / (sigma^2 + sigma_data^2)
    c_out   = sigma sigma_data / sqrt(sigma^2 + sigma_data^2)
    c_in    = 1 / sqrt(sigma^2 + sigma_data^2)
    c_noise = ln(sigma) / 4

``sigma`` here is the noise level of the VE frame (``ve_sigma`` of a process). By Tweedie
the same network gives the score ``s = (D - x) / sigma^2 = c_skip_score x + c_out_score F``
with ``c_skip_score = -1 / (sigma^2 + sigma_data^2)`` (the score of ``N(0, sigma_data^2)``
data, noised) and ``c_out_score = c_out / sigma^2``.

EDM's ``c_out`` makes the network's target ``(x_0 - c_skip x) / c_out`` unit-variance for
the *denoising* label: at low noise ``c_out_score = sigma_data / (sigma sqrt(.)) ~ 1 /
sigma``, so ``F`` predicts the noise ``eps`` and an error ``dF`` becomes a score error
``dF / sigma``. A regression label that is exact at low noise (the TSM label
``grad log p_0(x_0)``, De Bortoli et al., arXiv 2402.08667, 2024) has a score of size
``sqrt(J_0 / d)`` there instead (``J_0 = E ||grad log p_0||^2``, the Fisher information),
and EDM's ``F`` would have to shrink like ``sigma`` to fit it: the per-sigma losses then
differ by ``1 / sigma^2`` in scale and the low-noise terms take the optimiser.
:func:`fisher_precond` multiplies ``c_out`` by ``sigma / sqrt(sigma^2 + sigma_fisher^2)``
with ``sigma_fisher = sqrt(d / J_0)`` the Fisher length scale of the data (``=
sigma_data`` for a Gaussian): EDM's coefficients for ``sigma >> sigma_fisher``, and
``c_out_score -> 1 / sigma_fisher``, a score-predicting network of unit output scale, for
``sigma << sigma_fisher``. Our derivation (not in either paper); by Stam's inequality
``1 / J_sigma >= 1 / J_0 + sigma^2 / d`` (equality for Gaussians), ``sqrt(sigma^2 +
sigma_fisher^2)`` is the scale of the noisy score ``sqrt(d / J_sigma)`` it interpolates.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

Array = Any


class Precond(NamedTuple):
    """The EDM coefficients, each of the shape of ``sigma`` (``c_noise`` dimensionless,
    ``c_out`` in data units, ``c_in`` in 1 / data units, ``c_skip`` dimensionless).

    ``c_skip_score`` (1 / data^2) and ``c_out_score`` (1 / data) give the score of the
    same network, ``s = c_skip_score x + c_out_score F``, written in closed form so that
    it does not lose precision to the cancellation in ``(D - x) / sigma^2`` at small
    sigma (filled by :func:`fisher_precond`; ``None`` from :func:`edm_precond`, whose
    sources take the score from the denoiser by Tweedie).
    """

    c_skip: Array
    c_out: Array
    c_in: Array
    c_noise: Array
    c_skip_score: Array | None = None
    c_out_score: Array | None = None


def edm_precond(sigma: Array, sigma_data: float) -> Precond:
    """The four EDM coefficients at noise level ``sigma`` (scalar or ``[batch]``, > 0).

    Args:
      sigma: VE-frame noise level (data units, > 0; ``c_noise`` is ``-inf`` at 0).
      sigma_data: data standard deviation (data units, > 0).

    Returns:
      :class:`Precond` of arrays of the shape of ``sigma``.

    Source: Karras et al. 2022, Table 1 ("Ours" column). The loss weight that goes with
    it is :func:`scorelib.objectives.weights.edm_weight`.
    """
    sigma = jnp.asarray(sigma)
    sd2 = sigma_data**2
    denom = sigma**2 + sd2
    return Precond(
        c_skip=sd2 / denom,
        c_out=sigma * sigma_data / jnp.sqrt(denom),
        c_in=1.0 / jnp.sqrt(denom),
        c_noise=0.25 * jnp.log(sigma),
    )


def fisher_precond(sigma: Array, sigma_data: float, sigma_fisher: float) -> Precond:
    """EDM's coefficients with ``c_out`` multiplied by ``sigma / sqrt(sigma^2 +
    sigma_fisher^2)`` (see the module docstring), and the score form.

    ``c_skip, c_in, c_noise`` are :func:`edm_precond`'s; ::

        c_out       = sigma^2 sigma_data / sqrt((sigma^2 + sigma_fisher^2)(sigma^2 + sigma_data^2))
        c_skip_score = -1 / (sigma^2 + sigma_data^2)
        c_out_score  = sigma_data / sqrt((sigma^2 + sigma_fisher^2)(sigma^2 + sigma_data^2))

    so ``D = c_skip x + c_out F`` and ``s = (D - x) / sigma^2 = c_skip_score x +
    c_out_score F``. The loss weight that gives the network output unit weight at every
    sigma is :func:`scorelib.objectives.weights.fisher_weight` (``1 / c_out_score^2`` on
    score errors, for ``alpha = 1``).

    Args:
      sigma: VE-frame noise level (data units, > 0), scalar or ``[batch]``.
      sigma_data: data standard deviation (data units, > 0).
      sigma_fisher: the data's Fisher length scale ``sqrt(d / E ||grad log p_0||^2)``
        (data units, > 0; e.g. :meth:`scorelib.data.targets.Target.fisher_scale`).

    Returns:
      :class:`Precond` with every field an array of the shape of ``sigma``.
    """
    c = edm_precond(sigma, sigma_data)
    sigma = jnp.asarray(sigma)
    s2 = sigma**2
    root = jnp.sqrt((s2 + sigma_fisher**2) * (s2 + sigma_data**2))
    return c._replace(
        c_out=s2 * sigma_data / root,
        c_skip_score=-1.0 / (s2 + sigma_data**2),
        c_out_score=sigma_data / root,
    )
