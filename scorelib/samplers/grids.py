"""Sampler time grids, written as VE-frame noise levels.

A grid is a 1-D float64 numpy array of ``ve_sigma = sigma(t) / alpha(t)`` values
(data units), strictly decreasing, with ``N + 1`` points for ``N`` steps. One grid
serves every process: a sampler converts each point to process time with
``process.t_of_ve_sigma``.

The ``final_zero`` convention, shared by every grid constructor:

* ``final_zero=True`` (default): ``N`` positive points from the top level down to
  the bottom level, then an exact ``0.0``. The step to 0 is the noise-free last
  step (Karras et al. 2022, eq. 5 and Algorithm 1-2: ``t_N = 0``): EDM Heun takes
  an Euler step there (NFE ``2N - 1``), the SDE samplers take the Tweedie
  denoising step. With ``N = 1`` the grid is ``[top, 0]`` (no ``0/0``).
* ``final_zero=False``: ``N + 1`` positive points ending exactly at the bottom
  level. Used by convergence tests, where a last step to 0 would not shrink with N.

Grids are built once on the host, in float64.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib.processes.base import Process


def _check_steps(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"sampler.steps must be an integer >= 1; got {n!r}")
    return int(n)


def _check_sigmas(sigma_min: float, sigma_max: float) -> None:
    if not (math.isfinite(sigma_min) and sigma_min > 0):
        raise ValueError(f"sampler.sigma_min must be a finite number > 0; got {sigma_min!r}")
    if not (math.isfinite(sigma_max) and sigma_max > sigma_min):
        raise ValueError(
            f"sampler.sigma_max must be finite and > sampler.sigma_min = {sigma_min}; "
            f"got {sigma_max!r} (equivalently sampler.sigma_min must be < sampler.sigma_max)"
        )


def _with_final(positive: np.ndarray, top: float, bottom: float, final_zero: bool) -> np.ndarray:
    """Pin the end points exactly and append the terminal 0 when asked."""
    positive = np.asarray(positive, dtype=np.float64).copy()
    positive[0] = top
    if positive.shape[0] > 1:
        positive[-1] = bottom
    if final_zero:
        positive = np.concatenate([positive, [0.0]])
    return positive


def edm_grid(
    n: int,
    sigma_min: float = 0.002,
    sigma_max: float = 80.0,
    rho: float = 7.0,
    final_zero: bool = True,
) -> np.ndarray:
    """The EDM rho-schedule (Karras et al., NeurIPS 2022, eq. 5).

    ``t_i = (sigma_max^(1/rho) + i/(M-1) (sigma_min^(1/rho) - sigma_max^(1/rho)))^rho``
    for ``i = 0..M-1``, with ``M = n`` and a final exact 0 when ``final_zero``
    (``M = 1`` gives ``[sigma_max]``), else ``M = n + 1`` points ending at ``sigma_min``.

    Args:
      n: number of sampler steps N (>= 1).
      sigma_min, sigma_max: lowest and highest positive VE noise levels, data units,
        ``0 < sigma_min < sigma_max``.
      rho: schedule exponent (> 0); ``rho = 1`` is uniform in sigma.
      final_zero: append an exact 0 (see the module docstring).

    Returns:
      ``[n + 1]`` float64, strictly decreasing.

    Raises:
      ValueError: naming ``sampler.steps``, ``sampler.sigma_min``, ``sampler.sigma_max``
        or ``sampler.rho`` with its allowed range.
    """
    n = _check_steps(n)
    sigma_min, sigma_max, rho = float(sigma_min), float(sigma_max), float(rho)
    _check_sigmas(sigma_min, sigma_max)
    if not (math.isfinite(rho) and rho > 0):
        raise ValueError(f"sampler.rho must be a finite number > 0; got {rho!r}")
    m = n if final_zero else n + 1
    frac = np.arange(m, dtype=np.float64) / max(m - 1, 1)
    a, b = sigma_max ** (1.0 / rho), sigma_min ** (1.0 / rho)
    return _with_final((a + frac * (b - a)) ** rho, sigma_max, sigma_min, final_zero)


def _process_range(process: Process, t_min, t_max) -> tuple[float, float]:
    if not isinstance(process, Process):
        raise ValueError(f"process must be a scorelib Process; got {type(process).__name__}")
    t_min = float(process.t_min if t_min is None else t_min)
    t_max = float(process.t_max if t_max is None else t_max)
    if not (math.isfinite(t_min) and math.isfinite(t_max) and t_min < t_max):
        raise ValueError(
            f"sampler.t_min must be < sampler.t_max (both finite); got t_min={t_min}, "
            f"t_max={t_max}"
        )
    return t_min, t_max


def _ve_sigma64(process: Process, t: np.ndarray) -> np.ndarray:
    with jax.enable_x64(True):
        return np.asarray(process.ve_sigma(jnp.asarray(t, dtype=jnp.float64)), dtype=np.float64)


def _check_positive_range(top: float, bottom: float) -> None:
    if not (np.isfinite(top) and np.isfinite(bottom) and 0 < bottom < top):
        raise ValueError(
            "sampler.t_min and sampler.t_max must map to VE noise levels with "
            f"0 < ve_sigma(t_min) < ve_sigma(t_max); got {bottom!r} and {top!r}"
        )


def uniform_t_grid(
    process: Process,
    n: int,
    t_min: float | None = None,
    t_max: float | None = None,
    final_zero: bool = True,
) -> np.ndarray:
    """Points uniform in process time from ``t_max`` down to ``t_min``, as VE noise levels.

    score_sde's default discretisation (Song et al. 2021, ``sampling.py``:
    ``linspace(T, eps, N)``). ``t_min``/``t_max`` default to the process's range.

    Args:
      process: the noise process.
      n: number of steps N (>= 1).
      t_min, t_max: time range, ``t_min < t_max`` and ``ve_sigma(t_min) > 0``.
      final_zero: see the module docstring.

    Returns:
      ``[n + 1]`` float64 VE noise levels, strictly decreasing.

    Raises:
      ValueError: naming ``sampler.steps``, ``sampler.t_min`` or ``sampler.t_max``.
    """
    n = _check_steps(n)
    t_min, t_max = _process_range(process, t_min, t_max)
    m = n if final_zero else n + 1
    ts = np.linspace(t_max, t_min, m) if m > 1 else np.array([t_max])
    sig = _ve_sigma64(process, ts)
    top, bottom = _ve_sigma64(process, np.array([t_max, t_min]))
    _check_positive_range(float(top), float(bottom))
    return _with_final(sig, float(top), float(bottom), final_zero)


def log_snr_grid(
    process: Process,
    n: int,
    t_min: float | None = None,
    t_max: float | None = None,
    final_zero: bool = True,
) -> np.ndarray:
    """Points uniform in log-SNR ``lambda = -2 log ve_sigma`` between ``t_max`` and ``t_min``.

    The uniform-in-lambda spacing of DPM-Solver (Lu et al. 2022, Sec. 3.3, "logSNR"
    time steps). Equivalent to a geometric sequence of VE noise levels.

    Args, Returns, Raises: as :func:`uniform_t_grid`.
    """
    n = _check_steps(n)
    t_min, t_max = _process_range(process, t_min, t_max)
    top, bottom = _ve_sigma64(process, np.array([t_max, t_min]))
    _check_positive_range(float(top), float(bottom))
    m = n if final_zero else n + 1
    lam = np.linspace(-2 * np.log(top), -2 * np.log(bottom), m) if m > 1 else None
    sig = np.exp(-0.5 * lam) if lam is not None else np.array([top])
    return _with_final(sig, float(top), float(bottom), final_zero)
