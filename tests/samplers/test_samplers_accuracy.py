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
FAST = (0, 2)


def check_moments(case, x):
    """The moment checks of the module docstring on the samples ``x`` of ``CASES[case]``."""
    name, opts, _, process, d, n = CASES[case]
    lam = np.concatenate([[0.0], np.linspace(0.3, 1.5, d - 1)])
    g = Gauss(d, lam, seed=5)
    c = (np.asarray(x, np.float64) - g.mu) @ g.q  # eigen-coordinates
    cov = np.cov(c.T)
    assert cov[0, 0] < 1e-8, (case, cov[0, 0])  # no residual noise along the zero-variance axis
    assert abs(c[:, 0].mean()) < 1e-4, case
    se_mean = np.sqrt(lam[1:] / n)
    assert np.all(np.abs(c[:, 1:].mean(0)) < 5 * se_mean + 1e-3), (
        case,
        c.mean(0) / np.r_[1, se_mean],
    )
    rel = np.diag(cov)[1:] / lam[1:] - 1
    assert np.all(np.abs(rel) < 5 * np.sqrt(2 / n)), (case, rel)
    corr = cov[1:, 1:] / np.sqrt(np.outer(lam[1:], lam[1:]))
    off = corr[~np.eye(d - 1, dtype=bool)]
    assert np.all(np.abs(off) < 5 / np.sqrt(n)), (case, off)


@pytest.mark.parametrize(
    "cases",
    [
        pytest.param(FAST, id="fast"),
        pytest.param(
            tuple(i for i in range(len(CASES)) if i not in FAST), id="rest", marks=pytest.mark.slow
        ),
    ],
)
def test_moments_match_data_and_no_residual_noise(cases):
    """Each case of ``CASES`` (key ``case``); the runs of one group are traced into one
    ``jax.jit`` over their sources (one XLA compile per group)."""
    sources, grids = {}, {}
    for i in cases:
        name, opts, gridf, process, d, n = CASES[i]
        lam = np.concatenate([[0.0], np.linspace(0.3, 1.5, d - 1)])
        sources[i] = Gauss(d, lam, seed=5).source(PROCESSES[process])
        grids[i] = gridf(PROCESSES[process])  # on the host: the sampler checks it there

    def run_all(sources, keys):
        out = {}
        for i in cases:
            name, opts, _, _, d, n = CASES[i]
            out[i], _ = SAMPLERS[name](sources[i], keys[i], (n, d), grid=grids[i], **opts)
        return out

    xs = jax.jit(run_all)(sources, {i: jax.random.key(i) for i in cases})
    for i in cases:
        check_moments(i, xs[i])
