"""Teleportation as a wrapper around any sampler.

Checks: skip = 0 is the plain sampler bit for bit; the start draw is the plain
sampler's; the tail run gets exactly ``grid[k:]`` and evaluates the score only at
tail grid points (recorded from inside the compiled sampler), as many times as
``info["nfe"]`` says; on Gaussian data with its exact score, teleporting does not
increase the sampler's error against the exact answer (the closed form for the ODE
samplers, the data law for Euler-Maruyama).
"""

import functools

import closed_forms as cf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.processes import EDM, VP
from scorelib.samplers import (
    annealed_langevin,
    dpmpp_2m,
    edm_grid,
    euler_maruyama,
    heun,
    pc,
    pf_ode_euler,
    uniform_t_grid,
)
from scorelib.samplers.teleport import resolve_skip, start_state, teleport
from scorelib.scores import GaussianScore, ScoreSource, fit_gaussian, gaussian_flow

D = 4


def gaussian(process, rank=None, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(400, D)) @ (rng.normal(size=(D, D)) * 0.4) + 0.3
    return fit_gaussian(process, x, rank=rank)


class Recording(ScoreSource):
    """Delegates to ``inner`` and records every VE level it is evaluated at."""

    inner: ScoreSource = None

    def denoiser(self, x, t):
        sig = self.process.ve_sigma(jnp.broadcast_to(t, (x.shape[0],)))[0]
        jax.debug.callback(lambda s: LOG.append(float(s)), sig, ordered=True)
        return self.inner.denoiser(x, t)

    def score(self, x, t):
        sig = self.process.ve_sigma(jnp.broadcast_to(t, (x.shape[0],)))[0]
        jax.debug.callback(lambda s: LOG.append(float(s)), sig, ordered=True)
        return self.inner.score(x, t)


LOG: list = []

SAMPLERS = {
    "heun": (heun, {}),
    "heun_churn": (heun, {"S_churn": 10.0}),
    "dpmpp_2m": (dpmpp_2m, {}),
    "euler_maruyama": (euler_maruyama, {}),
    "pc": (pc, {}),
    "pf_ode_euler": (pf_ode_euler, {}),
    "annealed_langevin": (annealed_langevin, {"n_steps_each": 2}),
}


SKIP_ZERO = [("heun", EDM()), ("dpmpp_2m", EDM()), ("euler_maruyama", VP()), ("heun_churn", VP())]


def test_skip_zero_is_the_plain_sampler_bitwise():
    """For each case of ``SKIP_ZERO``: teleport with skip = 0 is the plain sampler bit for
    bit; the wrapper's start draw is the plain sampler's documented draw, and passing it as
    x_T gives the plain run. The runs of all cases are one ``jax.jit``."""
    key, shape = jax.random.key(11), (3, D)
    gs = [gaussian(process) for _, process in SKIP_ZERO]
    grids = [edm_grid(6, sigma_max=float(p.ve_sigma(p.t_max))) for _, p in SKIP_ZERO]
    infos = []

    @jax.jit
    def runs(gs, key):
        out = []
        for (name, _), g, grid in zip(SKIP_ZERO, gs, grids, strict=True):
            sampler, opts = SAMPLERS[name]
            plain, info_p = sampler(g, key, shape, grid=grid, first_index=5, **opts)
            tele, info_t = teleport(
                sampler, g, g, key, shape, grid=grid, skip=0, first_index=5, **opts
            )
            x_T = start_state(g, key, shape, grid=grid, first_index=5)
            again, _ = sampler(g, key, shape, grid=grid, x_T=x_T, first_index=5, **opts)
            infos.append((info_p, info_t))
            out.append((plain, tele, x_T, again))
        return out

    outs = jax.tree.map(np.asarray, runs(gs, key))
    # The documented draw alpha(t0) grid[0] normal(fold_in(fold_in(key, first_index + b), 0))
    eps = np.stack(
        [
            np.asarray(
                jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, 5 + b), 0), (D,))
            )
            for b in range(3)
        ]
    )
    for (name, process), grid, (info_p, info_t), (plain, tele, x_T, again) in zip(
        SKIP_ZERO, grids, infos, outs, strict=True
    ):
        np.testing.assert_array_equal(tele, plain, err_msg=name)
        assert info_t["nfe"] == info_p["nfe"] and info_t["skip"] == 0, name
        assert info_t["sigma_skip"] == grid[0], name
        # The wrapper's start draw for k > 0 is the plain sampler's documented draw ...
        a0 = float(cf.alpha_at_ve_sigma(process, grid[0]))
        np.testing.assert_allclose(x_T, a0 * grid[0] * eps, rtol=1e-6, err_msg=name)
        # ... so passing it as x_T gives the plain run (up to XLA's float32 fusion choices:
        # a program that receives x_T is not the one that draws it).
        np.testing.assert_allclose(again, plain, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("k", [1, 7])
def test_heun_tail_is_exactly_the_grid_tail(k):
    """The teleported Heun run is heun on grid[k:] from the closed-form image of the
    plain start, bit for bit; and its score evaluations are at the tail grid points."""
    g = gaussian(EDM())
    grid = edm_grid(8)
    key, shape = jax.random.key(2), (2, D)
    seen = {}

    def spy(source, key, shape, *, grid, x_T, **kw):
        seen["grid"], seen["x_T"] = grid, x_T
        return heun(source, key, shape, grid=grid, x_T=x_T, **kw)

    tele, info = teleport(spy, g, g, key, shape, grid=grid, skip=k, start="ode")
    x_T = start_state(g, key, shape, grid=grid)
    x_k = gaussian_flow(g, x_T, sigma_from=jnp.float32(grid[0]), sigma_to=jnp.float32(grid[k]))
    np.testing.assert_allclose(np.asarray(seen["x_T"]), np.asarray(x_k), rtol=1e-5, atol=1e-6)
    assert np.array_equal(seen["grid"], grid[k:])
    ref, _ = heun(g, key, shape, grid=grid[k:], x_T=seen["x_T"])
    np.testing.assert_array_equal(np.asarray(tele), np.asarray(ref))
    assert info["nfe"] == 2 * (8 - k) - 1 and info["steps"] == 8 - k
    assert info["skip"] == k and info["sigma_skip"] == grid[k] and info["start"] == "ode"
    # Recorded levels: Euler evaluations at grid[k..7], corrections at grid[k+1..7].
    LOG.clear()
    teleport(
        heun, Recording(process=g.process, inner=g), g, jax.random.key(3), shape, grid=grid, skip=k
    )
    jax.effects_barrier()
    expected = sorted(list(grid[k:8]) + list(grid[k + 1 : 8]))
    np.testing.assert_allclose(sorted(LOG), expected, rtol=1e-6)
    assert len(LOG) == info["nfe"]


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_every_sampler_gets_the_grid_tail_and_reports_its_nfe():
    """Each sampler of ``SAMPLERS`` (behind a spy that declares no property): the tail run
    gets ``grid[k:]`` (the same floats) and a start state, and ``info`` reports the tail
    run's NFE and steps. All teleported runs and the samplers' own runs on the tail are one
    ``jax.jit``."""
    g = gaussian(VP())
    grid = uniform_t_grid(VP(), 7)
    k = 3
    seen, infos = {}, {}

    @jax.jit
    def runs(g, key):
        out = {}
        for name, (sampler, opts) in SAMPLERS.items():

            def spy(source, key, shape, *, grid, x_T=None, sampler=sampler, name=name, **kw):
                seen[name] = np.asarray(grid), x_T
                return sampler(source, key, shape, grid=grid, x_T=x_T, **kw)

            # what "auto" picks for the unwrapped sampler (the spy declares no property)
            start = "marginal" if sampler.is_stochastic(**opts) else "ode"
            assert start == ("ode" if name in ("heun", "dpmpp_2m", "pf_ode_euler") else "marginal")
            out[name], info = teleport(
                spy, g, g, key, (2, D), grid=grid, skip=k, start=start, **opts
            )
            x_k = seen[name][1]
            _, tail_info = sampler(g, key, (2, D), grid=grid[k:], x_T=x_k, **opts)
            infos[name] = info, tail_info, start, x_k.shape
        return out

    jax.block_until_ready(runs(g, jax.random.key(0)))
    assert sorted(seen) == sorted(infos) == sorted(SAMPLERS)
    for name, (info, tail_info, start, x_k_shape) in infos.items():
        assert np.array_equal(seen[name][0], grid[k:]), name  # same floats: no re-spacing
        assert x_k_shape == (2, D), name
        assert info["nfe"] == tail_info["nfe"], name
        assert info["steps"] == 7 - k, name
        assert info["start"] == start, name


def test_skip_validation_and_sigma_skip():
    g = gaussian(EDM())
    grid = edm_grid(18)
    args = (heun, g, g, jax.random.key(0), (1, D))
    for bad in [-1, 18, 1.5, True, "2"]:
        with pytest.raises(ValueError, match="teleport.skip"):
            teleport(*args, grid=grid, skip=bad)
    with pytest.raises(ValueError, match="teleport.skip"):
        teleport(*args, grid=grid)
    with pytest.raises(ValueError, match="teleport.sigma_skip"):
        teleport(*args, grid=grid, sigma_skip=-1.0)
    with pytest.raises(ValueError, match="teleport.start"):
        teleport(*args, grid=grid, skip=1, start="nope")
    with pytest.raises(ValueError, match="teleport.gaussian"):
        teleport(*args[:2], gaussian(VP()), *args[3:], grid=grid, skip=1)
    # "auto" picks a marginal start for the SDE samplers, which then refuse an x_T
    # (checked before anything is compiled).
    for sde_sampler in (euler_maruyama, pc, annealed_langevin):
        with pytest.raises(ValueError, match="marginal"):
            teleport(
                sde_sampler,
                g,
                g,
                jax.random.key(0),
                (1, D),
                grid=grid,
                skip=2,
                x_T=jnp.zeros((1, D)),
            )
    assert resolve_skip(grid, skip=17) == 17
    assert resolve_skip(grid, sigma_skip=float(grid[3])) == 3
    assert resolve_skip(grid, sigma_skip=0.5 * (grid[3] + grid[4])) == 3  # never below
    assert resolve_skip(grid, sigma_skip=1e3) == 0
    assert resolve_skip(grid, sigma_skip=1e-6) == 17
    # The N = 18 EDM grid's levels (Karras et al. 2022, eq. 5, by hand).
    np.testing.assert_allclose(
        grid[:9], [80, 57.6, 40.8, 28.4, 19.4, 12.9, 8.4, 5.3, 3.3], rtol=0.01, atol=0.05
    )


@pytest.mark.parametrize(
    "cases",
    [
        pytest.param([(heun, 18, EDM()), (dpmpp_2m, 10, VP())], id="heun18-edm,dpm10-vp"),
        pytest.param(
            [(heun, 18, VP()), (dpmpp_2m, 20, EDM())],
            id="heun18-vp,dpm20-edm",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_ode_teleport_within_discretisation_error(cases):
    """Exact Gaussian score: the teleported run's error against the exact flow is no
    larger than the plain run's (the skipped part is solved exactly), so it agrees with
    the plain run to within twice the plain sampler's discretisation error. For each
    (sampler, N, process) of ``cases``, the plain run, the runs teleported to k = 2 and
    N // 2 and the exact answer; all of them one ``jax.jit`` (one XLA compile)."""
    with jax.enable_x64(True):
        shape = (64, D)
        gs, tops = [], []
        for _, _, process in cases:
            gs.append(gaussian(process, rank=2))
            tops.append(float(process.ve_sigma(process.t_max)) if isinstance(process, VP) else 80.0)

        @jax.jit
        def runs(gs, key):
            out = []
            for (sampler, n, _), g, top in zip(cases, gs, tops, strict=True):
                grid = edm_grid(n, sigma_max=top)
                x_T = start_state(g, key, shape, grid=grid, float64=True)
                exact = gaussian_flow(g, x_T, sigma_from=top, sigma_to=0.0)
                plain, _ = sampler(g, key, shape, grid=grid, float64=True)
                teles = [
                    teleport(sampler, g, g, key, shape, grid=grid, skip=k, float64=True)[0]
                    for k in (2, n // 2)
                ]
                out.append((exact, plain, teles))
            return out

        outs = jax.tree.map(np.asarray, runs(gs, jax.random.key(5)))
    for (sampler, n, process), (exact, plain, teles) in zip(cases, outs, strict=True):
        case = (sampler.name, n, type(process).__name__)
        e_plain = np.sqrt(np.mean((plain - exact) ** 2))
        assert e_plain > 1e-6, case  # a real discretisation error to compare against
        for k, tele in zip((2, n // 2), teles, strict=True):
            e_tele = np.sqrt(np.mean((tele - exact) ** 2))
            diff = np.sqrt(np.mean((tele - plain) ** 2))
            assert e_tele <= 1.05 * e_plain, (case, k, e_tele, e_plain)
            assert diff <= 2.0 * e_plain, (case, k, diff, e_plain)


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_euler_maruyama_teleport_matches_the_data_law():
    """Euler-Maruyama on VP with the exact Gaussian score, 40 uniform steps, 20k samples,
    eigenvalues 1, 0.5, 0.25, 0.1. Teleporting to k = 10 or 36 (4 steps left) from the
    Gaussian marginal must give the data law at least as well as the plain run (up to
    Monte Carlo error); a start from pure noise N(0, alpha^2 s_k^2 I) at grid[36] (what
    a wrong marginal would give) must not."""
    p = VP()
    rng = np.random.default_rng(3)
    u, _ = np.linalg.qr(rng.normal(size=(D, D)))
    lam = np.array([1.0, 0.5, 0.25, 0.1])
    mu = rng.normal(size=D)
    g = GaussianScore(
        process=p,
        mean=jnp.asarray(mu, jnp.float32),
        eigvecs=jnp.asarray(u, jnp.float32),
        eigvals=jnp.asarray(lam, jnp.float32),
        residual_var=jnp.float32(0.0),
        data_shape=(D,),
    )
    grid = uniform_t_grid(p, 40)
    shape, key = (20000, D), jax.random.key(9)

    def errs(x):
        x = np.asarray(x, np.float64)
        c = np.diag(u.T @ np.cov(x.T) @ u)
        return np.max(np.abs(c / lam - 1)), np.max(np.abs(x.mean(0) - mu))

    # A noise-only start at grid[36] (the last run below) leaves the output far from the
    # data law. The four runs are one ``jax.jit`` (one XLA compile).
    noise = float(cf.alpha_at_ve_sigma(p, grid[36]) * grid[36]) * jax.random.normal(
        jax.random.key(1), shape
    )
    skips, infos = (10, 36), {}

    @jax.jit
    def runs(g, key, noise):
        plain, _ = euler_maruyama(g, key, shape, grid=grid)
        teles = []
        for k in skips:
            tele, infos[k] = teleport(euler_maruyama, g, g, key, shape, grid=grid, skip=k)
            teles.append(tele)
        wrong, _ = euler_maruyama(g, key, shape, grid=grid[36:], x_T=noise)
        return plain, teles, wrong

    plain, teles, wrong = runs(g, key, noise)
    ev_p, em_p = errs(plain)
    assert ev_p < 0.2  # the plain sampler is itself reasonable here
    mc = 4 * np.sqrt(2 / shape[0])  # 4 standard errors of a variance ratio
    for k, tele in zip(skips, teles, strict=True):
        assert infos[k]["nfe"] == 40 - k and infos[k]["start"] == "marginal"
        ev_t, em_t = errs(tele)
        assert ev_t <= ev_p + mc, (k, ev_t, ev_p)
        assert em_t <= em_p + 4 * np.sqrt(1.0 / shape[0]), (k, em_t, em_p)
    assert max(errs(wrong)) > ev_p + 3 * mc


@pytest.mark.slow
def test_rank_r_gaussian_teleports_a_network_like_source():
    """The Gaussian need not be the source: a rank-2 Gaussian teleports a full-rank one.
    The result differs from the plain run by no more than the two scores differ."""
    g_full = gaussian(EDM())
    g_r = gaussian(EDM(), rank=2)
    assert isinstance(g_r, GaussianScore) and g_r.eigvecs.shape == (D, 2)
    grid = edm_grid(18)
    key, shape = jax.random.key(4), (16, D)
    info = {}

    @jax.jit
    def runs(g_full, g_r, key):  # one XLA compile for both runs
        plain, _ = heun(g_full, key, shape, grid=grid)
        tele, info["tele"] = teleport(heun, g_full, g_r, key, shape, grid=grid, skip=4)
        return plain, tele

    plain, tele = runs(g_full, g_r, key)
    info = info["tele"]
    assert info["nfe"] == 2 * 14 - 1
    assert np.all(np.isfinite(np.asarray(tele)))
    # Near-Gaussian teleport at high sigma: the endpoints stay close (sigma_skip = 19.4).
    assert np.sqrt(np.mean((np.asarray(tele) - np.asarray(plain)) ** 2)) < 0.05


AUTO_START = [
    (functools.partial(pc, snr=0.1, n_corrector=2), {}, "marginal"),
    (functools.partial(euler_maruyama), {}, "marginal"),
    (functools.partial(heun, S_churn=10.0), {}, "marginal"),
    (functools.partial(heun), {"S_churn": 10.0}, "marginal"),
    (functools.partial(heun, S_churn=0.0), {}, "ode"),
    (functools.partial(dpmpp_2m), {}, "ode"),
    (heun, {"S_churn": 10.0}, "marginal"),
    (heun, {}, "ode"),
]


def test_auto_start_reads_the_declared_property():
    """A functools.partial of a sampler is read through: partial(pc) gets the marginal
    start (by function identity it used to get the ODE start); Heun is stochastic exactly
    when it churns. (The runs of all cases of ``AUTO_START`` are one ``jax.jit``.)"""
    g = gaussian(EDM())
    starts = []

    @jax.jit
    def runs(g, key):
        out = []
        for sampler, opts, _ in AUTO_START:
            x, info = teleport(sampler, g, g, key, (2, D), grid=edm_grid(6), skip=2, **opts)
            starts.append(info["start"])
            out.append(x)
        return out

    jax.block_until_ready(runs(g, jax.random.key(0)))
    assert starts == [start for _, _, start in AUTO_START]
    for sampler, opts, start in AUTO_START:
        if start == "marginal":  # and a marginal start refuses an x_T, before compiling
            with pytest.raises(ValueError, match="marginal"):
                teleport(
                    sampler,
                    g,
                    g,
                    jax.random.key(0),
                    (2, D),
                    grid=edm_grid(6),
                    skip=2,
                    x_T=jnp.zeros((2, D)),
                    **opts,
                )


def test_auto_start_refuses_a_sampler_without_a_declared_property():
    """A plain function (a wrapper) is never silently treated as deterministic."""
    g = gaussian(EDM())

    def wrapped(source, key, shape, **kw):
        return pc(source, key, shape, **kw)

    with pytest.raises(ValueError, match="declares no stochastic/deterministic property"):
        teleport(wrapped, g, g, jax.random.key(0), (2, D), grid=edm_grid(6), skip=2)
    with pytest.raises(ValueError, match="declares no"):
        teleport(
            functools.partial(wrapped, snr=0.1),
            g,
            g,
            jax.random.key(0),
            (2, D),
            grid=edm_grid(6),
            skip=2,
        )
    # an explicit start needs no property
    _, info = teleport(
        wrapped, g, g, jax.random.key(0), (2, D), grid=edm_grid(6), skip=2, start="marginal"
    )
    assert info["start"] == "marginal"
    # an option the sampler does not use is refused when the property is read
    with pytest.raises(ValueError, match="sampler.S_churn is not used by sampler pc"):
        teleport(pc, g, g, jax.random.key(0), (2, D), grid=edm_grid(6), skip=2, S_churn=1.0)
