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

        Raises:
          ValueError: if ``cov`` is not ``[d, d]`` with ``d = mean.size``.
        """
        mean = np.asarray(mean).reshape(-1)
        cov = np.asarray(cov)
        d = mean.shape[0]
        if cov.shape != (d, d):
            raise ValueError(f"cov must have shape ({d}, {d}) to match mean; got {cov.shape}")
        lam, u = np.linalg.eigh(0.5 * (cov + cov.T))
        return cls(
            process=process,
            mean=jnp.asarray(mean),
            eigvecs=jnp.asarray(u),
            eigvals=jnp.asarray(np.clip(lam, 0.0, None)),
            residual_var=jnp.asarray(0.0, mean.dtype),
            data_shape=tuple(data_shape) if data_shape is not None else (d,),
        )

    def _gain(self, t, x, lam):
        """Per-eigenvalue Wiener gain alpha lam / (alpha^2 lam + sigma^2), broadcast to [batch, r]."""
        a = broadcast_to_data(self.process.alpha(t), x)
        s = broadcast_to_data(self.process.sigma(t), x)
        return a, s, a * lam / (a**2 * lam + s**2)

    def denoiser(self, x, t):
        check_time_shape(x, t)
        xf = flatten(x)
        a, s, gain = self._gain(t, xf, self.eigvals)
        centred = xf - a * self.mean
        coef = centred @ self.eigvecs  # [batch, r]
        inside = (gain * coef) @ self.eigvecs.T
        outside = centred - coef @ self.eigvecs.T
        rgain = a * self.residual_var / (a**2 * self.residual_var + s**2)
        out = self.mean + inside + rgain * outside
        return jnp.reshape(out, x.shape)
