"""Gaussian (and k-means Gaussian-mixture) fits of a data set, and the closed-form
probability-flow ODE of Gaussian data.

Wang & Vastola, "The unreasonable effectiveness of Gaussian score approximation for
diffusion models and its applications", TMLR 2024 (arXiv 2311.10892 / 2412.09726):

* Sec. 3, eqs. 4-5: for data ``N(mu, Sigma)``, ``Sigma = U diag(lam) U^T``, the VE-frame
  score at noise level ``sigma`` is ``-(Sigma + sigma^2 I)^{-1} (x - mu)`` and the denoiser
  is the Wiener filter ``mu + U diag(lam / (lam + sigma^2)) U^T (x - mu)``
  (:class:`scorelib.scores.GaussianScore` implements both, for every process).
* Sec. 4, eq. 8: the probability-flow ODE ``dx/dsigma = (x - D(x; sigma)) / sigma``
  decouples in the eigenbasis into ``dc_k / dsigma = sigma c_k / (lam_k + sigma^2)``, so
  ``c_k(sigma) = sqrt((sigma^2 + lam_k) / (sigma_T^2 + lam_k)) c_k(sigma_T)``.

Everything here works in the VE frame ``x / alpha(t)`` at ``ve_sigma = sigma(t) / alpha(t)``
(Karras et al. 2022, eq. 4), so one formula serves VE, EDM, VP and sub-VP; inputs and
outputs are in process coordinates.

Data units: fits are made in the units of the data passed in (for images: the
``[-1, 1]`` scale the model is trained on), so ``mu`` and ``lam`` are directly the
``2 mean - 1`` and ``4 eigval`` of a fit on ``[0, 1]`` images.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib.processes.base import Process, broadcast_to_data
from scorelib.scores.base import flatten
from scorelib.scores.gaussian import GaussianScore
from scorelib.scores.mixture import MixtureScore

Array = Any

__all__ = [
    "fit_gaussian",
    "fit_kmeans_mixture",
    "gaussian_flow",
    "gaussian_marginal_sample",
]


def _as_matrix(data) -> tuple[np.ndarray, tuple]:
    x = np.asarray(data, dtype=np.float64)
    if x.ndim < 2:
        raise ValueError(f"data must have shape [n, *data_shape] with n >= 2; got {x.shape}")
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"data must hold at least 2 examples to fit a covariance; got n = {n}")
    if not np.all(np.isfinite(x)):
        raise ValueError("data must be finite")
    return x.reshape(n, -1), tuple(x.shape[1:])


def fit_gaussian(process: Process, data, rank: int | None = None, *, ddof: int = 1
                 ) -> GaussianScore:
    """Fit ``N(mu, Sigma)`` to a data set and return it as a score source.

    ``mu`` is the sample mean and ``Sigma`` the sample covariance (divisor ``n - ddof``),
    both computed in float64 numpy; ``Sigma = U diag(lam) U^T`` by ``eigh``.

    With ``rank = r < d`` only the top ``r`` eigenpairs are kept and the orthogonal
    complement gets the isotropic variance ``residual_var = (tr Sigma - sum_{k<=r} lam_k)
    / (d - r)``, the mean of the discarded eigenvalues. This keeps the trace (the total
    variance) of the fitted covariance equal to that of the sample covariance, and is
    the maximum-likelihood isotropic residual (probabilistic PCA, Tipping & Bishop 1999,
    eq. 8). When ``n - ddof < d`` the top ``r`` eigenpairs come from an SVD of the
    centred ``[n, d]`` data, so no ``d x d`` matrix is formed.

    Args:
      process: the noise process the score source answers for.
      data: ``[n, *data_shape]`` training examples in data units (e.g. images in
        ``[-1, 1]``, NHWC), ``n >= 2``.
      rank: ``None`` (full rank, ``U`` is ``[d, d]``) or an integer ``1 <= r <= d``.
      ddof: delta degrees of freedom of the covariance (1: unbiased; 0: maximum likelihood).

    Returns:
      :class:`GaussianScore` with ``mean [d]``, ``eigvecs [d, r]``, ``eigvals [r]`` (sorted
      descending, clipped at 0), ``residual_var`` (0 at full rank) and ``data_shape``;
      arrays in JAX's default float dtype (float32 unless x64 is enabled).

    Raises:
      ValueError: for data that is not ``[n >= 2, ...]`` and finite, a ``rank`` outside
        ``[1, d]``, or ``ddof`` not in ``[0, n)``.
    """
    x, data_shape = _as_matrix(data)
    n, d = x.shape
    if isinstance(ddof, bool) or not isinstance(ddof, (int, np.integer)) or not 0 <= ddof < n:
        raise ValueError(f"ddof must be an integer in [0, n = {n}); got {ddof!r}")
    if rank is not None and (
        isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 1 <= rank <= d
    ):
        raise ValueError(f"rank must be None or an integer in [1, d = {d}]; got {rank!r}")
    mean = x.mean(axis=0)
    xc = x - mean
    denom = float(n - ddof)
    r = d if rank is None else int(rank)
    if r < d and n < d:
        # Economy SVD of the centred data: Sigma = W diag(s^2 / denom) W^T, rank <= n.
        _, s, wt = np.linalg.svd(xc, full_matrices=False)
        lam_all = s**2 / denom
        u_all = wt.T  # [d, min(n, d)]
        if r > u_all.shape[1]:
            # More directions than the data spans: complete the basis with zero variance.
            q, _ = np.linalg.qr(np.concatenate([u_all, np.eye(d)[:, : r]], axis=1))
            extra = q[:, u_all.shape[1] : r]
            u_all = np.concatenate([u_all, extra], axis=1)
            lam_all = np.concatenate([lam_all, np.zeros(r - lam_all.shape[0])])
        lam, u = lam_all[:r], u_all[:, :r]
    else:
        cov = xc.T @ xc / denom
        lam_all, u_all = np.linalg.eigh(0.5 * (cov + cov.T))
        order = np.argsort(lam_all)[::-1]
        lam, u = lam_all[order][:r], u_all[:, order][:, :r]
    lam = np.clip(lam, 0.0, None)
    if r < d:
        total = float(np.sum(xc**2) / denom)  # tr Sigma, exact
        residual = max(total - float(lam.sum()), 0.0) / (d - r)
    else:
        residual = 0.0
    dtype = jax.dtypes.canonicalize_dtype(np.float64)
    return GaussianScore(
        process=process,
        mean=jnp.asarray(mean, dtype),
        eigvecs=jnp.asarray(u, dtype),
        eigvals=jnp.asarray(lam, dtype),
        residual_var=jnp.asarray(residual, dtype),
        data_shape=data_shape,
    )


def fit_kmeans_mixture(process: Process, data, n_components: int = 10, *, ridge: float = 1e-4,
                       seed: int = 0) -> MixtureScore:
    """A Gaussian mixture fitted by k-means (Wang & Vastola 2024, Sec. 5, "GMM" score).

    scikit-learn ``KMeans(n_components, n_init=10, random_state=seed)`` on the flattened
    data; each cluster becomes a component with weight ``n_k / n``, its mean, and its
    maximum-likelihood covariance plus ``ridge * I`` (so that clusters of fewer than
    ``d + 1`` points stay positive definite).

    Args:
      process: the noise process.
      data: ``[n, *data_shape]`` in data units, ``n >= n_components``.
      n_components: number of clusters K (>= 1).
      ridge: variance (data units squared, >= 0) added to every covariance's diagonal.
      seed: k-means random state.

    Returns:
      :class:`MixtureScore` with ``K`` components (``[K, d, d]`` eigendecompositions).

    Raises:
      ValueError: for bad data, ``n_components`` outside ``[1, n]`` or a negative ridge.
    """
    from sklearn.cluster import KMeans

    x, data_shape = _as_matrix(data)
    n, d = x.shape
    if isinstance(n_components, bool) or not isinstance(n_components, (int, np.integer)) or (
        not 1 <= n_components <= n
    ):
        raise ValueError(f"n_components must be an integer in [1, n = {n}]; got {n_components!r}")
    if not (np.isfinite(ridge) and ridge >= 0):
        raise ValueError(f"ridge must be a finite number >= 0; got {ridge!r}")
    labels = KMeans(n_clusters=int(n_components), n_init=10, random_state=seed).fit_predict(x)
    weights, means, covs = [], [], []
    for k in range(int(n_components)):
        xk = x[labels == k]
        if xk.shape[0] == 0:
            continue
        m = xk.mean(axis=0)
        c = (xk - m).T @ (xk - m) / xk.shape[0]
        weights.append(xk.shape[0] / n)
        means.append(m)
        covs.append(c + ridge * np.eye(d))
    return MixtureScore.create(process, np.array(weights), np.stack(means), np.stack(covs),
                               data_shape=data_shape)


def _ve_alpha(process: Process, ve_sigma: Array) -> Array:
    """``alpha(t(ve_sigma))``; exactly 1 at ``ve_sigma = 0`` (the data frame)."""
    ve_sigma = jnp.asarray(ve_sigma)
    safe = jnp.where(ve_sigma > 0, ve_sigma, 1.0)
    a = process.alpha(process.t_of_ve_sigma(safe))
    return jnp.where(ve_sigma > 0, a, jnp.ones_like(a))


def _check_gaussian(gaussian) -> None:
    if not isinstance(gaussian, GaussianScore):
        raise ValueError(
            f"gaussian must be a scorelib GaussianScore; got {type(gaussian).__name__}"
        )


def gaussian_flow(gaussian: GaussianScore, x: Array, *, sigma_from: Array, sigma_to: Array
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
      ValueError: if ``gaussian`` is not a :class:`GaussianScore`, or the levels do not
        broadcast as scalars or ``[batch]``.
    """
    _check_gaussian(gaussian)
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


def gaussian_marginal_sample(gaussian: GaussianScore, eps: Array, sigma: Array) -> Array:
    """A draw of the Gaussian model's marginal ``p_t`` at VE level ``sigma``.

    ``x = alpha (mu + U diag(sqrt(lam + sigma^2)) U^T eps + sqrt(rv + sigma^2)(I - U U^T) eps)``,
    i.e. ``x / alpha ~ N(mu, Sigma + sigma^2 I)`` (Wang & Vastola 2024, eq. 4 convolved with
    the noise), mapped to process coordinates.

    Args:
      gaussian: the Gaussian score source.
      eps: ``[batch, *data_shape]`` standard normal draws.
      sigma: scalar or ``[batch]`` VE noise level ``>= 0``.

    Returns:
      ``[batch, *data_shape]`` in process coordinates at ``sigma``.

    Raises:
      ValueError: as :func:`gaussian_flow`.
    """
    _check_gaussian(gaussian)
    ef = flatten(eps)
    s = broadcast_to_data(jnp.asarray(sigma, ef.dtype), ef)
    a = broadcast_to_data(_ve_alpha(gaussian.process, sigma).astype(ef.dtype), ef)
    u, lam = gaussian.eigvecs, gaussian.eigvals
    coef = ef @ u
    out = gaussian.mean + (jnp.sqrt(lam + s**2) * coef) @ u.T
    d, r = u.shape
    if r < d:
        out = out + jnp.sqrt(gaussian.residual_var + s**2) * (ef - coef @ u.T)
    return jnp.reshape(a * out, eps.shape)
