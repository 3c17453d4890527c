import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sampler_helpers import PROCESSES

from scorelib.samplers import edm_grid, log_snr_grid, uniform_t_grid


def karras_loop(n, smin, smax, rho):
    """EDM eq. 5 written as a plain loop (NVlabs/edm generate.py form) plus t_N = 0."""
    out = []
    for i in range(n):
        frac = i / (n - 1) if n > 1 else 0.0
        out.append((smax ** (1 / rho) + frac * (smin ** (1 / rho) - smax ** (1 / rho))) ** rho)
    return np.array(out + [0.0])


@pytest.mark.parametrize("n", [1, 2, 3, 18, 40])
@pytest.mark.parametrize("smin,smax,rho", [(0.002, 80.0, 7.0), (0.01, 50.0, 3.0)])
def test_edm_grid_matches_eq5(n, smin, smax, rho):
    g = edm_grid(n, smin, smax, rho)
    assert g.shape == (n + 1,) and g.dtype == np.float64
    np.testing.assert_allclose(g, karras_loop(n, smin, smax, rho), rtol=1e-12)
    assert g[-1] == 0.0 and g[0] == smax
    if n > 1:
        assert g[-2] == smin
    assert np.all(np.diff(g) < 0)


def test_edm_grid_known_values():
    # methods/04 §4.3 table: N = 18, skip 1..8 land on these levels.
    g = edm_grid(18)
    np.testing.assert_allclose(
        g[1:9], [57.6, 40.8, 28.4, 19.4, 12.9, 8.4, 5.3, 3.3], rtol=0.02
    )


@pytest.mark.parametrize("n", [1, 2, 7])
def test_edm_grid_without_zero(n):
    g = edm_grid(n, 0.05, 20.0, 7.0, final_zero=False)
    assert g.shape == (n + 1,) and g[0] == 20.0 and g[-1] == 0.05
    np.testing.assert_allclose(g, karras_loop(n + 1, 0.05, 20.0, 7.0)[:-1], rtol=1e-12)


@pytest.mark.parametrize("name", list(PROCESSES))
@pytest.mark.parametrize("final_zero", [True, False])
def test_uniform_t_grid_is_uniform_in_time(name, final_zero):
    p = PROCESSES[name]
    n = 6
    g = uniform_t_grid(p, n, final_zero=final_zero)
    assert g.shape == (n + 1,) and np.all(np.diff(g) < 0)
    pos = g[:-1] if final_zero else g
    assert (g[-1] == 0.0) == final_zero
    with jax.enable_x64(True):
        t = np.asarray(p.t_of_ve_sigma(jnp.asarray(pos)))
    np.testing.assert_allclose(t, np.linspace(p.t_max, p.t_min, len(pos)), atol=1e-9)


@pytest.mark.parametrize("name", list(PROCESSES))
def test_log_snr_grid_is_uniform_in_log_snr(name):
    p = PROCESSES[name]
    g = log_snr_grid(p, 5)
    lam = -2 * np.log(g[:-1])
    assert g[-1] == 0.0
    np.testing.assert_allclose(np.diff(lam), np.full(4, lam[1] - lam[0]), rtol=1e-9)
    with jax.enable_x64(True):
        ends = np.asarray(p.log_snr(jnp.asarray([p.t_max, p.t_min], jnp.float64)))
    np.testing.assert_allclose(lam[[0, -1]], ends, rtol=1e-9)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(n=0), "sampler.steps"),
        (dict(n=2.5), "sampler.steps"),
        (dict(n=4, sigma_min=0.0), "sampler.sigma_min"),
        (dict(n=4, sigma_min=-1.0), "sampler.sigma_min"),
        (dict(n=4, sigma_min=80.0, sigma_max=80.0), "sampler.sigma_max"),
        (dict(n=4, sigma_min=90.0, sigma_max=80.0), "sampler.sigma_max"),
        (dict(n=4, rho=0.0), "sampler.rho"),
        (dict(n=4, rho=-7.0), "sampler.rho"),
    ],
)
def test_edm_grid_rejects_bad_input(kwargs, field):
    with pytest.raises(ValueError, match=field):
        edm_grid(**kwargs)


def test_process_grids_reject_bad_input():
    p = PROCESSES["vp"]
    for fn in (uniform_t_grid, log_snr_grid):
        with pytest.raises(ValueError, match="sampler.steps"):
            fn(p, 0)
        with pytest.raises(ValueError, match="sampler.t_min"):
            fn(p, 3, t_min=0.5, t_max=0.5)
        with pytest.raises(ValueError, match="sampler.t_min"):
            fn(p, 3, t_min=0.0)  # VP ve_sigma(0) = 0: no positive bottom level
