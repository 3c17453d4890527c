"""The analytic score of Gaussian data N(mu, Sigma) under any process.

With ``x_0 ~ N(mu, Sigma)``, ``x_t ~ N(alpha mu, alpha^2 Sigma + sigma^2 I)`` so
(Wang & Vastola, TMLR 2024, eqs. 4-5, generalised to ``alpha != 1``)::

    score(x, t) = -(alpha^2 Sigma + sigma^2 I)^{-1} (x - alpha mu)
    D(x, t)     = mu + alpha Sigma (alpha^2 Sigma + sigma^2 I)^{-1} (x - alpha mu)

Everything is computed in the eigenbasis ``Sigma = U diag(lam) U^T``; never by
``inv``. ``U`` may have ``r < d`` columns, in which case the orthogonal
complement carries an isotropic variance ``residual_var``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from scorelib.processes.base import broadcast_to_data
from scorelib.scores.base import ScoreSource, check_time_shape, flatten

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

        The eigendecomposition is done in float64 numpy; the fields are stored in
        JAX's default float dtype (float32 unless x64 is enabled).

        Raises:
          ValueError: if ``cov`` is not ``[d, d]`` with ``d = mean.size``.
        """
        mean = np.asarray(mean, np.float64).reshape(-1)
        cov = np.asarray(cov, np.float64)
        d = mean.shape[0]
        if cov.shape != (d, d):
            raise ValueError(f"cov must have shape ({d}, {d}) to match mean; got {cov.shape}")
        lam, u = np.linalg.eigh(0.5 * (cov + cov.T))
        dtype = jax.dtypes.canonicalize_dtype(np.float64)
        return cls(
            process=process,
            mean=jnp.asarray(mean, dtype),
            eigvecs=jnp.asarray(u, dtype),
            eigvals=jnp.asarray(np.clip(lam, 0.0, None), dtype),
            residual_var=jnp.asarray(0.0, dtype),
            data_shape=tuple(data_shape) if data_shape is not None else (d,),
        )

    def _parts(self, x, t):
        """Flattened ``x``, ``alpha``/``sigma`` as ``[batch or 1, 1]``, centred ``x - alpha mu``,
        eigen-coordinates ``[batch, r]`` and the complement ``(I - U U^T)(x - alpha mu)``
        (``None`` when ``r = d``, where it is zero up to rounding)."""
        check_time_shape(x, t)
        xf = flatten(x)
        a = broadcast_to_data(self.process.alpha(t), xf)
        s = broadcast_to_data(self.process.sigma(t), xf)
        centred = xf - a * self.mean
        coef = centred @ self.eigvecs  # [batch, r]
        d, r = self.eigvecs.shape
        outside = None if r == d else centred - coef @ self.eigvecs.T
        return xf, a, s, coef, outside

    def denoiser(self, x, t):
        """``mu + alpha Sigma (alpha^2 Sigma + sigma^2 I)^{-1} (x - alpha mu)``; shape of ``x``."""
        _, a, s, coef, outside = self._parts(x, t)
        gain = a * self.eigvals / (a**2 * self.eigvals + s**2)  # Wiener gain [batch, r]
        out = self.mean + (gain * coef) @ self.eigvecs.T
        if outside is not None:
            rgain = a * self.residual_var / (a**2 * self.residual_var + s**2)
            out = out + rgain * outside
        return jnp.reshape(out, x.shape)

    def score(self, x, t):
        """``-(alpha^2 Sigma + sigma^2 I)^{-1} (x - alpha mu)``; shape of ``x``.

        Computed directly rather than through Tweedie, which would subtract two
        nearly equal numbers and divide by ``sigma^2`` (lossy at small sigma).
        """
        _, a, s, coef, outside = self._parts(x, t)
        out = -(coef / (a**2 * self.eigvals + s**2)) @ self.eigvecs.T
        if outside is not None:
            out = out - outside / (a**2 * self.residual_var + s**2)
        return jnp.reshape(out, x.shape)
