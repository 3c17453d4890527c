"""Noise-level schedules and draws, in the VE-frame noise level ``sigma = sigma(t) / alpha(t)``.

One home for the maps from uniforms or normals to noise levels that samplers, objectives
and distillation share (data units; convert to process time with
``process.t_of_ve_sigma``):

* :func:`rho_spaced`: the EDM rho-schedule at fractions ``u`` (Karras et al. 2022, eq. 5):
  the sampler grid ``scorelib.samplers.grids.edm_grid`` at ``u = i / (M - 1)``, the noise
  levels of ``scorelib.distill`` at ``u ~ U(0, 1)``.
* :func:`log_normal_sigma`: EDM's training levels ``ln sigma ~ N(P_mean, P_std^2)``
  (Karras et al. 2022, eq. 8 and Table 1), drawn by ``scorelib.objectives.EDMLoss`` and
  ``SmoothedScoreMatching``.
* :func:`edm_sigma`: the log-normal mixed with a log-uniform floor, by inverse CDF.

They work on numpy and JAX arrays alike where noted and check nothing: their callers
validate the ranges (naming their own config fields).
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
from jax.scipy.special import ndtri

Array = Any

_U_EDGE = 1e-7  # uniforms are clipped to [_U_EDGE, 1 - _U_EDGE] before Phi^{-1}


def rho_spaced(u, sigma_min: float, sigma_max: float, rho: float):
    """Noise levels at fractions ``u`` of the EDM rho-schedule (Karras et al. 2022, eq. 5).

    ``(sigma_max^(1/rho) + u (sigma_min^(1/rho) - sigma_max^(1/rho)))^rho``: ``u = 0`` is
    ``sigma_max``, ``u = 1`` is ``sigma_min``; the grid of
    :func:`scorelib.samplers.grids.edm_grid` at ``u = i / (M - 1)`` and, at ``u ~ U(0, 1)``,
    its continuous form (the noise levels of ``scorelib.distill``). Works on numpy and JAX
    arrays alike (no checks: the callers validate ``0 < sigma_min < sigma_max`` and
    ``rho > 0``).

    Args:
      u: fractions in [0, 1], any shape (numpy or JAX).
      sigma_min, sigma_max: the end levels (VE frame, data units).
      rho: the schedule exponent.

    Returns:
      the levels, ``u``'s shape and array type.
    """
    a, b = sigma_max ** (1.0 / rho), sigma_min ** (1.0 / rho)
    return (a + u * (b - a)) ** rho


def log_normal_sigma(z: Array, *, P_mean: float, P_std: float) -> Array:
    """``sigma = exp(P_mean + P_std z)``: EDM's log-normal training noise levels from standard
    normals ``z`` (Karras et al. 2022, eq. 8 and Table 1: ``P_mean = -1.2``,
    ``P_std = 1.2``).

    Args:
      z: standard normal draws, any shape (e.g. ``[batch]``).
      P_mean, P_std: the mean and std of ``ln sigma``.

    Returns:
      ``sigma`` of the shape of ``z`` (VE frame, data units).
    """
    return jnp.exp(P_mean + P_std * z)


def edm_sigma(u, *, P_mean: float, P_std: float, p_uniform: float = 0.0, sigma_range=None):
    """Noise levels of the EDM loss from uniforms ``u`` in ``[0, 1)`` (inverse CDF).

    The distribution is the mixture ``(1 - p_uniform) LogNormal(P_mean, P_std^2) +
    p_uniform LogUniform(sigma_range)``: with ``p = p_uniform`` and ``(lo, hi) =
    sigma_range``, ``u < p`` gives ``ln sigma = ln lo + (u / p) (ln hi - ln lo)`` and
    ``u >= p`` gives ``ln sigma = P_mean + P_std Phi^{-1}((u - p) / (1 - p))``; each branch
    receives a uniform of its own given the branch, so one uniform per example draws the
    mixture exactly. ``p_uniform = 0`` is Karras et al.'s log-normal (eq. 8, Table 1).

    Args:
      u: uniforms in ``[0, 1)``, any shape (e.g. ``[batch]``).
      P_mean, P_std: the log-normal's mean and std of ``ln sigma``.
      p_uniform: the log-uniform share in ``[0, 1)``.
      sigma_range: ``(lo, hi)`` VE-frame noise levels (data units) of the log-uniform
        part, ``0 < lo < hi``; ignored when ``p_uniform = 0``.

    Returns:
      ``sigma`` of the shape of ``u`` (data units).
    """
    p = p_uniform
    # Phi^{-1} of the log-normal branch's own uniform, kept off 0 and 1 (|z| <= 5.2)
    z = ndtri(jnp.clip((u - p) / (1.0 - p), _U_EDGE, 1.0 - _U_EDGE))
    log_normal = log_normal_sigma(z, P_mean=P_mean, P_std=P_std)
    if p == 0.0:
        return log_normal
    log_lo, log_hi = (math.log(float(v)) for v in sigma_range)
    log_uniform = log_lo + (u / p) * (log_hi - log_lo)
    return jnp.where(u < p, jnp.exp(log_uniform), log_normal)
