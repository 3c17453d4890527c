"""Estimators of inverse-problem reconstructions: image quality against the clean data
(PSNR and SSIM, by scikit-image), the calibration of posterior draws (central-interval
coverage), the per-pixel posterior spread and the data consistency of the draws.

Shapes: ``truth: [n, *shape]`` the ``n`` clean examples (images ``[n, H, W, C]`` in
``[-1, 1]``, so ``data_range = 2``; or flat points ``[n, d]``); a reconstruction ``x`` is
``[n, *shape]`` (one per example, e.g. the posterior mean) or ``[n, k, *shape]`` (``k``
posterior draws per example, compared with the same ``truth[i]``). All values are in data
units; every function works in float64 on the host (numpy) and returns numpy arrays.

* :func:`psnr`: ``10 log10(data_range^2 / MSE)`` per example (or draw), decibels
  (``skimage.metrics.peak_signal_noise_ratio``); ``inf`` for an exact reconstruction.
* :func:`ssim`: the structural similarity of Wang, Bovik, Sheikh and Simoncelli (IEEE TIP
  2004) per image (``skimage.metrics.structural_similarity``, 7x7 uniform window, or the
  largest odd window that fits a smaller image; channels averaged), in ``[-1, 1]``, 1 for
  identical images.
* :func:`coverage`: the fraction of the true entries that fall inside the draws' central
  ``level`` interval, per example: the calibration check of a posterior sampler (a
  calibrated one covers ``level`` of the truth, an overconfident one less).
* :func:`posterior_std`: the per-entry standard deviation of the draws (the uncertainty
  map).
* :func:`data_consistency`: ``||A x - y|| / sqrt(m)`` per draw, beside ``sigma_y``.
"""

from __future__ import annotations

import numpy as np

from scorelib._checks import check_real, require

#: scikit-image's default SSIM window side; smaller images use the largest odd side that fits.
SSIM_WINDOW = 7


def _as_pair(x, truth, name: str = "x") -> tuple[np.ndarray, np.ndarray, bool]:
    """``(x, truth, has_draws)`` as float64, ``x`` ``[n, *shape]`` or ``[n, k, *shape]``
    against ``truth: [n, *shape]``.

    Raises:
      ValueError: naming ``truth`` (not a real array with an example axis) or ``name``
        (another number of examples, or another example shape).
    """
    t = np.asarray(truth, np.float64)
    require(t.ndim >= 2 and t.shape[0] >= 1, "truth", "[n, *shape] with n >= 1", t.shape)
    a = np.asarray(x, np.float64)
    shape = t.shape[1:]
    ok = a.shape[0:1] == t.shape[0:1] and a.shape[a.ndim - len(shape) :] == shape
    ok = ok and a.ndim in (t.ndim, t.ndim + 1)
    require(
        ok, name, f"[{t.shape[0]}, *{shape}] or [{t.shape[0]}, draws, *{shape}] (truth's)", a.shape
    )
    return a, t, a.ndim == t.ndim + 1


def _check_range(data_range) -> float:
    return check_real(data_range, "data_range", low=0.0, low_open=True)


def psnr(x, truth, *, data_range: float = 2.0) -> np.ndarray:
    """Peak signal-to-noise ratio in decibels, ``10 log10(data_range^2 / MSE)`` with
    ``MSE`` the mean square error over one example's entries.

    Args:
      x: ``[n, *shape]`` reconstructions or ``[n, k, *shape]`` draws.
      truth: ``[n, *shape]`` clean examples.
      data_range: the span of the data (2 for images in ``[-1, 1]``).

    Returns:
      ``[n]`` or ``[n, k]`` float64; ``inf`` where ``x`` equals the truth, ``nan`` where it
      is not finite.

    Raises:
      ValueError: naming ``x``, ``truth`` or ``data_range`` (a number > 0).

    Source: ``skimage.metrics.peak_signal_noise_ratio``.
    """
    a, t, draws = _as_pair(x, truth)
    data_range = _check_range(data_range)
    # scikit-image's import is slow: paid by the commands that compute these metrics only
    from skimage.metrics import peak_signal_noise_ratio

    def one(u, v):
        if not np.all(np.isfinite(u)):
            return np.nan
        if np.array_equal(u, v):
            return np.inf  # scikit-image divides by the zero MSE (a warning); the limit
        return peak_signal_noise_ratio(v, u, data_range=data_range)

    if draws:
        return np.array([[one(u, t[i]) for u in a[i]] for i in range(len(t))])
    return np.array([one(a[i], t[i]) for i in range(len(t))])


def ssim_window(image_shape) -> int:
    """The SSIM window side for images ``(H, W, C)``: :data:`SSIM_WINDOW`, or the largest odd
    side ``<= min(H, W)``.

    Raises:
      ValueError: naming ``truth`` for a shape that is not ``(H, W, C)`` with ``H, W >= 3``.
    """
    ok = len(image_shape) == 3 and min(image_shape[:2]) >= 3
    require(ok, "truth", "images [n, H, W, C] with H, W >= 3 (SSIM's window)", image_shape)
    side = min(SSIM_WINDOW, *image_shape[:2])
    return side if side % 2 == 1 else side - 1


def ssim(x, truth, *, data_range: float = 2.0) -> np.ndarray:
    """Structural similarity per image (channels averaged; a 7x7 uniform window, or the
    largest odd one that fits, :func:`ssim_window`; the constants ``K1 = 0.01``,
    ``K2 = 0.03`` of Wang et al. 2004).

    Args:
      x: ``[n, H, W, C]`` reconstructions or ``[n, k, H, W, C]`` draws.
      truth: ``[n, H, W, C]`` clean images.
      data_range: the span of the data (2 for images in ``[-1, 1]``).

    Returns:
      ``[n]`` or ``[n, k]`` float64 in ``[-1, 1]`` (1: identical images); ``nan`` where
      ``x`` is not finite.

    Raises:
      ValueError: naming ``x``, ``truth`` (not images, or smaller than 3x3) or
        ``data_range``.

    Source: ``skimage.metrics.structural_similarity`` (Wang, Bovik, Sheikh and Simoncelli,
    "Image quality assessment: from error visibility to structural similarity", IEEE TIP
    2004).
    """
    a, t, draws = _as_pair(x, truth)
    data_range = _check_range(data_range)
    win = ssim_window(t.shape[1:])
    # scikit-image's import is slow: paid by the commands that compute these metrics only
    from skimage.metrics import structural_similarity

    def one(u, v):
        if not np.all(np.isfinite(u)):
            return np.nan
        return structural_similarity(v, u, data_range=data_range, win_size=win, channel_axis=-1)

    if draws:
        return np.array([[one(u, t[i]) for u in a[i]] for i in range(len(t))])
    return np.array([one(a[i], t[i]) for i in range(len(t))])


def _check_draws(draws, truth=None) -> tuple[np.ndarray, np.ndarray | None]:
    d = np.asarray(draws, np.float64)
    require(d.ndim >= 3 and d.shape[1] >= 2, "draws", "[n, draws, *shape] with draws >= 2", d.shape)
    if truth is None:
        return d, None
    t = np.asarray(truth, np.float64)
    require(
        t.shape == (d.shape[0], *d.shape[2:]),
        "truth",
        f"[n, *shape] = {[d.shape[0], *d.shape[2:]]} (the draws')",
        t.shape,
    )
    return d, t


def interval_positions(k: int, level: float) -> tuple[float, float]:
    """The 1-based order-statistic positions ``(lo, hi)`` of the central ``level`` interval
    of ``k`` draws: ``p (k + 1)`` for ``p = (1 -/+ level) / 2`` (the Weibull plotting
    position, ``numpy.quantile(method="weibull")``), clipped to ``[1, k]``."""
    lo, hi = (1.0 - level) / 2.0, (1.0 + level) / 2.0
    return min(max(lo * (k + 1), 1.0), float(k)), min(max(hi * (k + 1), 1.0), float(k))


def calibrated_coverage(k: int, level: float = 0.9) -> float:
    """The expected :func:`coverage` of a calibrated sampler with ``k`` draws:
    ``(hi - lo) / (k + 1)`` of :func:`interval_positions` (a new value exchangeable with
    ``k`` draws falls between the ``i``-th and ``j``-th smallest with probability
    ``(j - i) / (k + 1)``). Equal to ``level`` once ``k >= 2 / (1 - level) - 1`` (19 draws
    for 90%): fewer draws cannot span the interval, and even calibrated draws cover less.

    Raises:
      ValueError: naming ``draws`` (fewer than 2) or ``level`` (not in ``(0, 1)``).
    """
    require(isinstance(k, int | np.integer) and k >= 2, "draws", "an integer >= 2", k)
    level = check_real(level, "level", low=0.0, high=1.0, low_open=True, high_open=True)
    lo, hi = interval_positions(int(k), level)
    return (hi - lo) / (k + 1)


def coverage(draws, truth, *, level: float = 0.9) -> np.ndarray:
    """The fraction of each example's true entries inside the central ``level`` interval
    of its draws, entry by entry (pixel and channel).

    The interval of ``k`` draws runs between their empirical quantiles ``(1 -/+ level) / 2``
    with the Weibull plotting position (order statistic ``p (k + 1)``, interpolated; ends
    included), so that exchangeable (calibrated) draws cover on average
    :func:`calibrated_coverage` ``(k, level)``, which is ``level`` for ``k >= 19`` at 90%:
    exactly where the positions are integers (19 draws: the smallest to the largest; 39
    draws: the 2nd to the 38th), within about 0.003 otherwise (the interpolation is in data
    units; Gaussian draws, 20 to 50 of them). The default quantile of ``numpy`` (position
    ``1 + p (k - 1)``) would cover ``(k - 1) level / (k + 1)``: 0.81 for 20 draws. An
    overconfident sampler (draws too narrow) covers less, an underconfident one more.

    Args:
      draws: ``[n, k, *shape]`` posterior draws, ``k >= 2``.
      truth: ``[n, *shape]``.
      level: the interval's probability, in ``(0, 1)``.

    Returns:
      ``[n]`` float64 in ``[0, 1]`` (``nan`` for an example with a non-finite draw).

    Raises:
      ValueError: naming ``draws``, ``truth`` or ``level``.
    """
    d, t = _check_draws(draws, truth)
    level = check_real(level, "level", low=0.0, high=1.0, low_open=True, high_open=True)
    lo, hi = np.quantile(d, [(1 - level) / 2, (1 + level) / 2], axis=1, method="weibull")
    inside = ((t >= lo) & (t <= hi)).reshape(len(t), -1).mean(axis=1)
    finite = np.isfinite(d).reshape(len(t), -1).all(axis=1)
    return np.where(finite, inside, np.nan)


def posterior_std(draws) -> np.ndarray:
    """The per-entry standard deviation of the draws (``ddof = 1``): the posterior's
    uncertainty map.

    Args:
      draws: ``[n, k, *shape]``, ``k >= 2``.

    Returns:
      ``[n, *shape]`` float64, data units.

    Raises:
      ValueError: naming ``draws``.
    """
    d, _ = _check_draws(draws)
    return d.std(axis=1, ddof=1)


def data_consistency(ax, y) -> np.ndarray:
    """``||A x - y|| / sqrt(m)``: the root-mean-square measurement residual of each
    reconstruction, in data units (compare with ``sigma_y``: the truth's own residual is
    about ``sigma_y``, a reconstruction that fits the noise goes below it).

    Args:
      ax: ``[n, m]`` or ``[n, k, m]``: ``A x`` of the reconstructions (or draws).
      y: ``[n, m]`` measurements.

    Returns:
      ``[n]`` or ``[n, k]`` float64.

    Raises:
      ValueError: naming ``y`` (not ``[n, m]``) or ``ax`` (another shape).
    """
    yy = np.asarray(y, np.float64)
    require(yy.ndim == 2 and yy.shape[1] >= 1, "y", "[n, m] measurements", yy.shape)
    a = np.asarray(ax, np.float64)
    require(
        a.ndim in (2, 3) and a.shape[0] == yy.shape[0] and a.shape[-1] == yy.shape[1],
        "ax",
        f"[{yy.shape[0]}, {yy.shape[1]}] or [{yy.shape[0]}, draws, {yy.shape[1]}] (y's)",
        a.shape,
    )
    r = a - (yy[:, None, :] if a.ndim == 3 else yy)
    return np.sqrt(np.mean(r**2, axis=-1))


def mean_std(values) -> tuple[float, float]:
    """``(mean, std)`` (``ddof = 0``) of per-example values over the examples (``nan`` kept:
    a non-finite reconstruction shows as ``nan``; equal values, ``inf`` included, give a
    std of 0).

    Raises:
      ValueError: naming ``values`` when empty.
    """
    v = np.asarray(values, np.float64).reshape(-1)
    require(v.size >= 1, "values", "at least one value", v.shape)
    if np.all(v == v[0]):  # e.g. every PSNR inf (exact reconstructions): inf +- 0, not nan
        return float(v[0]), 0.0
    return float(np.mean(v)), float(np.std(v))


__all__ = [
    "calibrated_coverage",
    "coverage",
    "data_consistency",
    "interval_positions",
    "mean_std",
    "posterior_std",
    "psnr",
    "ssim",
    "ssim_window",
]
