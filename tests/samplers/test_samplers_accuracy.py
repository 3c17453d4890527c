"""With enough steps, samples have the data's mean and covariance, and no residual noise.

The data is a rank-deficient Gaussian: along the zero-variance direction any leftover
noise (sigma_min^2 = 1e-4 or more here) would show as variance, while the exact answer
is 0. Along the others the sample mean and variance must match within 5 Monte-Carlo
standard errors (sqrt(lam / n) and lam sqrt(2 / n)).
"""

import jax
import numpy as np
import pytest
from sampler_helpers import PROCESSES, Gauss

from scorelib.samplers import SAMPLERS, edm_grid, uniform_t_grid

CASES = [
    # name, options, grid(process), process, d, n
    ("heun", {}, lambda p: edm_grid(32), "vp", 3, 20000),
    ("heun", dict(S_churn=20.0, S_min=0.01, S_max=10.0), lambda p: edm_grid(64), "ve", 3, 20000),
    ("dpmpp_2m", {}, lambda p: edm_grid(32), "subvp", 3, 20000),
    ("dpmpp_2m", {}, lambda p: edm_grid(32), "edm", 3, 20000),
    ("pf_ode_euler", {}, lambda p: uniform_t_grid(p, 500), "vp", 3, 20000),
    ("euler_maruyama", {}, lambda p: uniform_t_grid(p, 500), "ve", 3, 20000),
    ("euler_maruyama", {}, lambda p: uniform_t_grid(p, 500), "vp", 3, 20000),
    ("pc", dict(snr=0.05, n_corrector=1), lambda p: uniform_t_grid(p, 300), "vp", 16, 5000),
    # the corrector's step depends on t only, so low dimension is fine too
    ("pc", dict(snr=0.16, n_corrector=2), lambda p: uniform_t_grid(p, 300), "ve", 3, 20000),
    (
        "annealed_langevin",
        dict(n_steps_each=100),
        lambda p: edm_grid(20, 0.01, 50.0),
        "ve",
        3,
        4000,
    ),
]
FAST = {0, 2}


@pytest.mark.parametrize(
    "case",
    [pytest.param(i, marks=() if i in FAST else pytest.mark.slow) for i in range(len(CASES))],
)
def test_moments_match_data_and_no_residual_noise(case):
    name, opts, gridf, process, d, n = CASES[case]
    p = PROCESSES[process]
    lam = np.concatenate([[0.0], np.linspace(0.3, 1.5, d - 1)])
    g = Gauss(d, lam, seed=5)
    x, _ = SAMPLERS[name](g.source(p), jax.random.key(case), (n, d), grid=gridf(p), **opts)
    c = (np.asarray(x, np.float64) - g.mu) @ g.q  # eigen-coordinates
    cov = np.cov(c.T)
    assert cov[0, 0] < 1e-8, cov[0, 0]  # no residual noise along the zero-variance direction
    assert abs(c[:, 0].mean()) < 1e-4
    se_mean = np.sqrt(lam[1:] / n)
    assert np.all(np.abs(c[:, 1:].mean(0)) < 5 * se_mean + 1e-3), c.mean(0) / np.r_[1, se_mean]
    rel = np.diag(cov)[1:] / lam[1:] - 1
    assert np.all(np.abs(rel) < 5 * np.sqrt(2 / n)), rel
    corr = cov[1:, 1:] / np.sqrt(np.outer(lam[1:], lam[1:]))
    off = corr[~np.eye(d - 1, dtype=bool)]
    assert np.all(np.abs(off) < 5 / np.sqrt(n)), off
