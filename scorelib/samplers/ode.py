"""Deterministic (probability-flow) samplers in the VE frame: EDM Heun and DPM-Solver++(2M).

Both integrate the probability-flow ODE of the VE frame ``x_ve = x / alpha(t)``::

    dx_ve / dsigma = (x_ve - D(x_ve; sigma)) / sigma,
    D(x_ve; sigma) = source.denoiser(alpha x_ve, t)

with ``sigma = ve_sigma`` read from the grid and ``t = process.t_of_ve_sigma(sigma)``
(Karras et al. 2022, eq. 4 with ``s(t) = alpha(t)``), so one grid gives the same
trajectory for every process. Neither sampler ever evaluates the denoiser at
``sigma = 0``. States are returned in process coordinates at the last grid point
(``alpha(t_N) x_ve``; at ``sigma = 0`` that is the data frame).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from scorelib.samplers import _common as C

_STATIC = ("shape", "final_zero", "unroll")


def _end(process, x_ve, sigma_end):
    """Back to process coordinates at a positive final level."""
    return process.alpha(process.t_of_ve_sigma(sigma_end)) * x_ve


def _start_ve(source, key, grid, x_T, first_index, shape):
    process = source.process
    keys = C.example_keys(key, first_index, shape[0])
    x = C.initial_state(process, keys, grid[0], x_T, shape, grid.dtype)
    return keys, x / process.alpha(process.t_of_ve_sigma(grid[0]))


# ----------------------------------------------------------------------------- EDM Heun
@functools.partial(jax.jit, static_argnames=_STATIC + ("S_churn", "S_min", "S_max", "S_noise"))
def _heun_core(source, key, grid, x_T, first_index, *, shape, final_zero, unroll,
               S_churn, S_min, S_max, S_noise):
    dtype = grid.dtype
    n = grid.shape[0] - 1
    keys, x = _start_ve(source, key, grid, x_T, first_index, shape)
    gamma_on = min(S_churn / n, math.sqrt(2.0) - 1.0)

    def hat(x, i, sig):
        # Karras et al. 2022, Algorithm 2, lines 4-6 (stochastic churn).
        if S_churn == 0:
            return x, sig
        gamma = jnp.where((sig >= S_min) & (sig <= S_max), gamma_on, 0.0).astype(dtype)
        sig_hat = sig * (1 + gamma)
        eps = C.normal(C.step_keys(keys, i), 0, shape[1:], dtype)
        # sqrt(sig_hat^2 - sig^2) written without cancellation (exactly 0 when gamma = 0;
        # the difference of squares can round, or be contracted to an FMA, below 0 -> NaN).
        return x + sig * jnp.sqrt(gamma * (2 + gamma)) * S_noise * eps, sig_hat

    def step(x, xs):
        i, sig, sig_next = xs
        x_hat, sig_hat = hat(x, i, sig)
        d = (x_hat - C.ve_denoiser(source, x_hat, sig_hat)) / sig_hat  # line 7
        x_next = x_hat + (sig_next - sig_hat) * d  # line 8
        d2 = (x_next - C.ve_denoiser(source, x_next, sig_next)) / sig_next  # line 10
        return x_hat + (sig_next - sig_hat) * (0.5 * d + 0.5 * d2), None  # line 11

    m = C.n_scanned(n, final_zero)
    x, _ = jax.lax.scan(step, x, (jnp.arange(m), grid[:m], grid[1 : m + 1]), unroll=unroll)
    if not final_zero:
        return _end(source.process, x, grid[n])
    # Last step to sigma = 0 is Euler (Algorithm 2, line 9 skipped): x_hat + (0 - sig_hat) d
    # equals D(x_hat; sig_hat) algebraically; we return D itself so no residual noise is left.
    x_hat, sig_hat = hat(x, n - 1, grid[n - 1])
    return C.ve_denoiser(source, x_hat, sig_hat)


def heun(
    source,
    key,
    shape,
    *,
    grid,
    x_T=None,
    first_index: int = 0,
    float64: bool = False,
    S_churn: float = 0.0,
    S_min: float = 0.0,
    S_max: float = math.inf,
    S_noise: float = 1.0,
    unroll: int = 1,
):
    """EDM's stochastic Heun sampler (Karras et al., NeurIPS 2022, Algorithm 2).

    For each step ``i``: churn ``gamma_i = min(S_churn / N, sqrt(2) - 1)`` if
    ``S_min <= sigma_i <= S_max`` else 0, ``sigma_hat = sigma_i (1 + gamma_i)``,
    ``x_hat = x + sqrt(sigma_hat^2 - sigma_i^2) S_noise eps``; an Euler step to
    ``sigma_{i+1}`` and, when ``sigma_{i+1} > 0``, the trapezoidal (Heun) correction.
    The step to ``sigma = 0`` is Euler and returns ``D(x_hat; sigma_hat)``.

    Args:
      source: a ``ScoreSource``; ``source.process`` is the process.
      key: a PRNG key (typed or raw); example ``b`` uses ``fold_in(key, first_index + b)``.
      shape: ``(batch, *data_shape)``.
      grid: ``[N + 1]`` VE noise levels, strictly decreasing, last ``>= 0`` (see ``grids``).
      x_T: optional ``shape`` start state in process coordinates at ``grid[0]``
        (replaces the draw ``alpha(t_0) grid[0] eps``).
      first_index: global index of the first example of this batch (>= 0).
      float64: run state and grid in float64 (scoped ``jax.enable_x64``).
      S_churn (>= 0), S_min (>= 0), S_max (>= S_min), S_noise (> 0): EDM churn settings;
        ``S_churn = 0`` is the deterministic sampler and draws no noise.
      unroll: ``lax.scan`` unroll factor (>= 1).

    Returns:
      ``(x, info)``: ``x`` of ``shape`` in process coordinates at ``grid[-1]`` (the data
      frame when it is 0); ``info = {"nfe": 2N - 1 if grid[-1] == 0 else 2N, "steps": N}``.

    Raises:
      ValueError: for any invalid argument, before anything is compiled.
    """
    shape, g = C.check_common(source, shape, grid, x_T, first_index, float64)
    C.check_key(key)
    S_churn = C.check_real(S_churn, "S_churn", low=0.0, low_open=False)
    S_min = C.check_real(S_min, "S_min", low=0.0, low_open=False)
    S_max = C.check_real(S_max, "S_max", low=S_min, low_open=False)
    S_noise = C.check_real(S_noise, "S_noise", low=0.0, low_open=True)
    unroll = C.check_int(unroll, "unroll", low=1)
    n, final_zero = g.shape[0] - 1, bool(g[-1] == 0)
    with C.x64_scope(float64):
        dtype = jnp.float64 if float64 else jnp.float32
        x = _heun_core(
            source, key, jnp.asarray(g, dtype), x_T, first_index, shape=shape,
            final_zero=final_zero, unroll=unroll, S_churn=S_churn, S_min=S_min, S_max=S_max,
            S_noise=S_noise,
        )
    return x, {"nfe": 2 * n - (1 if final_zero else 0), "steps": n}


# ------------------------------------------------------------------------ DPM-Solver++(2M)
def _first_order(x, d, sig, sig_next):
    """DPM-Solver++ first-order (DDIM) step in the VE frame.

    ``(sig_next / sig) x - expm1(-h) d`` with ``h = log(sig / sig_next)``, written as
    ``r x + (1 - r) d`` with ``r = sig_next / sig``; at ``sig_next = 0`` it is ``d``.
    """
    r = sig_next / sig
    return r * x + (1 - r) * d


@functools.partial(jax.jit, static_argnames=_STATIC)
def _dpmpp_2m_core(source, key, grid, x_T, first_index, *, shape, final_zero, unroll):
    n = grid.shape[0] - 1
    _, x = _start_ve(source, key, grid, x_T, first_index, shape)

    def D(x, s):
        return C.ve_denoiser(source, x, s)

    def finish(x, d_last):
        if final_zero:
            return d_last  # the step to sigma = 0 returns the denoiser output exactly
        return _end(source.process, _first_order(x, d_last, grid[n - 1], grid[n]), grid[n])

    d0 = D(x, grid[0])
    if n == 1:
        return finish(x, d0)
    x = _first_order(x, d0, grid[0], grid[1])  # first step: first order

    def step(carry, xs):
        # Lu et al. 2022, DPM-Solver++(2M), Algorithm 2 (alpha = 1 in the VE frame).
        x, d_prev = carry
        s_prev, s, s_next = xs
        d = D(x, s)
        h = jnp.log(s / s_next)
        r = jnp.log(s_prev / s) / h
        d_hat = (1 + 1 / (2 * r)) * d - (1 / (2 * r)) * d_prev
        return (_first_order(x, d_hat, s, s_next), d), None

    (x, _), _ = jax.lax.scan(
        step, (x, d0), (grid[0 : n - 2], grid[1 : n - 1], grid[2:n]), unroll=unroll
    )
    return finish(x, D(x, grid[n - 1]))  # last step: first order


def dpmpp_2m(
    source,
    key,
    shape,
    *,
    grid,
    x_T=None,
    first_index: int = 0,
    float64: bool = False,
    unroll: int = 1,
):
    """DPM-Solver++(2M), the multistep second-order data-prediction solver.

    Lu et al. 2022 (arXiv 2211.01095), Algorithm 2, in the VE frame with
    ``lambda = -log sigma``, ``h_i = lambda_{i+1} - lambda_i``::

        x_{i+1} = (sigma_{i+1} / sigma_i) x_i - (exp(-h_i) - 1) D_hat_i
        D_hat_i = (1 + 1 / (2 r_i)) D_i - 1 / (2 r_i) D_{i-1},   r_i = h_{i-1} / h_i

    The first and the last steps are first order (``D_hat = D_i``); a last step to
    ``sigma = 0`` returns ``D_{N-1}`` exactly. One NFE per step.

    Args, Returns, Raises: as :func:`scorelib.samplers.heun` without the churn options;
    ``info["nfe"] = N``.
    """
    shape, g = C.check_common(source, shape, grid, x_T, first_index, float64)
    C.check_key(key)
    unroll = C.check_int(unroll, "unroll", low=1)
    n, final_zero = g.shape[0] - 1, bool(g[-1] == 0)
    with C.x64_scope(float64):
        dtype = jnp.float64 if float64 else jnp.float32
        x = _dpmpp_2m_core(
            source, key, jnp.asarray(g, dtype), x_T, first_index, shape=shape,
            final_zero=final_zero, unroll=unroll,
        )
    return x, {"nfe": n, "steps": n}
