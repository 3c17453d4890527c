"""Probability-flow samplers in the VE frame: EDM Heun and DPM-Solver++(2M).

Both integrate the probability-flow ODE of the VE frame ``x_ve = x / alpha(t)``::

    dx_ve / dsigma = (x_ve - D(x_ve; sigma)) / sigma,
    D(x_ve; sigma) = source.denoiser(alpha x_ve, t)

with ``sigma = ve_sigma`` read from the grid and ``t = process.t_of_ve_sigma(sigma)``
(Karras et al. 2022, eq. 4 with ``s(t) = alpha(t)``), so one grid gives the same
trajectory for every process. Neither sampler ever evaluates the denoiser at
``sigma = 0``. States are returned in process coordinates at the last grid point
(``alpha(t_N) x_ve``; at ``sigma = 0`` that is the data frame).

Each sampler is a :class:`scorelib.samplers.driver.StepRule`; the driver owns
validation, keys, the scan and the NFE count.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from scorelib._checks import check_real
from scorelib.samplers.driver import Sampler, StepRule


# ----------------------------------------------------------------------------- EDM Heun
class Heun(StepRule):
    """EDM's stochastic Heun sampler (Karras et al., NeurIPS 2022, Algorithm 2).

    ``heun(source, key, shape, *, grid, x_T=None, first_index=0, float64=False,
    S_churn=0.0, S_min=0.0, S_max=inf, S_noise=1.0, unroll=1) -> (x, info)``

    For each step ``i``: churn ``gamma_i = min(S_churn / N, sqrt(2) - 1)`` if
    ``S_min <= sigma_i <= S_max`` else 0, ``sigma_hat = sigma_i (1 + gamma_i)``,
    ``x_hat = x + sqrt(sigma_hat^2 - sigma_i^2) S_noise eps``; an Euler step to
    ``sigma_{i+1}`` and, when ``sigma_{i+1} > 0``, the trapezoidal (Heun) correction.
    The step to ``sigma = 0`` is Euler and returns ``D(x_hat; sigma_hat)``.
    Stochastic when ``S_churn > 0``.

    Args:
      source: a ``ScoreSource``; ``source.process`` is the process.
      key: a PRNG key (typed or raw); example ``b`` uses ``fold_in(key, first_index + b)``.
      shape: ``(batch, *data_shape)``.
      grid: ``[N + 1]`` VE noise levels (data units), strictly decreasing, last ``>= 0``
        (see ``scorelib.samplers.grids``).
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
      ValueError: for any invalid argument or unused option, before anything is compiled.
    """

    name = "heun"
    default_grid = "edm"  # Karras et al. 2022, eq. 5
    options = {"S_churn": 0.0, "S_min": 0.0, "S_max": math.inf, "S_noise": 1.0}

    def is_stochastic(self, opts):
        return opts["S_churn"] > 0

    def check(self, opts, grid):
        S_churn = check_real(opts["S_churn"], "sampler.S_churn", low=0.0)
        S_min = check_real(opts["S_min"], "sampler.S_min", low=0.0)
        S_max = check_real(opts["S_max"], "sampler.S_max", low=S_min, allow_inf=True)
        S_noise = check_real(opts["S_noise"], "sampler.S_noise", low=0.0, low_open=True)
        got = {"S_churn": S_churn, "S_min": S_min, "S_max": S_max, "S_noise": S_noise}
        if S_churn == 0:  # the others only shape the churn: given alone they would do nothing
            for k in ("S_min", "S_max", "S_noise"):
                if got[k] != self.options[k]:
                    raise ValueError(
                        f"sampler.{k} is not used by sampler heun when sampler.S_churn = 0 "
                        f"(it only shapes the churn); got {got[k]!r}"
                    )
        return got

    def nfe(self, n, final_zero, opts):
        return 2 * n - (1 if final_zero else 0)

    def scan_inputs(self, ctx):
        m = ctx.n - 1 if ctx.final_zero else ctx.n  # the step to sigma = 0 is done in final
        return jnp.arange(m), ctx.grid[:m], ctx.grid[1 : m + 1]

    def init(self, ctx, x):
        return x / ctx.ve_alpha(ctx.grid[0])

    def _hat(self, ctx, x, i, sig):
        # Karras et al. 2022, Algorithm 2, lines 4-6 (stochastic churn).
        o = ctx.opts
        if o["S_churn"] == 0:
            return x, sig
        gamma_on = min(o["S_churn"] / ctx.n, math.sqrt(2.0) - 1.0)
        gamma = jnp.where((sig >= o["S_min"]) & (sig <= o["S_max"]), gamma_on, 0.0)
        gamma = gamma.astype(ctx.dtype)
        sig_hat = sig * (1 + gamma)
        eps = ctx.noise(i, 0)
        # sqrt(sig_hat^2 - sig^2) written without cancellation (exactly 0 when gamma = 0;
        # the difference of squares can round, or be contracted to an FMA, below 0 -> NaN).
        return x + sig * jnp.sqrt(gamma * (2 + gamma)) * o["S_noise"] * eps, sig_hat

    def step(self, ctx, x, xs):
        i, sig, sig_next = xs
        x_hat, sig_hat = self._hat(ctx, x, i, sig)
        d = (x_hat - ctx.ve_denoiser(x_hat, sig_hat)) / sig_hat  # line 7
        x_next = x_hat + (sig_next - sig_hat) * d  # line 8
        d2 = (x_next - ctx.ve_denoiser(x_next, sig_next)) / sig_next  # line 10
        return x_hat + (sig_next - sig_hat) * (0.5 * d + 0.5 * d2)  # line 11

    def final(self, ctx, x):
        n = ctx.n
        if not ctx.final_zero:
            return ctx.ve_alpha(ctx.grid[n]) * x
        # Last step to sigma = 0 is Euler (Algorithm 2, line 9 skipped): x_hat + (0 - sig_hat) d
        # equals D(x_hat; sig_hat) algebraically; we return D itself so no residual noise is left.
        x_hat, sig_hat = self._hat(ctx, x, n - 1, ctx.grid[n - 1])
        return ctx.ve_denoiser(x_hat, sig_hat)


# ------------------------------------------------------------------------ DPM-Solver++(2M)
def _first_order(x, d, sig, sig_next):
    """DPM-Solver++ first-order (DDIM) step in the VE frame.

    ``(sig_next / sig) x - expm1(-h) d`` with ``h = log(sig / sig_next)``, written as
    ``r x + (1 - r) d`` with ``r = sig_next / sig``; at ``sig_next = 0`` it is ``d``.
    """
    r = sig_next / sig
    return r * x + (1 - r) * d


class DPMSolverPP2M(StepRule):
    """DPM-Solver++(2M), the multistep second-order data-prediction solver.

    ``dpmpp_2m(source, key, shape, *, grid, x_T=None, first_index=0, float64=False,
    unroll=1) -> (x, info)``

    Lu et al. 2022 (arXiv 2211.01095), Algorithm 2, in the VE frame with
    ``lambda = -log sigma``, ``h_i = lambda_{i+1} - lambda_i``::

        x_{i+1} = (sigma_{i+1} / sigma_i) x_i - (exp(-h_i) - 1) D_hat_i
        D_hat_i = (1 + 1 / (2 r_i)) D_i - 1 / (2 r_i) D_{i-1},   r_i = h_{i-1} / h_i

    The first and the last steps are first order (``D_hat = D_i``); a last step to
    ``sigma = 0`` returns ``D_{N-1}`` exactly. One NFE per step. Deterministic given
    ``x_T``.

    Args, Returns, Raises: as :func:`scorelib.samplers.heun` without the churn options;
    ``info["nfe"] = N``.
    """

    name = "dpmpp_2m"
    default_grid = "edm"
    stochastic = False

    def nfe(self, n, final_zero, opts):
        return n

    def scan_inputs(self, ctx):
        # steps 1 .. N - 2: step 0 (first order) is done in init, the last step in final
        m, g = max(ctx.n - 2, 0), ctx.grid
        return g[0:m], g[1 : m + 1], g[2 : m + 2]

    def init(self, ctx, x):
        g = ctx.grid
        x = x / ctx.ve_alpha(g[0])
        d0 = ctx.ve_denoiser(x, g[0])
        if ctx.n == 1:
            return x, d0
        return _first_order(x, d0, g[0], g[1]), d0  # first step: first order

    def step(self, ctx, carry, xs):
        # Lu et al. 2022, DPM-Solver++(2M), Algorithm 2 (alpha = 1 in the VE frame).
        x, d_prev = carry
        s_prev, s, s_next = xs
        d = ctx.ve_denoiser(x, s)
        h = jnp.log(s / s_next)
        r = jnp.log(s_prev / s) / h
        d_hat = (1 + 1 / (2 * r)) * d - (1 / (2 * r)) * d_prev
        return _first_order(x, d_hat, s, s_next), d

    def final(self, ctx, carry):
        x, d_prev = carry
        g, n = ctx.grid, ctx.n
        d_last = d_prev if n == 1 else ctx.ve_denoiser(x, g[n - 1])  # last step: first order
        if ctx.final_zero:
            return d_last  # the step to sigma = 0 returns the denoiser output exactly
        return ctx.ve_alpha(g[n]) * _first_order(x, d_last, g[n - 1], g[n])


heun = Sampler(Heun())
dpmpp_2m = Sampler(DPMSolverPP2M())
