"""DDRM: denoising diffusion restoration models (Kawar, Elad, Ermon and Song, NeurIPS 2022).

``ddrm(source, key, shape, *, grid, x_T=None, first_index=0, float64=False, eta=0.85,
eta_b=1.0, unroll=1) -> (x, info)`` with ``source`` a
:class:`~scorelib.scores.measured.MeasuredScore` (a prior, a measurement whose operator has
an SVD ``A = U diag(s) V^T`` and one ``sigma_y``, the measurements bound per example).

The update acts per singular direction, so it is a sampler, not a score source. In the VE
frame (``x_ve = x / alpha``, levels ``sigma_i`` from the grid), with
``x0 = D(x_ve; sigma_i)`` the prior's denoiser, spectral coordinates ``xb = V^T x``,
``xb0 = V^T x0``, ``yb = diag(1/s) U^T y`` and ``n_j = sigma_y / s_j`` the noise of
``yb_j``, one step to ``sigma' = sigma_{i+1}`` draws (the paper's eq. 7-8 with its
``sigma_t`` the level stepped to, as ``functions/denoising.py`` of bahjat-kawar/ddrm)::

    off A's row space (s_j = 0):  x0 + sqrt(1 - eta^2) sigma' (x - x0) / sigma + eta sigma' eps
    sigma' < n_j:                 xb0 + sqrt(1 - eta^2) sigma' (yb - xb0) / n_j + eta sigma' eps
    sigma' >= n_j:                (1 - eta_b) xb0 + eta_b yb + sqrt(sigma'^2 - n_j^2 eta_b^2) eps

The start is the driver's ``sigma_0 eps`` (the paper's start differs in the measured
directions by ``O(n_j / sigma_0)``, negligible at ``sigma_0 = 80``). A step to
``sigma' = 0`` leaves ``xb0`` off the measurement and where ``sigma_y > 0``, and, as the
paper's eq. 8 reads, ``(1 - eta_b) xb0 + eta_b yb`` where it is exact (``eta_b = 1``: the
measurement itself; the authors' code takes neither branch at ``s_j sigma' = sigma_y`` and
ends on ``xb0`` there). ``sigma' = n_j`` exactly counts as the third case.

Bias (``table=inverse_gaussian``, docs/inverse_problems.md): with ``eta > 0`` the update
off the measurement redraws ``eta sigma'`` of fresh noise around the denoiser's *mean*
every step (DDIM's ``eta`` scales with the step instead), so the draws are too narrow even
with an exact denoiser and in the limit of many steps; ``eta = 0`` is exact for noiseless
measurements of prior-independent coordinates.
One denoiser call per step (``info["nfe"] = N``). Noise: step ``i`` draws one standard normal
``eps`` of the data's shape from the driver's keys; ``V^T eps`` are the spectral draws and
``eps - V V^T eps`` the draw off the row space.
"""

from __future__ import annotations

import jax.numpy as jnp

from scorelib._checks import check_real, require
from scorelib.samplers.driver import Sampler, StepRule
from scorelib.scores.measured import MeasuredScore


def _check_source(source) -> None:
    """Raises ValueError naming ``method.name`` unless ``source`` is a MeasuredScore whose
    operator has an SVD and whose measurement has one noise level."""
    require(
        isinstance(source, MeasuredScore),
        "source",
        "a MeasuredScore (scorelib.scores.measured.posterior_source('ddrm', ...))",
        type(source).__name__,
    )
    op = source.measurement.operator
    require(
        op.svd() is not None,
        "method.name",
        f"a method without an SVD: ddrm needs the operator's SVD, which "
        f"{type(op).__name__} does not have",
        "ddrm",
    )
    require(
        source.measurement.scalar_noise,
        "method.name",
        "a method other than ddrm for measurements with several noise levels",
        "ddrm",
    )


class DDRM(StepRule):
    """DDRM (module docstring). Options: ``eta`` in ``[0, 1]`` (0.85, the paper's), ``eta_b``
    in ``[0, 1]`` (1.0). Stochastic.

    Raises (when called, before anything runs):
      ValueError: naming ``sampler.eta`` / ``sampler.eta_b`` (outside ``[0, 1]``),
        ``source`` (not a MeasuredScore) or ``method.name`` (an operator without an SVD, e.g.
        a Stacked measurement, or several noise levels).
    """

    name = "ddrm"
    default_grid = "edm"
    stochastic = True
    options = {"eta": 0.85, "eta_b": 1.0}

    def check(self, opts, grid):
        eta = check_real(opts["eta"], "sampler.eta", low=0.0, high=1.0)
        eta_b = check_real(opts["eta_b"], "sampler.eta_b", low=0.0, high=1.0)
        return {"eta": eta, "eta_b": eta_b}

    def nfe(self, n, final_zero, opts):
        return n

    def tables(self, ctx):
        _check_source(ctx.source)  # at trace time, before anything runs
        return {}

    def scan_inputs(self, ctx):
        g = ctx.grid
        return jnp.arange(ctx.n), g[:-1], g[1:]

    def init(self, ctx, x):
        return x / ctx.ve_alpha(ctx.grid[0])

    def step(self, ctx, x, xs):
        i, sig, sig_next = xs
        source = ctx.source
        op = source.measurement.operator
        svd = op.svd()
        eta, eta_b = ctx.opts["eta"], ctx.opts["eta_b"]
        t = ctx.process.t_of_ve_sigma(sig)
        x0 = source.prior_denoiser(ctx.process.alpha(t) * x, t)
        y = source.bound_y(x.shape[0]).astype(x.dtype)
        s = svd.s.astype(x.dtype)
        sigma_y = source.measurement.noise_std(x.dtype)
        eps = ctx.noise(i, 0)
        eps_b = svd.Vt(eps)
        eps_c = eps - svd.V(eps_b)
        xb, xb0 = svd.Vt(x), svd.Vt(x0)
        yb = svd.Ut(y) / s
        # off the row space: DDIM-like, from the state's own noise direction
        c = jnp.sqrt(1.0 - eta**2)
        x_c, x0_c = x - svd.V(xb), x0 - svd.V(xb0)
        off = x0_c + c * sig_next * (x_c - x0_c) / sig + eta * sig_next * eps_c
        # measured directions
        n = sigma_y / s
        below = sig_next < n
        safe_n = jnp.where(below, n, 1.0)
        quiet = xb0 + c * sig_next * (yb - xb0) / safe_n + eta * sig_next * eps_b
        var = jnp.maximum(sig_next**2 - (n * eta_b) ** 2, 0.0)
        loud = (1.0 - eta_b) * xb0 + eta_b * yb + jnp.sqrt(var) * eps_b
        return off + svd.V(jnp.where(below, quiet, loud))

    def final(self, ctx, x):
        return ctx.ve_alpha(ctx.grid[-1]) * x if not ctx.final_zero else x


ddrm = Sampler(DDRM())
