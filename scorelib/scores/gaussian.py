"""The analytic score of Gaussian data N(mu, Sigma) under any process.

With ``x_0 ~ N(mu, Sigma)``, ``x_t ~ N(alpha mu, alpha^2 Sigma + sigma^2 I)`` so
(Wang & Vastola, TMLR 2024, eqs. 4-5, generalised to ``alpha != 1``)::

    score(x, t) = -(alpha^2 Sigma + sigma^2 I)^{-1} (x - alpha mu)
    D(x, t)     = mu + alpha Sigma (alpha^2 Sigma + sigma^2 I)^{-1} (x - alpha mu)

Everything is computed in the eigenbasis ``Sigma = U diag(lam) U^T``; never by
``inv``. ``U`` may have ``r < d`` columns, in which case the orthogonal
complement carries an isotropic variance ``residual_var``.

Beside the score source, the closed-form probability-flow ODE of Gaussian data
(:func:`gaussian_flow`, Wang & Vastola 2024, Sec. 4, eq. 8: in the eigenbasis the ODE
``dx/dsigma = (x - D(x; sigma)) / sigma`` decouples into ``dc_k / dsigma = sigma c_k /
(lam_k + sigma^2)``, so ``c_k(sigma) = sqrt((sigma^2 + lam_k) / (sigma_T^2 + lam_k))
c_k(sigma_T)``) and exact draws of its marginals (:func:`gaussian_marginal_sample`).
Both work in the VE frame ``x / alpha(t)`` at ``ve_sigma = sigma(t) / alpha(t)``
(Karras et al. 2022, eq. 4), so one formula serves VE, EDM, VP and sub-VP; inputs and
outputs are in process coordinates. Fits of a data set are in
``scorelib/scores/gaussian_fit.py``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from scorelib._checks import check_time, require
from scorelib.processes.base import Process, broadcast_to_data
from scorelib.scores.base import (
    ScoreSource,
    check_data_shape,
    check_examples,
    check_query,
    flatten,
)

Array = Any


class GaussianScore(ScoreSource):
    """Score source of ``N(mu, U diag(lam) U^T + residual_var (I - U U^T))``.

    Fields:
      mean: ``[d]`` (flattened data mean).
      eigvecs: ``[d, r]`` orthonormal columns.
      eigvals: ``[r]`` nonnegative variances along ``eigvecs``.
      residual_var: scalar variance outside the span of ``eigvecs`` (unused when r = d).
      data_shape: the unflattened data shape (static).
    """

    mean: Array = None
    eigvecs: Array = None
    eigvals: Array = None
    residual_var: Array = 0.0
    data_shape: tuple = struct.field(pytree_node=False, default=())

    @classmethod
    def from_covariance(cls, process, mean, cov, data_shape=None):
        """Build from a mean ``[d]`` and a covariance ``[d, d]`` (symmetric PSD).

        The eigendecomposition is done in float64 numpy (eigenvalues clipped at 0); the
        fields are stored in JAX's default float dtype (float32 unless x64 is enabled).

        Args:
          process: the noise process.
          mean: ``[d]`` (any shape with ``d`` entries; data units).
          cov: ``[d, d]`` (data units squared).
          data_shape: the unflattened shape of one example (default ``(d,)``).

        Raises:
          ValueError: if ``cov`` is not ``[d, d]`` with ``d = mean.size``, or ``data_shape``
            does not hold ``d`` entries.
        """
        mean = np.asarray(mean, np.float64).reshape(-1)
        cov = np.asarray(cov, np.float64)
        d = mean.shape[0]
        require(cov.shape == (d, d), "cov", f"of shape ({d}, {d}) to match mean", cov.shape)
        data_shape = check_data_shape(data_shape, d)
        lam, u = np.linalg.eigh(0.5 * (cov + cov.T))
        dtype = jax.dtypes.canonicalize_dtype(np.float64)
        return cls(
            process=process,
            mean=jnp.asarray(mean, dtype),
            eigvecs=jnp.asarray(u, dtype),
            eigvals=jnp.asarray(np.clip(lam, 0.0, None), dtype),
            residual_var=jnp.asarray(0.0, dtype),
            data_shape=data_shape,
        )

    def _parts(self, x, t):
        """Flattened ``x``, ``alpha``/``sigma`` as ``[batch or 1, 1]``, centred ``x - alpha mu``,
        eigen-coordinates ``[batch, r]`` and the complement ``(I - U U^T)(x - alpha mu)``
        (``None`` when ``r = d``, where it is zero up to rounding)."""
        check_query(self, x, t)
        xf = flatten(x)
        a = broadcast_to_data(self.process.alpha(t), xf)
        s = broadcast_to_data(self.process.sigma(t), xf)
        centred = xf - a * self.mean
        coef = centred @ self.eigvecs  # [batch, r]
        d, r = self.eigvecs.shape
        outside = None if r == d else centred - coef @ self.eigvecs.T
        return xf, a, s, coef, outside

    def denoiser(self, x, t):
        """``mu + alpha Sigma (alpha^2 Sigma + sigma^2 I)^{-1} (x - alpha mu)``; shape of ``x``.

        The Wiener filter (Wang & Vastola 2024, eq. 5). ``x: [batch, *data_shape]``, ``t``
        scalar or ``[batch]``; ``ValueError`` for another shape of ``t``.
        """
        _, a, s, coef, outside = self._parts(x, t)
        gain = a * self.eigvals / (a**2 * self.eigvals + s**2)  # Wiener gain [batch, r]
        out = self.mean + (gain * coef) @ self.eigvecs.T
        if outside is not None:
            rgain = a * self.residual_var / (a**2 * self.residual_var + s**2)
            out = out + rgain * outside
        return jnp.reshape(out, x.shape)

    def log_prob(self, x, t):
        """``log N(x; alpha mu, alpha^2 Sigma + sigma^2 I)`` (nats): ``[batch]``.

        In the eigenbasis, ``-(sum c^2 / v + sum log v + d log 2 pi) / 2`` with
        ``v = alpha^2 lam + sigma^2`` (and ``alpha^2 rv + sigma^2`` on the ``d - r``
        directions of the complement). ``x: [batch, *data_shape]``, ``t`` scalar or
        ``[batch]``; ``ValueError`` for another shape of ``t``.
        """
        xf, a, s, coef, outside = self._parts(x, t)
        d, r = self.eigvecs.shape
        v = a**2 * self.eigvals + s**2  # [r] or [batch, r]
        quad = jnp.sum(coef**2 / v, axis=-1)
        logdet = jnp.broadcast_to(jnp.sum(jnp.log(v), axis=-1), quad.shape)
        if outside is not None:
            rv = jnp.reshape(a**2 * self.residual_var + s**2, (-1,))  # [1] or [batch]
            quad = quad + jnp.sum(outside**2, axis=-1) / rv
            logdet = logdet + (d - r) * jnp.log(rv)
        return -0.5 * (quad + logdet + d * jnp.log(2 * jnp.pi))

    def score(self, x, t):
        """``-(alpha^2 Sigma + sigma^2 I)^{-1} (x - alpha mu)``; shape of ``x``.

        Wang & Vastola 2024, eq. 4. Computed directly rather than through Tweedie, which
        would subtract two nearly equal numbers and divide by ``sigma^2`` (lossy at small
        sigma). ``ValueError`` for a ``t`` that is neither a scalar nor ``[batch]``.
        """
        _, a, s, coef, outside = self._parts(x, t)
        out = -(coef / (a**2 * self.eigvals + s**2)) @ self.eigvecs.T
        if outside is not None:
            out = out - outside / (a**2 * self.residual_var + s**2)
        return jnp.reshape(out, x.shape)


def _ve_alpha(process: Process, ve_sigma: Array) -> Array:
    """``alpha(t(ve_sigma))``; exactly 1 at ``ve_sigma = 0`` (the data frame)."""
    ve_sigma = jnp.asarray(ve_sigma)
    safe = jnp.where(ve_sigma > 0, ve_sigma, 1.0)
    a = process.alpha(process.t_of_ve_sigma(safe))
    return jnp.where(ve_sigma > 0, a, jnp.ones_like(a))


def _check_gaussian(gaussian) -> None:
    require(
        isinstance(gaussian, GaussianScore),
        "gaussian",
        "a scorelib GaussianScore",
        type(gaussian).__name__,
    )


def gaussian_flow(
    gaussian: GaussianScore, x: Array, *, sigma_from: Array, sigma_to: Array
) -> Array:
    """Closed-form solution of the Gaussian probability-flow ODE between two noise levels.

    Wang & Vastola 2024, eq. 8 (``edm_x_t_traj`` in their code), with the isotropic
    residual of a rank-``r`` fit. In the VE frame ``y = x / alpha`` at level ``sigma``,
    ``dy/dsigma = (y - D(y; sigma)) / sigma`` with the Wiener-filter denoiser ``D``, so

        y(s) = mu + U diag(sqrt((s^2 + lam) / (s_T^2 + lam))) U^T (y_T - mu)
                  + sqrt((s^2 + rv) / (s_T^2 + rv)) (I - U U^T) (y_T - mu)

    with ``s_T = sigma_from``, ``s = sigma_to``, ``rv = residual_var`` (``rv = 0`` gives
    the factor ``s / s_T`` of the paper). The map is exact for any ``s, s_T`` (the ODE is
    solved forwards or backwards), so there is no discretisation error; it costs two
    ``[batch, d] x [d, r]`` products.

    Args:
      gaussian: the Gaussian score source; its ``process`` gives ``alpha``.
      x: ``[batch, *data_shape]`` state in process coordinates at VE level ``sigma_from``.
      sigma_from: scalar or ``[batch]`` VE noise level ``s_T > 0`` (data units).
      sigma_to: scalar or ``[batch]`` VE noise level ``s >= 0``; at 0 the result is in
        the data frame (for ``rv = 0`` the complement is then projected out).

    Returns:
      ``[batch, *data_shape]``: the ODE solution in process coordinates at ``sigma_to``.

    Raises:
      ValueError: if ``gaussian`` is not a :class:`GaussianScore`, ``x`` is not real
        ``[batch, *data_shape]`` with the Gaussian's ``data_shape``, or a level is neither
        a scalar nor ``[batch]``.
    """
    _check_gaussian(gaussian)
    batch = check_examples(gaussian, x, "x")
    check_time(sigma_from, "sigma_from", batch)
    check_time(sigma_to, "sigma_to", batch)
    process = gaussian.process
    xf = flatten(x)
    s_t = broadcast_to_data(jnp.asarray(sigma_from, xf.dtype), xf)
    s = broadcast_to_data(jnp.asarray(sigma_to, xf.dtype), xf)
    a_t = broadcast_to_data(_ve_alpha(process, sigma_from).astype(xf.dtype), xf)
    a = broadcast_to_data(_ve_alpha(process, sigma_to).astype(xf.dtype), xf)
    mean, u, lam = gaussian.mean, gaussian.eigvecs, gaussian.eigvals
    centred = xf / a_t - mean
    coef = centred @ u  # [batch, r]
    out = mean + (jnp.sqrt((s**2 + lam) / (s_t**2 + lam)) * coef) @ u.T
    d, r = u.shape
    if r < d:
        rv = gaussian.residual_var
        outside = centred - coef @ u.T
        out = out + jnp.sqrt((s**2 + rv) / (s_t**2 + rv)) * outside
    return jnp.reshape(a * out, x.shape)


def gaussian_marginal_sample(gaussian: GaussianScore, eps: Array, ve_sigma: Array) -> Array:
    """A draw of the Gaussian model's marginal ``p_t`` at VE level ``ve_sigma``.

    ``x = alpha (mu + U diag(sqrt(lam + s^2)) U^T eps + sqrt(rv + s^2)(I - U U^T) eps)`` with
    ``s = ve_sigma``, i.e. ``x / alpha ~ N(mu, Sigma + s^2 I)`` (Wang & Vastola 2024, eq. 4
    convolved with the noise), mapped to process coordinates.

    Args:
      gaussian: the Gaussian score source.
      eps: ``[batch, *data_shape]`` standard normal draws.
      ve_sigma: scalar or ``[batch]`` VE noise level ``>= 0`` (data units).

    Returns:
      ``[batch, *data_shape]`` in process coordinates at ``ve_sigma``.

    Raises:
      ValueError: as :func:`gaussian_flow`, naming ``eps`` and ``ve_sigma``.
    """
    _check_gaussian(gaussian)
    check_time(ve_sigma, "ve_sigma", check_examples(gaussian, eps, "eps"))
    ef = flatten(eps)
    s = broadcast_to_data(jnp.asarray(ve_sigma, ef.dtype), ef)
    a = broadcast_to_data(_ve_alpha(gaussian.process, ve_sigma).astype(ef.dtype), ef)
    u, lam = gaussian.eigvecs, gaussian.eigvals
    coef = ef @ u
    out = gaussian.mean + (jnp.sqrt(lam + s**2) * coef) @ u.T
    d, r = u.shape
    if r < d:
        out = out + jnp.sqrt(gaussian.residual_var + s**2) * (ef - coef @ u.T)
    return jnp.reshape(a * out, eps.shape)
