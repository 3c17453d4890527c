"""Noise processes checked against the closed forms of Song et al. (ICLR 2021, App. B)
and Karras et al. (2022, Table 1), written independently in float64 numpy in
``tests/closed_forms.py``."""

import functools
import math
import re

import closed_forms
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from scorelib.processes import EDM, PROCESSES, VE, VP, SubVP

# Two settings of each process: a constant valid for one setting only shows up.
ALL = [
    VE(),
    VE(sigma_min=0.002, sigma_max=10.0, eps=1e-3),
    VP(),
    VP(beta_min=0.5, beta_max=10.0, eps=1e-4),
    VP(beta_min=1.0, beta_max=1.0),  # constant beta: the degenerate quadratic
    SubVP(),
    SubVP(beta_min=0.2, beta_max=5.0),
    EDM(),
    EDM(sigma_min=0.01, sigma_max=5.0),
]

ref_alpha_sigma = closed_forms.alpha_sigma
ref_sde = closed_forms.f_g2


def t_grid(p, n=9):
    return np.linspace(p.t_min, p.t_max, n)


@pytest.mark.parametrize("p", ALL, ids=repr)
def test_alpha_sigma_logsnr_match_closed_forms(p):
    t = t_grid(p)
    a_ref, s_ref = ref_alpha_sigma(p, t)
    np.testing.assert_allclose(p.alpha(jnp.asarray(t)), a_ref, rtol=1e-5)
    np.testing.assert_allclose(p.sigma(jnp.asarray(t)), s_ref, rtol=2e-4)
    np.testing.assert_allclose(
        p.log_snr(jnp.asarray(t)), np.log(a_ref**2 / s_ref**2), rtol=1e-4, atol=1e-4
    )
    # VP <-> VE change of variables: the VE frame x / alpha has noise sigma / alpha.
    np.testing.assert_allclose(p.ve_sigma(jnp.asarray(t)), s_ref / a_ref, rtol=2e-4)


@pytest.mark.parametrize("p", ALL, ids=repr)
def test_time_range(p):
    assert 0 <= p.t_min < p.t_max
    if isinstance(p, EDM):
        assert (p.t_min, p.t_max) == (p.sigma_min, p.sigma_max)
    else:
        assert p.t_max == 1.0 and p.t_min == p.eps


@pytest.mark.parametrize("p", ALL, ids=repr)
def test_inverse_maps_round_trip_including_edges(p):
    t = t_grid(p, 17)
    a_ref, s_ref = ref_alpha_sigma(p, t)
    scale = p.t_max - p.t_min
    # Inverses applied to values computed independently in float64.
    np.testing.assert_allclose(p.t_of_sigma(jnp.asarray(s_ref)), t, rtol=1e-4, atol=2e-4 * scale)
    np.testing.assert_allclose(
        p.t_of_log_snr(jnp.asarray(np.log(a_ref**2 / s_ref**2))), t, rtol=1e-4, atol=2e-4 * scale
    )
    np.testing.assert_allclose(
        p.t_of_ve_sigma(jnp.asarray(s_ref / a_ref)), t, rtol=1e-4, atol=2e-4 * scale
    )
    # And the other direction, through the process's own forward maps.
    tj = jnp.asarray(t, jnp.float32)
    np.testing.assert_allclose(p.t_of_sigma(p.sigma(tj)), t, rtol=1e-4, atol=2e-4 * scale)
    np.testing.assert_allclose(p.t_of_log_snr(p.log_snr(tj)), t, rtol=1e-4, atol=2e-4 * scale)
    np.testing.assert_allclose(p.t_of_ve_sigma(p.ve_sigma(tj)), t, rtol=1e-4, atol=2e-4 * scale)


@pytest.mark.parametrize("p", ALL, ids=repr)
def test_sde_coefficients_match_closed_forms(p):
    t = t_grid(p)
    f_ref, g2_ref = ref_sde(p, t)
    x = jnp.full((t.size, 3), 2.0)
    drift, g = p.sde(x, jnp.asarray(t))
    assert drift.shape == x.shape
    g = jnp.broadcast_to(g, x.shape)
    np.testing.assert_allclose(drift[:, 0] / 2.0, f_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g[:, 0] ** 2, g2_ref, rtol=5e-4)


@pytest.mark.parametrize("p", ALL, ids=repr)
def test_f_and_g2_match_closed_forms(p):
    t = t_grid(p)
    f_ref, g2_ref = ref_sde(p, t)
    f, g2 = p.f(jnp.asarray(t)), p.g2(jnp.asarray(t))
    assert f.shape == g2.shape == t.shape
    np.testing.assert_allclose(f, f_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g2, g2_ref, rtol=5e-4)
    # scalar t gives scalars
    assert p.g2(float(t[3])).shape == () and p.f(float(t[3])).shape == ()


@pytest.mark.parametrize("p", ALL, ids=repr)
def test_g2_is_the_marginal_identity_by_autodiff(p):
    """``g^2 = d sigma^2/dt - 2 (d log alpha/dt) sigma^2`` and ``f = d log alpha/dt``, the
    derivatives by ``jax.grad`` of the process's own alpha and sigma in float64 (an
    independent route to the hand-written ``f`` and ``g2``)."""
    with jax.enable_x64(True):
        t = jnp.asarray(t_grid(p, 7)[1:-1], jnp.float64)
        dlog_alpha = jax.vmap(jax.grad(lambda s: jnp.log(p.alpha(s))))(t)
        dsigma2 = jax.vmap(jax.grad(lambda s: p.sigma(s) ** 2))(t)
        g2_auto = dsigma2 - 2.0 * dlog_alpha * p.sigma(t) ** 2
        np.testing.assert_allclose(p.f(t), dlog_alpha, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(p.g2(t), g2_auto, rtol=1e-9)
        # and through the log-SNR: g^2 = -sigma^2 d log_snr / dt
        dlam = jax.vmap(jax.grad(p.log_snr))(t)
        np.testing.assert_allclose(p.g2(t), -(p.sigma(t) ** 2) * dlam, rtol=1e-9)


@pytest.mark.parametrize("p", ALL, ids=repr)
@pytest.mark.parametrize("v0", [0.0, 0.3, 2.0])
def test_sde_reproduces_marginal_mean_and_variance(p, v0):
    """d alpha/dt = f alpha and d var/dt = 2 f var + g^2 with var = alpha^2 v0 + sigma^2.

    The time derivatives come from jax.grad of alpha and sigma; f and g from ``sde``.
    """
    t = jnp.asarray(t_grid(p, 7)[1:-1], jnp.float32)

    def var(tt):
        return p.alpha(tt) ** 2 * v0 + p.sigma(tt) ** 2

    dvar = jax.vmap(jax.grad(var))(t)
    dalpha = jax.vmap(jax.grad(p.alpha))(t)
    ones = jnp.ones((t.size, 1))
    drift, g = p.sde(ones, t)
    f = drift[:, 0]
    g2 = jnp.broadcast_to(g, ones.shape)[:, 0] ** 2
    scale = np.max(np.abs(np.asarray(dvar))) + 1e-12
    np.testing.assert_allclose(dvar, 2 * f * var(t) + g2, rtol=2e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(dalpha, f * p.alpha(t), rtol=1e-4, atol=1e-7)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _euler_maruyama(p, x0, key, n_steps, t0, t1):
    ts = jnp.linspace(t0, t1, n_steps + 1)

    def step(x, inp):
        (ta, tb), k = inp
        drift, g = p.sde(x, ta)
        dt = tb - ta
        return x + drift * dt + g * jnp.sqrt(dt) * jax.random.normal(k, x.shape), None

    keys = jax.random.split(key, n_steps)
    x, _ = jax.lax.scan(step, x0, ((ts[:-1], ts[1:]), keys))
    return x


@pytest.mark.parametrize("p", [VP(), SubVP(beta_min=0.2, beta_max=5.0), VE()], ids=repr)
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_forward_sde_simulation_matches_alpha_sigma(p):
    """Monte-Carlo Euler-Maruyama from a fixed x0 at t=0: mean alpha(t) x0, std sigma(t)."""
    n = 40_000
    x = jnp.broadcast_to(jnp.asarray([1.5, -0.5]), (n, 2))
    for i, t1 in enumerate((0.5, 1.0)):  # 500 steps to t = 0.5, then 500 more to t = 1
        x = _euler_maruyama(p, x, jax.random.key(i), 500, t1 - 0.5, t1)
        a_ref, s_ref = ref_alpha_sigma(p, t1)
        mean, std = np.mean(np.asarray(x), 0), np.std(np.asarray(x), 0)
        np.testing.assert_allclose(mean, a_ref * np.array([1.5, -0.5]), atol=5 * s_ref / n**0.5)
        np.testing.assert_allclose(std, s_ref, rtol=0.02)


@pytest.mark.parametrize("p", ALL, ids=repr)
@pytest.mark.parametrize("data_shape", [(2,), (4, 4, 1)])
def test_marginal_sample_moments(p, data_shape):
    """Monte-Carlo moments of x_t = alpha x0 + sigma eps match the closed-form alpha, sigma."""
    n = 20_000
    t = 0.5 * (p.t_min + p.t_max)
    x0 = jnp.broadcast_to(
        jnp.linspace(-1, 1, math.prod(data_shape)).reshape(data_shape), (n, *data_shape)
    )
    eps = jax.random.normal(jax.random.key(1), x0.shape)
    x = np.asarray(p.marginal_sample(x0, t, eps)).reshape(n, -1)
    a_ref, s_ref = ref_alpha_sigma(p, t)
    x0f = np.asarray(x0[0]).reshape(-1)
    np.testing.assert_allclose(x.mean(0), a_ref * x0f, atol=5 * s_ref / n**0.5)
    np.testing.assert_allclose(x.std(0), s_ref, rtol=0.05)
    # VE frame: x / alpha = x0 + (sigma / alpha) eps, elementwise.
    np.testing.assert_allclose(
        x / a_ref,
        x0f + (s_ref / a_ref) * np.asarray(eps).reshape(n, -1),
        rtol=1e-4,
        atol=1e-4 * s_ref,
    )


@pytest.mark.parametrize("p", ALL, ids=repr)
def test_per_example_time(p):
    t = jnp.asarray(t_grid(p, 4), jnp.float32)
    x0 = jnp.ones((4, 3))
    eps = jnp.ones((4, 3))
    a_ref, s_ref = ref_alpha_sigma(p, np.asarray(t))
    np.testing.assert_allclose(
        p.marginal_sample(x0, t, eps), np.broadcast_to((a_ref + s_ref)[:, None], (4, 3)), rtol=2e-4
    )
    with pytest.raises(ValueError, match="shape"):
        p.marginal_sample(x0, t[:3], eps)
    with pytest.raises(ValueError, match="shape"):
        p.sde(x0, t[:, None])


@pytest.mark.parametrize("p", ALL, ids=repr)
@pytest.mark.parametrize("data_shape", [(3,), (4, 4, 1)])
def test_prior_logp_matches_scipy(p, data_shape):
    x = jax.random.normal(jax.random.key(2), (5, *data_shape)) * 1.7
    s = closed_forms.prior_std(p)
    assert p.prior_std() == s
    if isinstance(p, (VE, EDM)):
        assert s == ref_alpha_sigma(p, p.t_max)[1]
    ref = stats.norm.logpdf(np.asarray(x, np.float64), scale=s).reshape(5, -1).sum(-1)
    np.testing.assert_allclose(p.prior_logp(x), ref, rtol=1e-5)
    d = math.prod(data_shape)
    ref_mvn = stats.multivariate_normal(np.zeros(d), s**2 * np.eye(d)).logpdf(
        np.asarray(x, np.float64).reshape(5, -1)
    )
    np.testing.assert_allclose(p.prior_logp(x), ref_mvn, rtol=1e-5)


@pytest.mark.parametrize("p", [VE(), VP(), SubVP(), EDM()], ids=lambda p: type(p).__name__)
def test_prior_sample_has_the_prior_moments(p):
    """Draws of N(0, prior_std^2 I): mean 0 and std prior_std (closed form) within 5 SE."""
    n, d = 100_000, 3
    x = np.asarray(p.prior_sample(jax.random.key(0), (n, d)), np.float64)
    s = closed_forms.prior_std(p)
    assert x.shape == (n, d)
    np.testing.assert_allclose(x.mean(0), 0.0, atol=5 * s / np.sqrt(n))
    np.testing.assert_allclose(x.std(0), s, rtol=5 / np.sqrt(2 * n))


def test_vp_prior_is_close_to_marginal_at_t_max():
    p = VP()
    a, s = ref_alpha_sigma(p, 1.0)
    assert a < 7e-3 and abs(s - p.prior_std()) < 1e-4


@pytest.mark.parametrize(
    "cls, kwargs, field",
    [
        (VE, dict(sigma_min=0.0), "process.sigma_min"),
        (VE, dict(sigma_min=-1.0), "process.sigma_min"),
        (VE, dict(sigma_min=1.0, sigma_max=0.5), "process.sigma_max"),
        (VE, dict(eps=1.0), "process.eps"),
        (VE, dict(eps=-0.1), "process.eps"),
        (VE, dict(sigma_max=float("inf")), "process.sigma_max"),
        (VE, dict(sigma_min=float("nan")), "process.sigma_min"),
        (VE, dict(sigma_min="0.01"), "process.sigma_min"),
        (VP, dict(beta_min=0.0), "process.beta_min"),
        (VP, dict(beta_min=2.0, beta_max=1.0), "process.beta_max"),
        (VP, dict(eps=1.5), "process.eps"),
        (VP, dict(beta_max="20"), "process.beta_max"),
        (SubVP, dict(beta_min=-0.1), "process.beta_min"),
        (SubVP, dict(eps=-1e-3), "process.eps"),
        (EDM, dict(sigma_min=0.0), "process.sigma_min"),
        (EDM, dict(sigma_min=1.0, sigma_max=1.0), "process.sigma_max"),
        (EDM, dict(sigma_max=float("nan")), "process.sigma_max"),
    ],
)
def test_invalid_fields_raise_value_error_naming_the_field(cls, kwargs, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        cls(**kwargs)


def test_replace_validates_again():
    with pytest.raises(ValueError, match="process.sigma_min"):
        VE().replace(sigma_min=-1.0)
    assert VE().replace(sigma_max=20.0).sigma_max == 20.0


def test_registry_names():
    assert PROCESSES == {"ve": VE, "vp": VP, "subvp": SubVP, "edm": EDM}


@pytest.mark.parametrize("p", ALL, ids=repr)
def test_processes_pass_through_jit(p):
    @jax.jit
    def f(proc, t, x):
        drift, g = proc.sde(x, t)
        return proc.sigma(t), proc.log_snr(t), proc.t_of_sigma(proc.sigma(t)), drift + g

    t = jnp.asarray(t_grid(p, 3), jnp.float32)
    x = jnp.ones((3, 2))
    out = f(p, t, x)
    np.testing.assert_allclose(out[0], ref_alpha_sigma(p, np.asarray(t))[1], rtol=2e-4)
    # Equal processes are equal and hash alike (one compilation), different ones differ.
    assert p == p.replace() and hash(p) == hash(p.replace())
    assert jax.tree_util.tree_leaves(p) == []


def test_ornstein_uhlenbeck_is_the_ou_process_in_rescaled_time():
    """dx = -x ds + sqrt(2) dB at OU time s = T t: alpha = e^{-s}, sigma^2 = 1 - e^{-2s}, and
    per unit of process time f = -T, g^2 = 2 T (written from the OU process, not from VP)."""
    from scorelib.processes import ornstein_uhlenbeck

    T = 2.5
    p = ornstein_uhlenbeck(T, eps=0.01)
    assert isinstance(p, VP) and (p.t_min, p.t_max) == (0.01, 1.0)
    t = np.array([0.01, 0.2, 0.7, 1.0])
    with jax.enable_x64(True):
        tt = jnp.asarray(t, jnp.float64)
        np.testing.assert_allclose(np.asarray(p.alpha(tt)), np.exp(-T * t), rtol=1e-12)
        np.testing.assert_allclose(
            np.asarray(p.sigma(tt)), np.sqrt(1 - np.exp(-2 * T * t)), rtol=1e-12
        )
        np.testing.assert_allclose(np.asarray(p.f(tt)), -T, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(p.g2(tt)), 2 * T, rtol=1e-12)
    with pytest.raises(ValueError, match="^process.horizon must be"):
        ornstein_uhlenbeck(-1.0)
