"""Mode coverage of samples of a Gaussian mixture: which modes a generator keeps, and
with how much mass (the measure of mode dropping in the fdistill_gmm table).

A sample belongs to component ``k`` when ``k`` is its nearest component in Mahalanobis
distance ``|C_k^{-1/2} (x - m_k)|`` and that distance is at most ``radius``; other
samples are off-mode. For exact mixture samples in ``d`` dimensions the off-mode
fraction is ``P(chi2_d > radius^2)`` when the components are well separated
(``exp(-4.5) = 1.1%`` for ``d = 2``, ``radius = 3``).

The modes of a many-well target are the sides of its barriers (:func:`well_mode_statistics`),
with exact weights from the target's tabulated CDF.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scorelib._checks import check_real, check_real_dtype, require


def mode_statistics(
    samples: Any, target: Any, *, radius: float = 3.0, min_fraction: float = 0.1
) -> dict:
    """Mass per mode, modes covered and the off-mode fraction of ``samples``.

    Args:
      samples: ``[n, d]`` points (data units).
      target: a ``scorelib.data.targets.GaussianMixtureTarget`` (its ``weights``,
        ``means``, ``eigvals``, ``eigvecs``).
      radius: Mahalanobis radius of a mode (> 0).
      min_fraction: a mode is covered when it holds at least ``min_fraction`` of its true
        weight (in (0, 1]).

    Returns:
      ``{'mass': [K] fraction of all samples in each mode, 'covered': [K] bool,
      'n_covered': int, 'off_mode': float, 'tv': float}`` with ``tv`` the total variation
      ``0.5 sum_k |mass_k / sum(mass) - w_k|`` between the normalised mode masses and the
      weights.

    Raises:
      ValueError: a non-finite or mis-shaped ``samples``, or ``radius``/``min_fraction``
        out of range.
    """
    check_real(radius, "radius", low=0.0, low_open=True)
    check_real(min_fraction, "min_fraction", low=0.0, low_open=True, high=1.0)
    check_real_dtype(samples, "samples")
    x = np.asarray(samples, np.float64)
    K, d = np.asarray(target.means).shape
    require(
        x.ndim == 2 and x.shape[1] == d and len(x) > 0, "samples", f"of shape [n, {d}]", x.shape
    )
    require(bool(np.isfinite(x).all()), "samples", "finite", "NaN or inf values")
    diff = x[:, None, :] - np.asarray(target.means)[None]  # [n, K, d]
    coef = np.einsum("nkd,kde->nke", diff, np.asarray(target.eigvecs))
    maha = np.sqrt(np.sum(coef**2 / np.asarray(target.eigvals)[None], -1))  # [n, K]
    nearest = maha.argmin(1)
    inside = maha[np.arange(len(x)), nearest] <= radius
    mass = np.bincount(nearest[inside], minlength=K) / len(x)
    w = np.asarray(target.weights, np.float64)
    covered = mass >= min_fraction * w
    total = mass.sum()
    tv = 0.5 * float(np.abs(mass / total - w).sum()) if total > 0 else 1.0
    return {
        "mass": mass,
        "covered": covered,
        "n_covered": int(covered.sum()),
        "off_mode": float(1.0 - inside.mean()),
        "tv": tv,
    }


def mean_displacement(x: Any, start: Any, target: Any) -> float:
    """The mean Euclidean distance of samples ``x: [n, d]`` from their chains' starts
    ``start: [n, d]``, in units of the mixture ``target``'s component std (the RMS over its
    components' covariance eigenvalues): how far Langevin chains moved within a mode.

    Raises:
      ValueError: naming ``start`` (another shape than ``x``) or ``x`` (not ``[n, d]``).
    """
    a, b = np.asarray(x, np.float64), np.asarray(start, np.float64)
    require(a.ndim == 2 and len(a) >= 1, "x", "[n, d] samples", a.shape)
    require(b.shape == a.shape, "start", f"of x's shape {a.shape}", b.shape)
    scale = float(np.sqrt(np.mean(np.asarray(target.eigvals))))
    return float(np.linalg.norm(a - b, axis=-1).mean() / scale)


def well_barrier(target: Any) -> float:
    """The barrier of one double well ``E(x) = a x^4 - b x^2 - c x``: the middle root of
    ``E'(x) = 4 a x^3 - 2 b x - c = 0``, the local minimum of the density between its modes.

    Args:
      target: a ``scorelib.data.targets.ManyWellTarget`` (its ``a``, ``b``, ``c``).

    Returns:
      the barrier position (data units).

    Raises:
      ValueError: naming ``target`` when the well has one mode (``E'`` has one real root).
    """
    roots = np.roots([4.0 * target.a, 0.0, -2.0 * target.b, -float(target.c)])
    real = np.sort(roots[np.abs(roots.imag) < 1e-9].real)
    require(len(real) == 3, "target", "a double well (E' with three real roots)", real.tolist())
    return float(real[1])


def well_mode_statistics(samples: Any, target: Any) -> dict:
    """Mass per mode of ``samples`` of a many-well target, against the exact mode weights.

    A mode of the many-well is a side of the barrier (:func:`well_barrier`) in every
    double-well coordinate: ``2^n`` modes for ``n`` wells, mode index ``sum_j 2^j
    [x_{w_j} > barrier]`` over the well coordinates ``w_0 < w_1 < ...``. Its exact weight is
    the product over wells of ``P(x > barrier) = 1 - CDF(barrier)`` or its complement (the
    coordinates are independent), with the target's tabulated CDF (trapezoid rule on its
    float64 grid). For the default well (``a, b, c = 1, 6, 0.5``) the right well holds about
    0.85 of the mass.

    Args:
      samples: ``[n, dim]`` points (data units).
      target: a ``scorelib.data.targets.ManyWellTarget`` with at most 16 wells.

    Returns:
      ``{'mass': [2^n] fraction of samples in each mode, 'weights': [2^n] exact weights,
      'tv': float, 'right': [n] fraction of samples right of the barrier in each well,
      'right_weight': float}`` with ``tv = 0.5 sum |mass - weights|``.

    Raises:
      ValueError: a non-finite or mis-shaped ``samples``; naming ``target`` for a target
        with more than 16 wells or a single-mode well.
    """
    check_real_dtype(samples, "samples")
    x = np.asarray(samples, np.float64)
    d = int(target.dim)
    require(
        x.ndim == 2 and x.shape[1] == d and len(x) > 0, "samples", f"of shape [n, {d}]", x.shape
    )
    require(bool(np.isfinite(x).all()), "samples", "finite", "NaN or inf values")
    wells = np.nonzero(np.asarray(target.well_mask))[0]
    n_w = len(wells)
    require(1 <= n_w <= 16, "target", "a many-well with 1 to 16 wells", n_w)
    barrier = well_barrier(target)
    p_right = 1.0 - float(np.interp(barrier, target.grid, target.cdf))
    right = x[:, wells] > barrier  # [n, n_w]
    idx = right.astype(np.int64) @ (1 << np.arange(n_w))
    mass = np.bincount(idx, minlength=2**n_w) / len(x)
    bits = (np.arange(2**n_w)[:, None] >> np.arange(n_w)[None]) & 1  # [2^n, n_w]
    weights = np.prod(np.where(bits == 1, p_right, 1.0 - p_right), axis=1)
    return {
        "mass": mass,
        "weights": weights,
        "tv": 0.5 * float(np.abs(mass - weights).sum()),
        "right": right.mean(0),
        "right_weight": p_right,
    }
