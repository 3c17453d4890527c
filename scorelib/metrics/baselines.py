"""Trivial sample sets that a model must beat: the baseline row of an evaluation table."""

from __future__ import annotations

import numpy as np

from scorelib._checks import check_array, check_int


def gaussian_baseline(train: np.ndarray, n: int, *, seed: int) -> np.ndarray:
    """``n`` draws from the Gaussian fitted to ``train`` (mean and full covariance).

    The Gaussian keeps every first and second moment of the data and nothing else: a
    sampler whose samples are not closer to the data than these has learnt no more than
    a covariance. The covariance is the unbiased sample covariance (``ddof = 1``); draws
    use its eigendecomposition (``numpy.random.Generator.multivariate_normal`` with
    ``method='eigh'``), which also handles a singular covariance (``n_train <= d``, or
    constant pixels).

    Args:
      train: ``[m, *shape]`` data, ``m >= 2``.
      n: number of draws (>= 1).
      seed: seed of ``numpy.random.default_rng``.

    Returns:
      ``[n, *shape]`` float32 draws.

    Raises:
      ValueError: naming ``n``, ``seed`` or ``train`` (fewer than 2 examples, non-finite values).
    """
    n = check_int(n, "n", low=1)
    seed = check_int(seed, "seed", low=0)
    check_array(train, "train", ("m", "*shape"))
    train = np.asarray(train)
    if train.ndim < 2 or train.shape[0] < 2:
        raise ValueError(f"train must be [m, *shape] with m >= 2; got shape {train.shape}")
    flat = train.reshape(train.shape[0], -1).astype(np.float64)
    if not np.all(np.isfinite(flat)):
        raise ValueError("train must be finite; got NaN or inf values")
    rng = np.random.default_rng(seed)
    draws = rng.multivariate_normal(flat.mean(0), np.cov(flat, rowvar=False), size=n, method="eigh")
    return draws.reshape((n,) + train.shape[1:]).astype(np.float32)
