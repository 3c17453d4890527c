"""Measured convergence order against the closed-form Gaussian PF-ODE solution.

x(s) = mu + U diag(sqrt((s^2 + lam) / (s_T^2 + lam))) U^T (x_T - mu) in the VE frame
(Wang & Vastola 2024, eq. 8), computed here in numpy. Float64 states, a
rho = 7 grid from 20 to 0.05 without the final zero (so every step shrinks with N),
on VP (alpha != 1) and EDM.
"""

import jax
import numpy as np
import pytest
from sampler_helpers import PROCESSES, Gauss, alpha_at

from scorelib.samplers import SAMPLERS, edm_grid

G = Gauss(3, [0.05, 0.5, 2.0], seed=1)
S_MAX, S_MIN = 20.0, 0.05
NS = [16, 32, 64]


@pytest.mark.parametrize(
    "name,low,high", [("pf_ode_euler", 0.8, 1.3), ("heun", 1.7, 2.5), ("dpmpp_2m", 1.7, 2.5)]
)
@pytest.mark.parametrize("process", ["vp", "edm"])
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_convergence_order(name, low, high, process):
    p = PROCESSES[process]
    src = G.source(p, x64=True)
    x_T_ve = S_MAX * np.random.default_rng(2).normal(size=(8, 3))
    exact = G.pf_ode_ve(x_T_ve, S_MAX, S_MIN)
    a0, a1 = alpha_at(p, S_MAX), alpha_at(p, S_MIN)
    errs = []
    for n in NS:
        grid = edm_grid(n, S_MIN, S_MAX, 7.0, final_zero=False)
        x, _ = SAMPLERS[name](
            src, jax.random.key(0), (8, 3), grid=grid, x_T=a0 * x_T_ve, float64=True
        )
        errs.append(np.abs(np.asarray(x) / a1 - exact).max())
    slope = -np.polyfit(np.log(NS), np.log(errs), 1)[0]
    assert low <= slope <= high, (slope, errs)
    assert errs[-1] < 0.1
