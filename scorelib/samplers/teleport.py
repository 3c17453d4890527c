"""Gaussian teleportation: skip the first steps of any sampler in closed form.

Wang & Vastola, TMLR 2024 (arXiv 2412.09726), Sec. 6 ("analytical teleportation"):
at high noise the learned score is almost exactly the score of a Gaussian fitted to the
data, whose probability-flow ODE has a closed-form solution
(:func:`scorelib.scores.gaussian.gaussian_flow`, their eq. 8). The hybrid sampler
jumps from ``grid[0]`` to ``grid[k]`` with that solution and runs the ordinary sampler
on the rest of the grid, ``grid[k:]``, exactly the tail of the original grid (no
re-spacing), saving the NFE of the first ``k`` steps.

Start state at ``grid[k]``:

* deterministic samplers (``heun`` without churn, ``dpmpp_2m``, ``pf_ode_euler``): the
  closed-form PF-ODE image of the start state ``x_T`` at ``grid[0]``. ``x_T`` is drawn
  exactly as the plain sampler draws it (``driver.initial_state`` with the per-example
  keys ``fold_in(key, first_index + b)``), so a teleported and a plain run share their
  initial noise and ``skip = 0`` is the plain sampler, bit for bit.
* stochastic samplers (``euler_maruyama``, ``pc``, ``annealed_langevin``, ``heun`` with
  ``S_churn > 0``): a draw of the Gaussian model's marginal at ``grid[k]``,
  ``x / alpha ~ N(mu, Sigma + grid[k]^2 I)``, from the same standard normal ``eps`` the
  plain sampler would scale into its start state (``fold_in(k_b, 0)``).

Which of the two ``start="auto"`` picks is read from the sampler's declared property
(``Sampler.is_stochastic(**opts)``, through a ``functools.partial`` too); a callable
that declares none is refused with ``start="auto"``, never treated as deterministic.

Step indices of the tail run restart at 0: the tail's step ``i`` (grid interval
``grid[k+i] -> grid[k+i+1]``) draws its noise from ``fold_in(k_b, i + 1)``, the key the
plain run uses for its step ``i``, not for its step ``k + i``. The noise path of a
stochastic teleported run therefore differs from the plain run's over the same grid
interval; only the distribution of the result is meant to agree. Within one run no
key is reused (the start draw uses ``fold_in(k_b, 0)``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib.keys import example_keys
from scorelib.samplers import driver as C
from scorelib.scores.gaussian import GaussianScore, gaussian_flow, gaussian_marginal_sample

Array = Any

_STARTS = ("auto", "ode", "marginal")


def resolve_skip(grid, skip: int | None = None, sigma_skip: float | None = None) -> int:
    """The skip count ``k`` for a grid, from ``skip`` or ``sigma_skip`` (exactly one given).

    ``sigma_skip`` (a VE noise level, data units) selects the largest ``k`` with
    ``grid[k] >= sigma_skip`` (relative tolerance 1e-9, so a grid value maps to its own
    index): teleportation never goes below the requested level.

    Args:
      grid: ``[N + 1]`` VE noise levels, strictly decreasing.
      skip: whole steps to skip, ``0 <= skip <= N - 1``.
      sigma_skip: target level ``> 0``; ``>= grid[0]`` gives 0.

    Returns:
      ``k`` in ``[0, N - 1]``.

    Raises:
      ValueError: naming ``teleport.skip`` or ``teleport.sigma_skip`` when both or neither
        is given, or the value is out of range.
    """
    g = np.asarray(grid, np.float64)
    n = g.shape[0] - 1
    if (skip is None) == (sigma_skip is None):
        raise ValueError(
            "teleport.skip and teleport.sigma_skip: give exactly one; got "
            f"skip={skip!r}, sigma_skip={sigma_skip!r}"
        )
    if skip is not None:
        ok = isinstance(skip, (int, np.integer)) and not isinstance(skip, bool)
        if not (ok and 0 <= skip <= n - 1):
            raise ValueError(
                f"teleport.skip must be an integer in [0, N - 1] = [0, {n - 1}] for a grid of "
                f"N = {n} steps; got {skip!r}"
            )
        return int(skip)
    ok = isinstance(sigma_skip, (int, float, np.integer, np.floating)) and not isinstance(
        sigma_skip, bool
    )
    if not (ok and np.isfinite(sigma_skip) and sigma_skip > 0):
        raise ValueError(f"teleport.sigma_skip must be a finite number > 0; got {sigma_skip!r}")
    k = int(np.sum(g[:n] >= float(sigma_skip) * (1 - 1e-9))) - 1
    return max(k, 0)


@functools.partial(jax.jit, static_argnames=("shape", "marginal"))
def _jump(process, gaussian, key, grid0, grid_k, x_T, first_index, *, shape, marginal):
    """Start state at ``grid_k`` (process coordinates)."""
    dtype = grid0.dtype
    keys = example_keys(key, shape[0], first_index)
    if marginal:
        eps = C.normal(keys, 0, shape[1:], dtype)
        return gaussian_marginal_sample(gaussian, eps, grid_k).astype(dtype)
    x0 = C.initial_state(process, keys, grid0, x_T, shape, dtype)
    return gaussian_flow(gaussian, x0, sigma_from=grid0, sigma_to=grid_k).astype(dtype)


def start_state(
    source, key, shape, *, grid, x_T=None, first_index: int = 0, float64: bool = False
) -> Array:
    """The start state at ``grid[0]`` the plain samplers draw (or ``x_T`` when given).

    Exposed so that tests and callers can reproduce the plain draw:
    ``sampler(..., x_T=start_state(...))`` equals ``sampler(..., x_T=None)``.

    Returns:
      ``shape`` array in process coordinates at ``grid[0]``.
    """
    shape, g = C.check_common(source, shape, grid, x_T, first_index, float64)
    C.check_key(key)
    with C.x64_scope(float64):
        dtype = jnp.float64 if float64 else jnp.float32
        keys = example_keys(key, shape[0], first_index)
        return C.initial_state(source.process, keys, jnp.asarray(g[0], dtype), x_T, shape, dtype)


def teleport(
    sampler: Callable,
    source,
    gaussian: GaussianScore,
    key,
    shape,
    *,
    grid,
    skip: int | None = None,
    sigma_skip: float | None = None,
    x_T=None,
    first_index: int = 0,
    float64: bool = False,
    start: str = "auto",
    **opts,
):
    """Run ``sampler`` on ``grid[k:]`` after a closed-form Gaussian jump from ``grid[0]``.

    Wang & Vastola 2024, Sec. 6 and Algorithm "hybrid sampler": with ``k = skip``,
    ``x_k = gaussian_flow(x_T; grid[0] -> grid[k])`` (or a marginal draw at ``grid[k]``
    for SDE samplers, see the module docstring), then
    ``sampler(source, key, shape, grid=grid[k:], x_T=x_k, first_index=..., float64=...,
    **opts)``. For EDM Heun, ``k`` counts whole Heun steps: NFE ``2(N - k) - 1`` on a
    grid ending in 0.

    Args:
      sampler: any sampler with the library signature (e.g. ``scorelib.samplers.heun``).
      source: the score source the sampler uses on the tail (e.g. a trained network).
      gaussian: the Gaussian approximation (``fit_gaussian``); same process as ``source``.
      key: PRNG key (as for the sampler).
      shape: ``(batch, *data_shape)``.
      grid: ``[N + 1]`` VE noise levels of the plain run, strictly decreasing.
      skip: whole steps to skip, ``0 <= skip <= N - 1``; or
      sigma_skip: a VE level; ``k`` is the largest index with ``grid[k] >= sigma_skip``.
      x_T: optional start state at ``grid[0]`` in process coordinates (the ODE jump
        starts from it; not allowed with a marginal start).
      first_index, float64: as for the sampler.
      start: ``"auto"`` (marginal when the sampler declares itself stochastic with
        ``opts``, ODE when it declares itself deterministic), ``"ode"`` or ``"marginal"``.
      **opts: passed to the sampler (``S_churn``, ``snr``, ``unroll``, ...).

    Returns:
      ``(x, info)``: the sampler's output and its ``info`` (``nfe`` counts only the tail
      run: the jump evaluates no score), plus ``info["skip"] = k``,
      ``info["sigma_skip"] = grid[k]`` and ``info["start"]`` (``"plain"`` for ``k = 0``,
      which calls the plain sampler unchanged).

    Raises:
      ValueError: naming ``teleport.skip``/``teleport.sigma_skip``/``teleport.start``/
        ``teleport.gaussian`` for bad teleport arguments; with ``start="auto"``, for a
        sampler that declares no stochastic/deterministic property (a plain function);
        or as the sampler for the rest; all before anything is compiled.
    """
    shape, g = C.check_common(source, shape, grid, x_T, first_index, float64)
    C.check_key(key)
    if not isinstance(gaussian, GaussianScore):
        raise ValueError(
            f"teleport.gaussian must be a scorelib GaussianScore; got {type(gaussian).__name__}"
        )
    if gaussian.process != source.process:
        raise ValueError(
            "teleport.gaussian must use the same process as the source; got "
            f"{gaussian.process!r} and {source.process!r}"
        )
    d = int(np.prod(shape[1:]))
    if gaussian.mean.shape != (d,):
        raise ValueError(
            f"teleport.gaussian has dimension {gaussian.mean.shape[0]}; shape {shape} needs {d}"
        )
    if start not in _STARTS:
        raise ValueError(f"teleport.start must be one of {_STARTS}; got {start!r}")
    k = resolve_skip(g, skip, sigma_skip)
    if start == "auto":
        start = "marginal" if C.declared_stochastic(sampler, opts) else "ode"
    if start == "marginal" and x_T is not None and k > 0:
        raise ValueError(
            "teleport.start='marginal' draws its own start state at grid[skip]; pass x_T=None "
            "or start='ode'"
        )
    extra = {"skip": k, "sigma_skip": float(g[k])}
    if k == 0:
        x, info = sampler(
            source, key, shape, grid=g, x_T=x_T, first_index=first_index, float64=float64, **opts
        )
        return x, {**info, **extra, "start": "plain"}
    with C.x64_scope(float64):
        dtype = jnp.float64 if float64 else jnp.float32
        x_k = _jump(
            source.process,
            jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype), gaussian),
            key,
            jnp.asarray(g[0], dtype),
            jnp.asarray(g[k], dtype),
            x_T,
            first_index,
            shape=shape,
            marginal=start == "marginal",
        )
    x, info = sampler(
        source, key, shape, grid=g[k:], x_T=x_k, first_index=first_index, float64=float64, **opts
    )
    return x, {**info, **extra, "start": start}
