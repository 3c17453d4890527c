"""Approximate posterior samples against a known Gaussian posterior (issue 37, items 3 and 5).

Where the posterior is Gaussian in closed form (a Gaussian prior and a linear-Gaussian
measurement: ``scorelib.scores.posterior.gaussian_posterior``), a sampler's draws from one
measurement's posterior are judged by

* :func:`gaussian_w2`: the 2-Wasserstein distance between the Gaussian fitted to the samples
  (sample mean, unbiased covariance) and the exact ``N(mean, cov)``, by the Fréchet formula
  (:func:`scorelib.metrics.frechet.frechet_distance`, Dowson & Landau 1982; Givens & Shortt
  1984), with the two moments' errors beside it;
* :func:`gaussian_w2_floor`: the same statistics for ``n`` exact draws of ``N(mean, cov)``,
  over several draws: the Monte-Carlo floor no sampler of ``n`` draws goes below (the fit of
  ``n`` points has sampling error of its own, ``E ||m_hat - m||^2 = tr(cov) / n``);
* :func:`std_calibration`: the per-coordinate sample standard deviation against the exact
  posterior's (an uncertainty map's calibration on the oracle), and the exact posterior mass
  of the samples' central intervals (their coverage under the exact posterior).

Every statistic is in data units (those of the samples and ``mean``), computed in float64.
The fit uses ``n - 1`` in the covariance; with ``n <= d`` it is singular, which the Fréchet
formula handles, but the floor then dominates: compare a method with its floor, never with 0.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr

from scorelib._checks import check_int, check_real, check_real_dtype, require
from scorelib.metrics.frechet import frechet_distance, gaussian_stats

#: The statistics of :func:`gaussian_w2` (and of its floor).
STATISTICS = ("w2", "w2_squared", "mean_error", "rel_mean_error", "std_error")


def _moments(mean, cov) -> tuple[np.ndarray, np.ndarray]:
    check_real_dtype(mean, "mean")
    check_real_dtype(cov, "cov")
    m = np.asarray(mean, np.float64)
    c = np.asarray(cov, np.float64)
    require(m.ndim == 1 and m.size >= 1, "mean", "[d] with d >= 1", f"shape {m.shape}")
    d = m.shape[0]
    require(c.shape == (d, d), "cov", f"[d, d] = [{d}, {d}] (d = mean's size)", f"shape {c.shape}")
    require(bool(np.all(np.isfinite(m)) and np.all(np.isfinite(c))), "mean", "finite", "NaN/inf")
    require(bool(np.allclose(c, c.T, rtol=1e-8, atol=1e-12)), "cov", "symmetric", "asymmetric")
    return m, 0.5 * (c + c.T)


def _samples(samples, d: int) -> np.ndarray:
    check_real_dtype(samples, "samples")
    x = np.asarray(samples, np.float64)
    require(
        x.ndim >= 2 and x.shape[0] >= 2 and math.prod(x.shape[1:]) == d,
        "samples",
        f"[n >= 2, ...] with d = {d} entries per sample",
        f"shape {x.shape}",
    )
    x = x.reshape(x.shape[0], d)
    require(bool(np.all(np.isfinite(x))), "samples", "finite (a diverged sampler)", "NaN or inf")
    return x


def _psd_sqrt_diag(cov: np.ndarray) -> np.ndarray:
    return np.sqrt(np.clip(np.diag(cov), 0.0, None))


def gaussian_w2(samples, mean, cov) -> dict[str, float]:
    """Distance of samples from the Gaussian ``N(mean, cov)`` they should follow.

    Args:
      samples: ``[n, *shape]`` (``n >= 2``; ``d`` entries per sample, flattened row-major),
        finite, data units.
      mean: ``[d]`` the exact mean; cov: ``[d, d]`` the exact covariance (symmetric PSD).

    Returns:
      ``w2``: ``W2(N(m_hat, C_hat), N(mean, cov))`` (data units; ``m_hat``, ``C_hat`` the
      sample mean and unbiased covariance), the square root of ``w2_squared``, the Fréchet
      distance (clipped at 0 for the root only); ``mean_error``: ``||m_hat - mean||``;
      ``rel_mean_error``: ``mean_error / sqrt(tr cov)`` (in units of the exact spread: about
      ``1 / sqrt(n)`` for exact draws); ``std_error``: ``||s_hat - s|| / ||s||`` with ``s``
      the exact per-coordinate standard deviations ``sqrt(diag cov)`` and ``s_hat`` the
      samples' (ddof 1); ``n``.

    Raises:
      ValueError: naming ``samples`` (not ``[n >= 2, ...]`` with ``d`` entries, or not
        finite), ``mean`` or ``cov`` (wrong shape, not finite, not symmetric).
    """
    m, c = _moments(mean, cov)
    x = _samples(samples, m.shape[0])
    m_hat, c_hat = gaussian_stats(x)
    fd = frechet_distance(m_hat, c_hat, m, c)
    s = _psd_sqrt_diag(c)
    s_hat = np.sqrt(np.diag(c_hat))
    err = float(np.linalg.norm(m_hat - m))
    trace = float(np.trace(c))
    return {
        "w2": math.sqrt(max(fd, 0.0)),
        "w2_squared": fd,
        "mean_error": err,
        "rel_mean_error": err / math.sqrt(trace) if trace > 0 else math.inf,
        "std_error": float(np.linalg.norm(s_hat - s) / np.linalg.norm(s))
        if trace > 0
        else math.inf,
        "n": int(x.shape[0]),
    }


def exact_draws(mean, cov, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` draws of ``N(mean, cov)``, ``[n, d]`` float64, by the symmetric square root of
    ``cov`` (eigenvalues clipped at 0, so a singular covariance is drawn exactly).

    Raises:
      ValueError: naming ``mean``, ``cov`` or ``n`` (an integer >= 1).
    """
    m, c = _moments(mean, cov)
    n = check_int(n, "n", low=1)
    w, v = np.linalg.eigh(c)
    root = (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T
    return m + rng.standard_normal((n, m.shape[0])) @ root


def gaussian_w2_floor(mean, cov, n: int, *, draws: int = 5, seed: int = 0) -> dict:
    """The Monte-Carlo floor of :func:`gaussian_w2`: its statistics for ``n`` exact draws of
    ``N(mean, cov)`` (:func:`exact_draws`), repeated ``draws`` times.

    Args:
      mean, cov: the exact Gaussian, as :func:`gaussian_w2`.
      n: samples per draw (>= 2), the number the judged samples have.
      draws: independent repetitions (>= 1).
      seed: numpy seed of the draws.

    Returns:
      For each statistic ``k`` of :data:`STATISTICS`: ``k`` the mean over draws, ``k_std``
      their population standard deviation (0 for one draw), and ``per_draw``: the list of
      each draw's :func:`gaussian_w2` dict (to average the floor over several measurements
      draw by draw).

    Raises:
      ValueError: naming ``n`` or ``draws``, and as :func:`gaussian_w2`.
    """
    n = check_int(n, "n", low=2)
    draws = check_int(draws, "draws", low=1)
    rng = np.random.default_rng(seed)
    per = [gaussian_w2(exact_draws(mean, cov, n, rng), mean, cov) for _ in range(draws)]
    out: dict = {}
    for k in STATISTICS:
        v = np.array([p[k] for p in per])
        out[k], out[f"{k}_std"] = float(v.mean()), float(v.std())
    out["per_draw"] = per
    return out


def std_calibration(samples, exact_std, *, exact_mean=None, level: float = 0.9, tol=1e-6) -> dict:
    """Per-coordinate sample standard deviations against the exact posterior's.

    Args:
      samples: ``[n, *shape]`` (``d`` entries each, ``n >= 2``), finite, data units.
      exact_std: ``[d]`` (or ``shape``) the exact posterior standard deviations (>= 0).
      exact_mean: ``[d]`` the exact posterior mean, for ``coverage`` (optional).
      level: the central interval's probability, in ``(0, 1)``.
      tol: coordinates with ``exact_std <= tol * max(exact_std)`` (known exactly: a
        noiseless measurement, a zero-variance prior direction) are left out of the ratios.

    Returns:
      ``std``: ``[d]`` the sample standard deviations (ddof 1); ``ratio``: ``[d]``
      ``std / exact_std`` (NaN where left out); ``mean_ratio`` and ``median_ratio`` over the
      kept coordinates (1 when calibrated; above: over-dispersed); ``rel_error``:
      ``||std - exact_std|| / ||exact_std||`` over all coordinates; ``kept``: how many
      coordinates the ratios use. With ``exact_mean``: ``coverage``, the exact posterior's
      mass inside the samples' central ``level`` interval (their ``(1 -+ level) / 2``
      quantiles), averaged over the kept coordinates: ``level`` up to ``O(1 / n)`` for
      exact draws, below for an over-confident sampler, above for an over-dispersed one.

    Raises:
      ValueError: naming ``samples``, ``exact_std`` (wrong size, negative, not finite, all
        zero), ``exact_mean``, ``level`` or ``tol``.
    """
    check_real_dtype(exact_std, "exact_std")
    s = np.asarray(exact_std, np.float64).reshape(-1)
    d = s.shape[0]
    require(
        d >= 1 and bool(np.all(np.isfinite(s))) and bool(np.all(s >= 0)) and s.max() > 0,
        "exact_std",
        "finite standard deviations >= 0, not all 0",
        s if d <= 8 else f"shape {s.shape}",
    )
    x = _samples(samples, d)
    level = check_real(level, "level", low=0.0, high=1.0, low_open=True, high_open=True)
    tol = check_real(tol, "tol", low=0.0, high=1.0, high_open=True)
    std = x.std(axis=0, ddof=1)
    keep = s > tol * s.max()
    ratio = np.where(keep, std / np.where(keep, s, 1.0), np.nan)
    out = {
        "std": std,
        "ratio": ratio,
        "mean_ratio": float(np.mean(ratio[keep])),
        "median_ratio": float(np.median(ratio[keep])),
        "rel_error": float(np.linalg.norm(std - s) / np.linalg.norm(s)),
        "kept": int(keep.sum()),
    }
    if exact_mean is not None:
        check_real_dtype(exact_mean, "exact_mean")
        m = np.asarray(exact_mean, np.float64).reshape(-1)
        require(
            m.shape == (d,) and bool(np.all(np.isfinite(m))),
            "exact_mean",
            f"[{d}] finite values (exact_std's size)",
            f"shape {m.shape}",
        )
        lo, hi = np.quantile(x[:, keep], [(1 - level) / 2, (1 + level) / 2], axis=0)
        mk, sk = m[keep], s[keep]
        out["coverage"] = float(np.mean(ndtr((hi - mk) / sk) - ndtr((lo - mk) / sk)))
    return out


__all__ = ["STATISTICS", "exact_draws", "gaussian_w2", "gaussian_w2_floor", "std_calibration"]
