"""The analytic score of a Gaussian mixture under any process.

With ``x_0 ~ sum_k w_k N(m_k, C_k)``, ``x_t ~ sum_k w_k N(alpha m_k, alpha^2 C_k + sigma^2 I)``;
the score is the responsibility-weighted sum of the component scores
``-(alpha^2 C_k + sigma^2 I)^{-1} (x - alpha m_k)``, with responsibilities by
``logsumexp``. Covariances are handled through their eigendecompositions.
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


class MixtureScore(ScoreSource):
    """Score source of a Gaussian mixture in ``d`` dimensions with full covariances.

    Fields:
      log_weights: ``[K]`` normalised log mixture weights.
      means: ``[K, d]``.
      eigvecs: ``[K, d, d]`` eigenvectors of each covariance.
      eigvals: ``[K, d]`` eigenvalues (>= 0) of each covariance.
      data_shape: unflattened data shape (static).
    """

    log_weights: Array = None
    means: Array = None
    eigvecs: Array = None
    eigvals: Array = None
    data_shape: tuple = struct.field(pytree_node=False, default=())

    @classmethod
    def create(cls, process, weights, means, covs, data_shape=None):
        """Build from weights ``[K]`` (positive), means ``[K, d]``, covariances ``[K, d, d]``.

        Raises:
          ValueError: on inconsistent shapes or non-positive weights.
        """
        weights = np.asarray(weights, dtype=np.float64)
        means = np.asarray(means, dtype=np.float64)
        covs = np.asarray(covs, dtype=np.float64)
        if means.ndim != 2:
            raise ValueError(f"means must have shape [K, d]; got {means.shape}")
        k, d = means.shape
        if weights.shape != (k,) or not np.all(np.isfinite(weights) & (weights > 0)):
            raise ValueError(f"weights must be {k} positive numbers; got {weights}")
        if covs.shape != (k, d, d):
            raise ValueError(f"covs must have shape ({k}, {d}, {d}); got {covs.shape}")
        lam, u = np.linalg.eigh(0.5 * (covs + np.swapaxes(covs, -1, -2)))
        dtype = jax.dtypes.canonicalize_dtype(np.float64)  # float32 unless x64 is enabled
        return cls(
            process=process,
            log_weights=jnp.asarray(np.log(weights / weights.sum()), dtype),
            means=jnp.asarray(means, dtype),
            eigvecs=jnp.asarray(u, dtype),
            eigvals=jnp.asarray(np.clip(lam, 0.0, None), dtype),
            data_shape=tuple(data_shape) if data_shape is not None else (d,),
        )

    def _component_terms(self, x, t):
        """Per-component log-densities ``[batch, K]`` and scores ``[batch, K, d]``."""
        xf = flatten(x)
        a = broadcast_to_data(self.process.alpha(t), xf)[..., None]  # [batch or 1, 1, 1]
        s = broadcast_to_data(self.process.sigma(t), xf)[..., None]
        var = a**2 * self.eigvals[None] + s**2  # [b, K, d]
        diff = xf[:, None, :] - a * self.means[None]  # [b, K, d]
        coef = jnp.einsum("bkd,kde->bke", diff, self.eigvecs)  # eigen-coordinates
        d = xf.shape[-1]
        logp = -0.5 * (
            jnp.sum(coef**2 / var, -1) + jnp.sum(jnp.log(var), -1) + d * jnp.log(2 * jnp.pi)
        )
        comp_score = -jnp.einsum("bke,kde->bkd", coef / var, self.eigvecs)
        return logp + self.log_weights, comp_score

    def log_prob(self, x, t):
        """``log p_t(x)``: ``[batch]``."""
        check_time_shape(x, t)
        logp, _ = self._component_terms(x, t)
        return jax.nn.logsumexp(logp, axis=-1)

    def score(self, x, t):
        check_time_shape(x, t)
        logp, comp_score = self._component_terms(x, t)
        resp = jax.nn.softmax(logp, axis=-1)
        return jnp.reshape(jnp.einsum("bk,bkd->bd", resp, comp_score), x.shape)
