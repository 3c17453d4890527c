import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sampler_helpers import PROCESSES

from scorelib.samplers import GRIDS, SAMPLERS, edm_grid, log_snr_grid, make_grid, uniform_t_grid


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
    # Karras et al. 2022, eq. 5 by hand at N = 18: the levels that skips 1..8 land on.
    g = edm_grid(18)
    np.testing.assert_allclose(g[1:9], [57.6, 40.8, 28.4, 19.4, 12.9, 8.4, 5.3, 3.3], rtol=0.02)


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


def test_make_grid_is_each_grid_with_its_options():
    p = PROCESSES["vp"]
    np.testing.assert_array_equal(make_grid("edm", 6), edm_grid(6))
    np.testing.assert_array_equal(
        make_grid("edm", 6, p, rho=3.0, sigma_min=0.01), edm_grid(6, sigma_min=0.01, rho=3.0)
    )
    np.testing.assert_array_equal(
        make_grid("edm", 4, final_zero=False), edm_grid(4, final_zero=False)
    )
    np.testing.assert_array_equal(make_grid("uniform_t", 5, p), uniform_t_grid(p, 5))
    np.testing.assert_array_equal(
        make_grid("uniform_t", 5, p, t_min=0.01, t_max=0.9),
        uniform_t_grid(p, 5, t_min=0.01, t_max=0.9),
    )
    np.testing.assert_array_equal(
        make_grid("log_snr", 5, p, t_max=0.5), log_snr_grid(p, 5, t_max=0.5)
    )
    assert set(GRIDS) == {"edm", "uniform_t", "log_snr"}
    # the declared defaults are the constructors' defaults
    np.testing.assert_array_equal(make_grid("edm", 6, **GRIDS["edm"]), edm_grid(6))
    assert GRIDS == {
        "edm": {"sigma_min": 0.002, "sigma_max": 80.0, "rho": 7.0},
        "uniform_t": {"t_min": None, "t_max": None},
        "log_snr": {"t_min": None, "t_max": None},
    }


def test_each_sampler_declares_the_grid_of_its_paper():
    """Heun and DPM-Solver++ on EDM's rho-schedule, the score-SDE samplers uniform in t
    (score_sde's ``linspace(T, eps, N)``), annealed Langevin on geometric noise levels."""
    assert {name: s.default_grid for name, s in SAMPLERS.items()} == {
        "heun": "edm",
        "dpmpp_2m": "edm",
        "euler_maruyama": "uniform_t",
        "pf_ode_euler": "uniform_t",
        "pc": "uniform_t",
        "annealed_langevin": "log_snr",
    }


@pytest.mark.parametrize(
    "name,opt",
    [
        ("log_snr", "rho"),
        ("log_snr", "sigma_min"),
        ("uniform_t", "sigma_max"),
        ("edm", "t_min"),
        ("edm", "snr"),
    ],
)
def test_make_grid_refuses_an_option_the_grid_does_not_use(name, opt):
    """E.g. ``sampler.grid=log_snr sampler.rho=3`` must not run without a word."""
    with pytest.raises(ValueError, match=f"sampler.{opt} is not used by grid {name}") as e:
        make_grid(name, 4, PROCESSES["vp"], **{opt: 3.0})
    for o in GRIDS[name]:
        assert o in str(e.value)


def test_make_grid_rejects_bad_input():
    with pytest.raises(ValueError, match="sampler.grid must be one of"):
        make_grid("karras", 4)
    with pytest.raises(ValueError, match="process must be a scorelib Process"):
        make_grid("log_snr", 4)
    with pytest.raises(ValueError, match="sampler.rho"):
        make_grid("edm", 4, rho="7")
    with pytest.raises(ValueError, match="sampler.t_max"):
        make_grid("uniform_t", 4, PROCESSES["vp"], t_max=float("nan"))
    with pytest.raises(ValueError, match="sampler.steps"):
        make_grid("uniform_t", 0, PROCESSES["vp"])
