"""Fréchet distance between Gaussians, computed with symmetric eigendecompositions.

``FD = |mu1 - mu2|^2 + tr C1 + tr C2 - 2 tr (C1^{1/2} C2 C1^{1/2})^{1/2}``
(Dowson & Landau 1982; used as FID by Heusel et al. 2017). The cross term is the
trace of the square root of the *symmetric* PSD matrix ``C1^{1/2} C2 C1^{1/2}``,
whose eigenvalues equal those of ``C1 C2``; both square roots come from ``eigh``
with negative and numerically zero eigenvalues (below ``d * eps * max``, round-off)
set to 0, so the result is always real and accurate also for singular covariances
(fewer samples than dimensions). Computed in float64.
"""

from __future__ import annotations

import numpy as np

from scorelib._checks import check_example_sets, check_real_dtype, check_shape


def _clip_eigs(w: np.ndarray) -> np.ndarray:
    """Eigenvalues of a PSD matrix with round-off removed: values below
    ``d * eps * max|w|`` (numerically zero, as in ``matrix_rank``) become 0. Without
    this, ``sqrt`` turns ~1e-16 round-off into ~1e-8 per null direction."""
    tol = w.size * np.finfo(w.dtype).eps * np.max(np.abs(w), initial=0.0)
    return np.where(w > tol, w, 0.0)


def _psd_sqrt(c: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh(0.5 * (c + c.T))
    return (v * np.sqrt(_clip_eigs(w))) @ v.T


def _check_stats(mu, cov, which):
    check_real_dtype(mu, f"mu{which}")
    check_real_dtype(cov, f"cov{which}")
    mu = np.asarray(mu, dtype=np.float64)
    cov = np.asarray(cov, dtype=np.float64)
    if mu.ndim != 1 or cov.shape != (mu.shape[0], mu.shape[0]):
        raise ValueError(
            f"mu{which} must be [d] and cov{which} [d, d]; got {mu.shape}, {cov.shape}"
        )
    if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(cov))):
        raise ValueError(f"mu{which} and cov{which} must be finite")
    return mu, cov


def frechet_distance(mu1, cov1, mu2, cov2) -> float:
    """Fréchet (2-Wasserstein squared) distance between ``N(mu1, cov1)`` and ``N(mu2, cov2)``.

    Args:
      mu1, mu2: ``[d]`` means; cov1, cov2: ``[d, d]`` symmetric PSD covariances (a
        slightly asymmetric or slightly indefinite input from round-off is
        symmetrised and clipped).

    Returns:
      FD in squared feature units, a Python float; ``FD(N(0, I_d), N(1, I_d)) = d``.
      Round-off can leave a value of order ``-1e-12 * tr(cov)`` for equal inputs; it
      is not clipped.

    Raises:
      ValueError: for shape mismatches or non-finite inputs.

    Reference: Heusel et al. 2017, "GANs trained by a two time-scale update rule
    converge to a local Nash equilibrium" (FID); Dowson & Landau 1982.
    """
    mu1, cov1 = _check_stats(mu1, cov1, 1)
    mu2, cov2 = _check_stats(mu2, cov2, 2)
    check_shape(mu2, "mu2", mu1.shape, note=" (the shape of mu1)")
    s1 = _psd_sqrt(cov1)
    m = s1 @ cov2 @ s1
    w = np.linalg.eigvalsh(0.5 * (m + m.T))
    cross = np.sum(np.sqrt(_clip_eigs(w)))
    diff = mu1 - mu2
    return float(diff @ diff + np.trace(cov1) + np.trace(cov2) - 2.0 * cross)


def gaussian_stats(features) -> tuple[np.ndarray, np.ndarray]:
    """Mean ``[f]`` and unbiased covariance ``[f, f]`` (ddof = 1) of ``features: [n, f]``, float64.

    Raises:
      ValueError: if ``features`` is not 2-D, has fewer than 2 rows, or is not finite.
    """
    check_real_dtype(features, "features")
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or f.shape[0] < 2:
        raise ValueError(f"features must be [n >= 2, f]; got shape {f.shape}")
    if not np.all(np.isfinite(f)):
        raise ValueError("features must be finite")
    mu = f.mean(axis=0)
    c = f - mu
    return mu, (c.T @ c) / (f.shape[0] - 1)


def fd_features(a, b) -> float:
    """Fréchet distance between Gaussians fitted to two feature sets ``a: [n, f]``, ``b: [m, f]``.

    Raises:
      ValueError: naming ``a`` or ``b`` (``b`` must have ``a``'s ``f``), as
        :func:`gaussian_stats` and :func:`frechet_distance`.
    """
    check_example_sets(a, b, ("a", "b"))
    return frechet_distance(*gaussian_stats(a), *gaussian_stats(b))


def fd_floor(train_features, ref_features, n: int, *, draws: int = 5, seed: int = 0):
    """The FD a perfect sampler of the training distribution gets with ``n`` samples.

    Each draw takes ``n`` rows of ``train_features: [m, f]`` i.i.d. *with replacement*
    (``n`` samples of the training set's empirical distribution, as a model that
    reproduced it exactly would give) and computes their FD to ``ref_features: [k, f]``.
    A subset drawn *without* replacement is not such a floor: with ``n`` close to ``m``
    it has almost no sampling noise (e.g. almost exact class proportions), so its FD
    lies below what any i.i.d. sampler, however good, reaches with ``n`` samples.

    Args:
      train_features: ``[m, f]`` features of the training set.
      ref_features: ``[k, f]`` features of the reference (test) set.
      n: samples per draw (>= 2), the number of samples the floor is compared with.
      draws: number of independent draws (>= 1).
      seed: numpy seed of the draws.

    Returns:
      ``(mean, std)`` of the FD over the draws (``std`` is 0 for one draw).

    Raises:
      ValueError: for ``n < 2`` or ``draws < 1``, and as :func:`fd_features`.
    """
    if n < 2 or draws < 1:
        raise ValueError(f"fd_floor needs n >= 2 and draws >= 1; got n={n}, draws={draws}")
    check_example_sets(train_features, ref_features, ("train_features", "ref_features"))
    train = np.asarray(train_features)  # rows are converted to float64 once drawn
    if train.ndim != 2 or train.shape[0] < 1:
        raise ValueError(f"train_features must be [m >= 1, f]; got shape {train.shape}")
    ref_stats = gaussian_stats(ref_features)
    rng = np.random.default_rng(seed)
    fds = [
        frechet_distance(*gaussian_stats(train[rng.integers(0, train.shape[0], n)]), *ref_stats)
        for _ in range(draws)
    ]
    return float(np.mean(fds)), float(np.std(fds))
