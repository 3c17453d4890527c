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

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_choice, check_int, check_real, is_real, require
from scorelib.processes.base import Process
from scorelib.processes.noise_levels import rho_spaced


def _check_sigmas(sigma_min: Any, sigma_max: Any) -> tuple[float, float]:
    sigma_min = check_real(
        sigma_min, "sampler.sigma_min", low=0.0, low_open=True, high=math.inf, high_open=True
    )
    # The lower end is sampler.sigma_min: the message shows it as the interval's bound.
    sigma_max = check_real(
        sigma_max, "sampler.sigma_max", low=sigma_min, low_open=True, high=math.inf, high_open=True
    )
    return sigma_min, sigma_max


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
    n = check_int(n, "sampler.steps", low=1)
    sigma_min, sigma_max = _check_sigmas(sigma_min, sigma_max)
    rho = check_real(rho, "sampler.rho", low=0.0, low_open=True, high=math.inf, high_open=True)
    m = n if final_zero else n + 1
    frac = np.arange(m, dtype=np.float64) / max(m - 1, 1)
    return _with_final(
        rho_spaced(frac, sigma_min, sigma_max, rho), sigma_max, sigma_min, final_zero
    )


def _process_range(process: Process, t_min, t_max) -> tuple[float, float]:
    require(isinstance(process, Process), "process", "a scorelib Process", type(process).__name__)
    t_min = process.t_min if t_min is None else t_min
    t_max = process.t_max if t_max is None else t_max
    finite = dict(low=-math.inf, high=math.inf, low_open=True, high_open=True)
    t_min = check_real(t_min, "sampler.t_min", **finite)
    t_max = check_real(t_max, "sampler.t_max", **finite)
    require(t_min < t_max, "sampler.t_min", f"< sampler.t_max = {t_max}", t_min)
    return t_min, t_max


def _ve_sigma64(process: Process, t: np.ndarray) -> np.ndarray:
    with jax.enable_x64(True):
        return np.asarray(process.ve_sigma(jnp.asarray(t, dtype=jnp.float64)), dtype=np.float64)


def _check_positive_range(top: float, bottom: float) -> None:
    require(
        bool(np.isfinite(top) and np.isfinite(bottom) and 0 < bottom < top),
        "sampler.t_min and sampler.t_max",
        "times whose VE noise levels satisfy 0 < ve_sigma(t_min) < ve_sigma(t_max)",
        (bottom, top),
    )


def _process_time_levels(
    process: Process, n: Any, t_min: Any, t_max: Any, final_zero: bool
) -> tuple[int, float, float, float, float]:
    """The checked start of a grid in process time: ``(m, t_min, t_max, top, bottom)``, with
    ``m`` the number of positive points and ``top``, ``bottom`` the VE noise levels of
    ``t_max`` and ``t_min`` (float64).

    Raises:
      ValueError: naming ``sampler.steps``, ``sampler.t_min`` or ``sampler.t_max``.
    """
    n = check_int(n, "sampler.steps", low=1)
    t_min, t_max = _process_range(process, t_min, t_max)
    top, bottom = _ve_sigma64(process, np.array([t_max, t_min]))
    _check_positive_range(float(top), float(bottom))
    return (n if final_zero else n + 1), t_min, t_max, float(top), float(bottom)


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
    m, t_min, t_max, top, bottom = _process_time_levels(process, n, t_min, t_max, final_zero)
    ts = np.linspace(t_max, t_min, m) if m > 1 else np.array([t_max])
    return _with_final(_ve_sigma64(process, ts), top, bottom, final_zero)


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
    m, _, _, top, bottom = _process_time_levels(process, n, t_min, t_max, final_zero)
    lam = np.linspace(-2 * np.log(top), -2 * np.log(bottom), m) if m > 1 else None
    sig = np.exp(-0.5 * lam) if lam is not None else np.array([top])
    return _with_final(sig, top, bottom, final_zero)


GRID_FUNCTIONS: Mapping[str, Callable[..., np.ndarray]] = {
    "edm": edm_grid,
    "uniform_t": uniform_t_grid,
    "log_snr": log_snr_grid,
}
"""Grid name -> its constructor. The constructor's keyword parameters other than ``process``,
``n`` and ``final_zero`` are the grid's options, their defaults the grid's defaults: the one
place a grid declares them (:data:`GRIDS` and the config schema are read from here)."""

_NOT_OPTIONS = ("process", "n", "final_zero")


def _options(fn: Callable) -> dict[str, Any]:
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.name not in _NOT_OPTIONS}


GRIDS: Mapping[str, Mapping[str, Any]] = {name: _options(fn) for name, fn in GRID_FUNCTIONS.items()}
"""Grid name -> its options and their defaults (``None``: the process's ``t_min``/``t_max``),
read from the signatures of :data:`GRID_FUNCTIONS`."""


def make_grid(
    name: str, steps: int, process: Process | None = None, *, final_zero: bool = True, **opts
) -> np.ndarray:
    """The grid ``name`` with ``steps`` steps: one validated entry for every grid.

    ``edm`` is :func:`edm_grid` (Karras et al. 2022, eq. 5; options ``sigma_min``,
    ``sigma_max``, ``rho``; no process needed), ``uniform_t`` is :func:`uniform_t_grid`
    (Song et al. 2021) and ``log_snr`` is :func:`log_snr_grid` (Lu et al. 2022), both with
    options ``t_min``, ``t_max`` and a process. Options not given take the constructor's
    defaults (``GRIDS[name]``).

    Args:
      name: one of ``GRIDS``.
      steps: number of steps N (>= 1).
      process: the noise process (required by ``uniform_t`` and ``log_snr``; for ``edm``
        ignored, since its levels are the same for every process).
      final_zero: append an exact 0 (see the module docstring).
      **opts: the grid's options (``GRIDS[name]``).

    Returns:
      ``[steps + 1]`` float64 VE noise levels, strictly decreasing.

    Raises:
      ValueError: ``sampler.grid must be one of [...]`` for an unknown name;
        ``sampler.<opt> is not used by grid <name> (its options: ...)`` for an option the
        grid does not take; or naming ``sampler.steps``/``sampler.<opt>``/``process`` for
        a bad value.
    """
    check_choice(name, "sampler.grid", GRIDS)
    for k in opts:
        if k not in GRIDS[name]:
            raise ValueError(
                f"sampler.{k} is not used by grid {name} (its options: {', '.join(GRIDS[name])})"
            )
    if process is not None and opts.get("t_max") is not None:
        require(
            is_real(opts["t_max"]) and opts["t_max"] <= process.t_max,
            "sampler.t_max",
            f"<= {process.t_max:g}, the time range's end of the process "
            f"({type(process).__name__}: the network never saw later times)",
            opts["t_max"],
        )
    fn = GRID_FUNCTIONS[name]
    args = (process, steps) if "process" in inspect.signature(fn).parameters else (steps,)
    grid = fn(*args, final_zero=final_zero, **opts)
    if process is not None and "sigma_max" in GRIDS[name]:
        check_in_range(grid, process, "sampler.sigma_max")
    return grid


def check_in_range(grid: np.ndarray, process: Process, field: str) -> None:
    """Refuse a grid that starts above the process's largest noise level
    ``ve_sigma(t_max)``: its first steps would query the score at times the process (and a
    network trained on it) does not cover. The lower end may go below ``ve_sigma(t_min)``
    (the last steps run to 0 anyway, as EDM's samplers do).

    Raises:
      ValueError: naming ``field`` and the process's largest level.
    """
    top = float(_ve_sigma64(process, np.array([process.t_max]))[0])
    require(
        bool(grid[0] <= top * (1 + 1e-9)),
        field,
        f"<= {top:.6g}, the largest noise level of the process ({type(process).__name__}: "
        "ve_sigma(t_max))",
        float(grid[0]),
    )
