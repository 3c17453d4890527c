"""Mode coverage of samples of a Gaussian mixture: which modes a generator keeps, and
with how much mass (the measure of mode dropping in the fdistill_gmm table).

A sample belongs to component ``k`` when ``k`` is its nearest component in Mahalanobis
distance ``|C_k^{-1/2} (x - m_k)|`` and that distance is at most ``radius``; other
samples are off-mode. For exact mixture samples in ``d`` dimensions the off-mode
fraction is ``P(chi2_d > radius^2)`` when the components are well separated
(``exp(-4.5) = 1.1%`` for ``d = 2``, ``radius = 3``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scorelib._checks import check_real, require


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
