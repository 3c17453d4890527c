"""Fits of a data set: a Gaussian (full or low rank) and a k-means Gaussian mixture.

Wang & Vastola, "The unreasonable effectiveness of Gaussian score approximation for
diffusion models and its applications", TMLR 2024 (arXiv 2412.09726; precursor arXiv
2311.10892), Secs. 3 and 5: the Gaussian and mixture score approximations of a trained
diffusion model are the exact scores of these fits (:class:`scorelib.scores.GaussianScore`,
:class:`scorelib.scores.MixtureScore`, for every process). The closed-form
probability-flow ODE of the Gaussian lives beside it, in ``scorelib/scores/gaussian.py``.

Data units: fits are made in the units of the data passed in (for images: the
``[-1, 1]`` scale the model is trained on), so ``mu`` and ``lam`` are directly the
``2 mean - 1`` and ``4 eigval`` of a fit on ``[0, 1]`` images.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_int, check_real, check_real_dtype, is_int, require
from scorelib.processes.base import Process
from scorelib.scores.gaussian import GaussianScore
from scorelib.scores.mixture import MixtureScore

Array = Any

__all__ = ["fit_gaussian", "fit_kmeans_mixture"]


def _as_matrix(data) -> tuple[np.ndarray, tuple]:
    check_real_dtype(data, "data")
    x = np.asarray(data, dtype=np.float64)
    if x.ndim < 2:
        raise ValueError(f"data must have shape [n, *data_shape] with n >= 2; got {x.shape}")
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"data must hold at least 2 examples to fit a covariance; got n = {n}")
    if not np.all(np.isfinite(x)):
        raise ValueError("data must be finite")
    return x.reshape(n, -1), tuple(x.shape[1:])


def fit_gaussian(
    process: Process, data, rank: int | None = None, *, ddof: int = 1
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
    centred ``[n, d]`` data, so no ``d x d`` matrix is formed. ``rank = 0`` is the isotropic
    fit ``N(mu, (tr Sigma / d) I)`` (the baseline of Wang & Vastola's explained-variance
    comparison).

    Args:
      process: the noise process the score source answers for.
      data: ``[n, *data_shape]`` training examples in data units (e.g. images in
        ``[-1, 1]``, NHWC), ``n >= 2``.
      rank: ``None`` (full rank, ``U`` is ``[d, d]``) or an integer ``0 <= r <= d`` (0:
        isotropic, ``U`` is ``[d, 0]``).
      ddof: delta degrees of freedom of the covariance (1: unbiased; 0: maximum likelihood).

    Returns:
      :class:`GaussianScore` with ``mean [d]``, ``eigvecs [d, r]``, ``eigvals [r]`` (sorted
      descending, clipped at 0), ``residual_var`` (0 at full rank) and ``data_shape``;
      arrays in JAX's default float dtype (float32 unless x64 is enabled).

    Raises:
      ValueError: for data that is not real ``[n >= 2, ...]`` and finite, a ``rank`` outside
        ``[0, d]``, or ``ddof`` not in ``[0, n)``.
    """
    x, data_shape = _as_matrix(data)
    n, d = x.shape
    require(is_int(ddof) and 0 <= ddof < n, "ddof", f"an integer in [0, n = {n})", ddof)
    require(
        rank is None or (is_int(rank) and 0 <= rank <= d),
        "rank",
        f"None or an integer in [0, d = {d}]",
        rank,
    )
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
            q, _ = np.linalg.qr(np.concatenate([u_all, np.eye(d)[:, :r]], axis=1))
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


def fit_kmeans_mixture(
    process: Process, data, n_components: int = 10, *, ridge: float = 1e-4, seed: int = 0
) -> MixtureScore:
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
    # scikit-learn takes about 1 s to import: paid on first use only
    from sklearn.cluster import KMeans

    x, data_shape = _as_matrix(data)
    n, d = x.shape
    check_int(n_components, "n_components", low=1, high=n)
    check_real(ridge, "ridge", low=0.0, high_open=True)
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
    return MixtureScore.create(
        process, np.array(weights), np.stack(means), np.stack(covs), data_shape=data_shape
    )
