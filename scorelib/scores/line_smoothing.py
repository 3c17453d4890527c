"""The smoothed piecewise-linear empirical score of training points on a line: the analytic
model of score smoothing's interpolation effect.

Chen, "On the interpolation effect of score smoothing in diffusion models" (arXiv
2502.19499, ICLR 2026). Training points ``y_1 < ... < y_n`` on a line ``o + a u`` of
``R^d`` (``u`` a unit vector). At small noise the empirical score (the score of
``(1/n) sum_k N(y_k, sigma^2 I)``) is ``(nearest y - x) / sigma^2``: it jumps at each
midpoint ``m_k`` between neighbours, which is what makes the denoising dynamics land on the
training points (memorisation). Smoothing replaces each jump by a linear ramp. In VE-frame
noise ``sigma`` (the paper's ``t`` is ``sigma^2``), with half gap ``h_k = (y_{k+1} -
y_k) / 2`` and ``delta = kappa sigma`` (the paper's ``delta_t = kappa sqrt(t)``, its
near-optimal smoothing under a regularised two-layer ReLU network's bias), the tangential
coordinate ``a`` has the denoiser::

    D_a = m_k + h_k (a - m_k) / (h_k - delta)   where |a - m_k| < h_k - delta (gap k's ramp)
    D_a = the nearest y                         elsewhere

(score ``(D - x) / sigma^2``: slope ``delta / ((h_k - delta) sigma^2)`` on the ramp, ``-1 /
sigma^2`` beside it), and the normal part is the empirical score's, ``D_perp = 0``. Smaller
``kappa`` smooths more (``kappa = 0``: the tangential score vanishes between the points);
where ``delta >= h_k`` gap ``k`` has no ramp (the unsmoothed small-noise score). The model
is the paper's small-noise one: run the dynamics from ``sigma_0`` with ``kappa sigma_0 <
min h_k``.

The probability-flow ODE (``dx / d sigma = (x - D) / sigma`` in the VE frame) then has
closed-form trajectories (derived here from the denoiser, and checked in
``tests/scores/test_line_smoothing.py`` against the samplers): on gap ``k``'s ramp ``(a -
m_k) / (h_k - kappa sigma)`` is conserved, so a start ``a_0`` at ``sigma_0`` lands at
``m_k + h_k (a_0 - m_k) / (h_k - kappa sigma_0)``, between the training points
(interpolation); beside the ramps ``(a - y) / sigma`` is conserved and the point lands on
``y``; the normal distance shrinks as ``sigma / sigma_0`` to 0. :func:`endpoint` is that
map; :func:`endpoint_law` the masses of each training point and of the gaps when the start
is the noised training set ``(1/n) sum_k N(y_k, sigma_0^2)`` along the line.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import struct
from scipy.optimize import brentq
from scipy.stats import norm

from scorelib._checks import check_real, require
from scorelib.scores.base import ScoreSource, check_data_shape, check_query, flatten

Array = Any


def _line(points, origin, direction) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    y = np.asarray(points, np.float64).reshape(-1)
    require(
        y.size >= 2 and np.all(np.isfinite(y)) and np.all(np.diff(y) > 0),
        "points",
        "at least 2 finite, strictly increasing positions along the line",
        y.tolist(),
    )
    u = np.asarray(direction, np.float64).reshape(-1)
    require(u.size >= 1 and np.linalg.norm(u) > 0, "direction", "a non-zero vector", u.tolist())
    o = np.zeros_like(u) if origin is None else np.asarray(origin, np.float64).reshape(-1)
    require(o.shape == u.shape, "origin", f"a vector of {u.size} entries (direction's)", o.shape)
    return y, o, u / np.linalg.norm(u)


def _ramps(a: Array, y: Array, delta: Array) -> Array:
    """The tangential denoiser ``[batch]`` of positions ``a: [batch]``, ``delta: [batch]``."""
    m = 0.5 * (y[1:] + y[:-1])  # [n - 1] midpoints
    h = 0.5 * (y[1:] - y[:-1])
    nearest = y[jnp.argmin(jnp.abs(a[:, None] - y[None, :]), axis=1)]
    k = jnp.clip(jnp.searchsorted(y, a) - 1, 0, m.size - 1)  # the gap a falls in
    half = jnp.maximum(h[k] - delta, 0.0)
    on_ramp = jnp.abs(a - m[k]) < half
    ramp = m[k] + h[k] * (a - m[k]) / jnp.where(on_ramp, h[k] - delta, 1.0)
    return jnp.where(on_ramp, ramp, nearest)


class SmoothedLineScore(ScoreSource):
    """The smoothed piecewise-linear empirical score of points on a line (module docstring).

    Build with :meth:`create`. Fields: ``points [n]`` (positions along the line, increasing),
    ``origin [d]``, ``direction [d]`` (unit), ``kappa`` (the smoothing, ``delta = kappa
    sigma``; static), ``data_shape`` (static).
    """

    points: Array = None
    origin: Array = None
    direction: Array = None
    kappa: float = struct.field(pytree_node=False, default=0.5)
    data_shape: tuple = struct.field(pytree_node=False, default=())

    @classmethod
    def create(cls, process, points, *, kappa: float, direction, origin=None, data_shape=None):
        """A smoothed line score.

        Args:
          process: the noise process (``sigma`` is its VE-frame level).
          points: ``[n]`` increasing positions of the training points along the line.
          kappa: the smoothing ``>= 0`` (``delta = kappa sigma``; smaller smooths more).
          direction: ``[d]`` the line's direction (normalised here).
          origin: ``[d]`` the point at position 0 (default the origin).
          data_shape: the shape of one example (default ``(d,)``).

        Raises:
          ValueError: naming ``points`` (fewer than 2, not increasing), ``kappa`` (< 0),
            ``direction`` (zero) or ``origin``/``data_shape`` (another size).
        """
        y, o, u = _line(points, origin, direction)
        kappa = check_real(kappa, "kappa", low=0.0)
        shape = check_data_shape(data_shape, u.size)
        f = jnp.float32
        return cls(
            process=process,
            points=jnp.asarray(y, f),
            origin=jnp.asarray(o, f),
            direction=jnp.asarray(u, f),
            kappa=kappa,
            data_shape=shape,
        )

    def denoiser(self, x: Array, t: Array) -> Array:
        """``o + D_a u`` at ``x: [batch, *data_shape]`` (module docstring), data units."""
        batch = check_query(self, x, t)
        p = self.process
        t = jnp.broadcast_to(jnp.asarray(t, x.dtype), (batch,))
        z = flatten(x) / p.alpha(t)[:, None] - self.origin  # VE frame, relative to the line
        a = z @ self.direction
        da = _ramps(a, self.points.astype(x.dtype), self.kappa * p.ve_sigma(t))
        d = self.origin + da[:, None] * self.direction
        return jnp.reshape(d, x.shape).astype(x.dtype)


def endpoint(a0, points, *, kappa: float, sigma0: float) -> np.ndarray:
    """Where the probability-flow ODE of :class:`SmoothedLineScore` takes tangential positions
    ``a0`` at VE level ``sigma0`` as the noise goes to 0 (module docstring; float64 numpy).

    Raises:
      ValueError: naming ``sigma0`` (<= 0) or ``kappa`` (``kappa sigma0 >= min h_k``: outside
        the model, a gap without ramp at the start).
    """
    y = np.asarray(points, np.float64)
    sigma0 = check_real(sigma0, "sigma0", low=0.0, low_open=True)
    kappa = check_real(kappa, "kappa", low=0.0)
    h = 0.5 * np.diff(y)
    require(
        kappa * sigma0 < h.min(),
        "kappa",
        f"kappa * sigma0 < {h.min():g} (the least half gap)",
        kappa,
    )
    a0 = np.asarray(a0, np.float64)
    m = 0.5 * (y[1:] + y[:-1])
    k = np.clip(np.searchsorted(y, a0) - 1, 0, m.size - 1)
    delta = kappa * sigma0
    on = np.abs(a0 - m[k]) < h[k] - delta
    nearest = y[np.argmin(np.abs(a0[..., None] - y), axis=-1)]
    return np.where(on, m[k] + h[k] * (a0 - m[k]) / (h[k] - delta), nearest)


def endpoint_law(points, *, kappa: float, sigma0: float, tol: float = 0.0) -> dict:
    """The law at noise 0 of the ODE started from the noised training set ``(1/n) sum_k
    N(y_k, sigma0^2)`` along the line: ``{"atoms": [n] mass landing exactly on each
    training point, "between": the mass landing strictly between them, "near": [n] mass
    landing within ``tol`` of each point (atoms included), "between_tol": the mass farther
    than ``tol`` from every point}`` (float64).

    A start lands on ``y_j`` when it is in no ramp and ``y_j`` is nearest: when it lies in
    ``[y_j - delta, y_j + delta]`` (``delta = kappa sigma0``; the first point's interval
    open to the left, the last one's to the right), each ramp spanning ``(y_k + delta,
    y_{k+1} - delta)``. A ramp start lands within ``tol`` of its ends when it is within
    ``tol (h_k - delta) / h_k`` of the ramp's ends (the map is linear on the ramp).

    Raises:
      ValueError: as :func:`endpoint`, or naming ``tol`` (outside ``[0, min h_k)``).
    """
    y = np.asarray(points, np.float64)
    endpoint(y[:1], y, kappa=kappa, sigma0=sigma0)  # the checks
    h = 0.5 * np.diff(y)
    tol = check_real(tol, "tol", low=0.0, high=float(h.min()), high_open=True)
    delta = kappa * sigma0

    def mass(lo, hi):  # [j]: P(start in [lo_j, hi_j]), averaged over the n components
        z = (hi[:, None] - y[None, :]) / sigma0, (lo[:, None] - y[None, :]) / sigma0
        return (norm.cdf(z[0]) - norm.cdf(z[1])).mean(axis=1)

    reach = tol * (h - delta) / h  # [n - 1]: the ramp starts that land within tol of an end
    lo = np.concatenate([[-np.inf], y[1:] - delta])
    hi = np.concatenate([y[:-1] + delta, [np.inf]])
    atoms = mass(lo, hi)
    near = mass(lo - np.concatenate([[0.0], reach]), hi + np.concatenate([reach, [0.0]]))
    return {
        "atoms": atoms,
        "between": float(1.0 - atoms.sum()),
        "near": near,
        "between_tol": float(1.0 - near.sum()),
    }


def kappa_for_between(points, between: float, *, sigma0: float, tol: float = 0.0) -> float:
    """The smoothing ``kappa`` whose :func:`endpoint_law` leaves mass ``between`` farther than
    ``tol`` from every point (strictly between them for ``tol = 0``; the mass decreases
    from ``kappa = 0`` to ``kappa sigma0 = min h_k``): how much smoothing a sample set's
    interpolation amounts to. Clipped to that range: 0 when ``between`` exceeds the mass of
    ``kappa = 0``.

    Raises:
      ValueError: naming ``between`` (outside [0, 1]), ``sigma0`` (<= 0) or ``tol``.
    """
    b = check_real(between, "between", low=0.0, high=1.0)
    sigma0 = check_real(sigma0, "sigma0", low=0.0, low_open=True)
    y = np.asarray(points, np.float64)
    top = 0.5 * np.diff(y).min() / sigma0 * (1 - 1e-9)

    def gap(k):
        return endpoint_law(y, kappa=k, sigma0=sigma0, tol=tol)["between_tol"] - b

    if gap(0.0) <= 0:
        return 0.0
    if gap(top) >= 0:
        return float(top)
    return float(brentq(gap, 0.0, top, xtol=1e-10))


def along_line(x, *, direction, origin=None) -> np.ndarray:
    """``[n]`` positions along the line ``origin + a direction`` (direction normalised here)
    of the feet of samples ``x: [n, d]`` (data units, float64).

    Raises:
      ValueError: naming ``direction`` (zero), ``origin`` or ``x`` (another dimension).
    """
    u = np.asarray(direction, np.float64).reshape(-1)
    require(np.linalg.norm(u) > 0, "direction", "a non-zero vector", u.tolist())
    u = u / np.linalg.norm(u)
    o = np.zeros_like(u) if origin is None else np.asarray(origin, np.float64).reshape(-1)
    require(o.shape == u.shape, "origin", f"a vector of {u.size} entries", o.shape)
    x = np.asarray(x, np.float64)
    require(x.ndim == 2 and x.shape[1] == u.size, "x", f"[n, {u.size}] samples", x.shape)
    return (x - o) @ u


def line_through(points, *, tol: float = 1e-3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The line through points of ``R^d`` that lie on one: ``(positions [n] increasing,
    origin [d], direction [d])``, the direction from the first point to the last (unit), the
    origin the line's point nearest to 0, positions along the direction from it.

    Raises:
      ValueError: naming ``points`` (not ``[n, d]`` with ``n >= 2`` distinct ends, or a point
        farther than ``tol`` from the line).
    """
    m = np.asarray(points, np.float64)
    require(m.ndim == 2 and len(m) >= 2, "points", "an [n, d] array with n >= 2", m.shape)
    span = np.linalg.norm(m[-1] - m[0])
    require(span > 0, "points", "a first and a last point that differ", span)
    u = (m[-1] - m[0]) / span
    o = m[0] - (m[0] @ u) * u
    a = (m - o) @ u
    off = float(np.linalg.norm(m - o - np.outer(a, u), axis=1).max())
    require(off <= tol, "points", f"points on one line (within {tol:g})", f"{off:.3g} off it")
    return np.sort(a), o, u


def line_statistics(x, points, *, direction, origin=None, tol: float) -> dict:
    """Where samples ``x: [n, d]`` lie against training points on a line: ``{"between": the
    fraction farther than tol from every point along the line, "distance": the mean distance
    to the line, "offset": the mean distance along the line to the nearest point}`` (data
    units, float64).

    Raises:
      ValueError: naming ``x`` (not ``[n, d]`` finite), ``tol`` (<= 0) or as
        :meth:`SmoothedLineScore.create`.
    """
    y, o, u = _line(points, origin, direction)
    tol = check_real(tol, "tol", low=0.0, low_open=True)
    x = np.asarray(x, np.float64)
    require(
        x.ndim == 2 and x.shape[1] == u.size and np.all(np.isfinite(x)),
        "x",
        f"finite samples of shape [n, {u.size}]",
        x.shape,
    )
    a = along_line(x, direction=u, origin=o)
    perp = np.linalg.norm(x - o - a[:, None] * u, axis=1)
    off = np.abs(a[:, None] - y[None]).min(axis=1)
    return {
        "between": float(np.mean(off > tol)),
        "distance": float(perp.mean()),
        "offset": float(off.mean()),
    }


__all__ = [
    "SmoothedLineScore",
    "endpoint",
    "endpoint_law",
    "kappa_for_between",
    "line_statistics",
    "line_through",
    "along_line",
]
