"""The analytic score of a Gaussian mixture under any process.

With ``x_0 ~ sum_k w_k N(m_k, C_k)``, ``x_t ~ sum_k w_k N(alpha m_k, alpha^2 C_k + sigma^2 I)``;
the score is the responsibility-weighted sum of the component scores
``-(alpha^2 C_k + sigma^2 I)^{-1} (x - alpha m_k)``, with responsibilities by
``logsumexp`` (Bishop, "Pattern recognition and machine learning", 2006, Sec. 9.2,
with each component convolved with the noise). Covariances are handled through
their eigendecompositions, never by ``inv``.

The terms are written once, in :func:`mixture_terms`; :class:`MixtureScore` evaluates
them at a process's ``(alpha(t), sigma(t))`` and the clean mixture target
(``scorelib.data.targets.GaussianMixtureTarget``) at ``(1, 0)``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from scorelib._checks import require
from scorelib.processes.base import broadcast_to_data
from scorelib.scores.base import ScoreSource, check_data_shape, check_query, flatten

Array = Any


def mixture_terms(
    x: Array,
    *,
    log_weights: Array,
    means: Array,
    eigvecs: Array,
    eigvals: Array,
    alpha: Array = 1.0,
    sigma: Array = 0.0,
) -> tuple[Array, Array]:
    """Per-component joint log-densities and scores of a noised Gaussian mixture.

    Component ``k`` of ``x_t`` is ``N(alpha m_k, alpha^2 C_k + sigma^2 I)`` with
    ``C_k = U_k diag(lam_k) U_k^T``; in its eigenbasis, with ``c = U_k^T (x - alpha m_k)``
    and ``v = alpha^2 lam_k + sigma^2``::

        log w_k + log N = log w_k - (sum c^2 / v + sum log v + d log 2 pi) / 2
        score_k         = -U_k (c / v)

    Args:
      x: ``[batch, d]`` points (data units).
      log_weights: ``[K]`` normalised log mixture weights.
      means: ``[K, d]``.
      eigvecs: ``[K, d, d]`` orthonormal eigenvectors (columns) of each covariance.
      eigvals: ``[K, d]`` eigenvalues of each covariance (>= 0; > 0 where ``sigma = 0``).
      alpha, sigma: scalars or ``[batch, 1, 1]``: the process's signal scale and noise
        std at ``t``; the defaults ``(1, 0)`` give the clean mixture ``p_0``.

    Returns:
      ``(log_joint [batch, K], comp_score [batch, K, d])``: ``log w_k + log N_k(x)``
      (nats) and the component scores (units of 1 / data).
    """
    var = alpha**2 * eigvals[None] + sigma**2  # [b or 1, K, d]
    diff = x[:, None, :] - alpha * means[None]  # [b, K, d]
    coef = jnp.einsum("bkd,kde->bke", diff, eigvecs)  # eigen-coordinates
    d = x.shape[-1]
    logp = -0.5 * (jnp.sum(coef**2 / var, -1) + jnp.sum(jnp.log(var), -1) + d * jnp.log(2 * jnp.pi))
    comp_score = -jnp.einsum("bke,kde->bkd", coef / var, eigvecs)
    return logp + log_weights, comp_score


def mixture_log_prob(log_joint: Array) -> Array:
    """``log p(x) = logsumexp_k log_joint`` (nats): ``[batch, K] -> [batch]``.

    ``log_joint`` comes from :func:`mixture_terms`.
    """
    return jax.nn.logsumexp(log_joint, axis=-1)


def mixture_score(log_joint: Array, comp_score: Array) -> Array:
    """``sum_k r_k(x) score_k(x)`` with responsibilities ``r = softmax_k(log_joint)``.

    Args:
      log_joint: ``[batch, K]`` and comp_score: ``[batch, K, d]`` from :func:`mixture_terms`.

    Returns:
      ``[batch, d]`` (units of 1 / data).
    """
    resp = jax.nn.softmax(log_joint, axis=-1)
    return jnp.einsum("bk,bkd->bd", resp, comp_score)


class MixtureScore(ScoreSource):
    """Score source of a Gaussian mixture in ``d`` dimensions with full covariances.

    ``denoiser`` follows by Tweedie's formula (:class:`scorelib.scores.ScoreSource`).

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

        The weights are normalised; the covariances are symmetrised and
        eigendecomposed in float64 numpy (eigenvalues clipped at 0) and stored in JAX's
        default float dtype (float32 unless x64 is enabled).

        Args:
          process: the noise process.
          weights, means, covs: the mixture (data units).
          data_shape: the unflattened shape of one example (default ``(d,)``).

        Raises:
          ValueError: on inconsistent shapes (``data_shape`` included) or non-positive
            weights.
        """
        weights = np.asarray(weights, dtype=np.float64)
        means = np.asarray(means, dtype=np.float64)
        covs = np.asarray(covs, dtype=np.float64)
        require(means.ndim == 2, "means", "of shape [K, d]", means.shape)
        k, d = means.shape
        ok = weights.shape == (k,) and np.all(np.isfinite(weights) & (weights > 0))
        require(ok, "weights", f"{k} positive numbers", weights)
        require(covs.shape == (k, d, d), "covs", f"of shape ({k}, {d}, {d})", covs.shape)
        data_shape = check_data_shape(data_shape, d)
        lam, u = np.linalg.eigh(0.5 * (covs + np.swapaxes(covs, -1, -2)))
        dtype = jax.dtypes.canonicalize_dtype(np.float64)  # float32 unless x64 is enabled
        return cls(
            process=process,
            log_weights=jnp.asarray(np.log(weights / weights.sum()), dtype),
            means=jnp.asarray(means, dtype),
            eigvecs=jnp.asarray(u, dtype),
            eigvals=jnp.asarray(np.clip(lam, 0.0, None), dtype),
            data_shape=data_shape,
        )

    def _terms(self, x, t):
        check_query(self, x, t)
        xf = flatten(x)
        a = broadcast_to_data(self.process.alpha(t), xf)[..., None]  # [batch or 1, 1, 1]
        s = broadcast_to_data(self.process.sigma(t), xf)[..., None]
        return mixture_terms(
            xf,
            log_weights=self.log_weights,
            means=self.means,
            eigvecs=self.eigvecs,
            eigvals=self.eigvals,
            alpha=a,
            sigma=s,
        )

    def log_prob(self, x, t):
        """``log p_t(x)`` (nats): ``x: [batch, *data_shape]``, ``t`` scalar or ``[batch]``
        -> ``[batch]``.

        Raises:
          ValueError: if ``t`` is neither a scalar nor ``[batch]``.
        """
        return mixture_log_prob(self._terms(x, t)[0])

    def score(self, x, t):
        """``grad_x log p_t(x)``: the responsibility-weighted component scores; shape of ``x``.

        Raises:
          ValueError: if ``t`` is neither a scalar nor ``[batch]``.
        """
        return jnp.reshape(mixture_score(*self._terms(x, t)), x.shape)
