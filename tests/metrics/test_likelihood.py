"""PF-ODE likelihood and bits/dim: the Gaussian closed form, Hutchinson's mean and variance,
dequantisation, range invariance, determinism."""

import contextlib
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from closed_forms import alpha_sigma
from scipy.stats import multivariate_normal

from scorelib.data.images import quantise
from scorelib.metrics.likelihood import (
    bits_per_dim,
    dequantise,
    exact_divergence,
    hutchinson_divergence,
    level_spacing,
    pf_ode_log_likelihood,
    probe_vectors,
)
from scorelib.processes import EDM, VE, VP, SubVP
from scorelib.scores.gaussian import GaussianScore

D = 4


@pytest.fixture(scope="module")
def gaussian():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(D, D)) * 0.4
    cov = a @ a.T + 0.05 * np.eye(D)
    mu = rng.normal(size=D) * 0.5
    x = rng.multivariate_normal(mu, cov, 6).astype(np.float32)
    return mu, cov, x


def _marginal_logp(process, mu, cov, t):
    """The exact log-density (a jnp function) of N(mu, cov) data noised to time t."""
    a, s = alpha_sigma(process, t)
    c = a**2 * cov + s**2 * np.eye(len(mu))
    ci = jnp.asarray(np.linalg.inv(c), jnp.float32)
    const = -0.5 * float(np.linalg.slogdet(c)[1]) - 0.5 * len(mu) * math.log(2 * math.pi)
    m = jnp.asarray(a * mu, jnp.float32)

    def logp(z):
        r = jnp.reshape(z, (z.shape[0], -1)) - m
        return const - 0.5 * jnp.einsum("bi,ij,bj->b", r, ci, r)

    return logp


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "process",
    [
        EDM(),
        pytest.param(VP(), marks=SLOW),
        pytest.param(VE(), marks=SLOW),
        pytest.param(SubVP(), marks=SLOW),
    ],
    ids=lambda p: type(p).__name__,
)
def test_gaussian_closed_form(gaussian, process):
    # log p_{t_min}(x) of N(mu, cov) data: N(alpha mu, alpha^2 cov + sigma^2 I) at t_min
    mu, cov, x = gaussian
    source = GaussianScore.from_covariance(process, mu, cov)
    a, s = alpha_sigma(process, process.t_min)
    ref = multivariate_normal(a * mu, a**2 * cov + s**2 * np.eye(D)).logpdf(x)
    prior = _marginal_logp(process, mu, cov, process.t_max)  # the exact marginal at t_max
    logp, info = pf_ode_log_likelihood(
        source, x, jax.random.key(0), divergence="exact", prior_logp=prior
    )
    np.testing.assert_allclose(np.asarray(logp), ref, atol=1e-3 * D)
    assert np.all(np.asarray(info["num_steps"]) > 3)  # adaptive, not one step
    # with the process's own prior, the error is exactly the prior's mismatch at t_max
    logp_default, info_default = pf_ode_log_likelihood(
        source, x, jax.random.key(0), divergence="exact"
    )
    x_T_gap = np.asarray(info_default["prior_logp"]) - np.asarray(info["prior_logp"])
    np.testing.assert_allclose(np.asarray(logp_default) - np.asarray(logp), x_T_gap, atol=1e-4)


def test_hutchinson_mean_and_variance_against_closed_form():
    rng = np.random.default_rng(1)
    d = 6
    a = rng.normal(size=(d, d))
    sym = 0.5 * (a + a.T)
    var_one = {  # variance of one probe of eps^T A eps
        "rademacher": sum((a[i, j] + a[j, i]) ** 2 for i in range(d) for j in range(i + 1, d)),
        "gaussian": 2.0 * np.sum(sym**2),
    }
    aj = jnp.asarray(a, jnp.float32)
    fn = lambda z: aj @ z + 0.0 * jnp.sin(z)  # noqa: E731  (linear: J = A everywhere)
    x = jnp.ones(d)
    n = 4000
    cases = [(noise, probes) for noise in ("rademacher", "gaussian") for probes in (1, 4)]

    def one(k, probes, noise):
        return hutchinson_divergence(fn, x, probe_vectors(k, probes, d, noise))

    @jax.jit
    def estimates(keys):  # every case in one compiled call (eager vmaps compile op by op)
        ests = [jax.vmap(lambda k, p=p, nz=nz: one(k, p, nz))(keys) for nz, p in cases]
        return exact_divergence(fn, x), ests

    exact, ests = estimates(jax.random.split(jax.random.key(0), n))
    assert float(exact) == pytest.approx(np.trace(a), rel=1e-5)
    for (noise, probes), est in zip(cases, ests, strict=True):
        est = np.asarray(est, np.float64)
        assert abs(est.mean() - np.trace(a)) < 3 * est.std() / math.sqrt(n), (noise, probes)
        # averaged, not summed: the variance falls as 1 / probes
        assert est.var() == pytest.approx(var_one[noise] / probes, rel=0.12), (noise, probes)


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_hutchinson_likelihood_is_unbiased(gaussian):
    mu, cov, x = gaussian
    source = GaussianScore.from_covariance(EDM(), mu, cov)
    # the whole fixture batch: the solve test_gaussian_closed_form[EDM] compiled
    exact, _ = pf_ode_log_likelihood(source, x, jax.random.key(0), divergence="exact")
    many = np.repeat(x[:1], 64, axis=0)  # each copy draws its own probes (fold_in)
    est1, _ = pf_ode_log_likelihood(source, many, jax.random.key(1), probes=1, noise="gaussian")
    est4, _ = pf_ode_log_likelihood(source, many, jax.random.key(1), probes=4, noise="gaussian")
    for est in (np.asarray(est1), np.asarray(est4)):
        assert abs(est.mean() - float(exact[0])) < 3 * est.std() / 8 + 1e-3
    # the probes are averaged: four of them have a quarter of one probe's variance
    assert 0.12 < np.var(np.asarray(est4)) / np.var(np.asarray(est1)) < 0.5


def _edm_standard_normal_logp(sigma: float):
    """``log N(z; 0, (1 + sigma^2) I)`` of N(0, I) data noised by EDM to ``sigma`` (jnp)."""

    def logp(z):
        v = 1.0 + sigma**2
        z = jnp.reshape(z, (z.shape[0], -1))
        return -0.5 * jnp.sum(z**2, axis=1) / v - 0.5 * z.shape[1] * jnp.log(2 * jnp.pi * v)

    return logp


@pytest.mark.parametrize("precision", ["float32", "x64"])
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_hutchinson_likelihood_and_bits_per_dim_in_float32_and_under_x64(precision):
    # The inputs: under x64, GaussianScore.from_covariance(EDM(), mean=[0, 0],
    # cov=I) and x = zeros((1, 2)) failed in jax.jvp (float32 probes against the float64
    # state of the ODE), as did bits_per_dim by default; divergence='exact' worked.
    # N(0, I) data: the drift's Jacobian is c(t) I, so a Rademacher probe's estimate
    # eps^T c I eps = c d is the exact divergence, and log p_{t_min} has a closed form.
    scope = jax.enable_x64(True) if precision == "x64" else contextlib.nullcontext()
    with scope:
        p = EDM()
        g = GaussianScore.from_covariance(p, mean=[0.0, 0.0], cov=np.eye(2))
        key = jax.random.key(0)
        # the point, another, and 46 more: 48 examples, the batch of the exact solve
        # test_bits_per_dim_of_discrete_data_closed_form_and_nonnegative compiles (float32)
        x = np.concatenate(
            [[[0.0, 0.0], [0.5, -1.0]], np.random.default_rng(8).normal(size=(46, 2))]
        )
        prior = _edm_standard_normal_logp(p.t_max)  # the exact marginal at t_max
        logp, _ = pf_ode_log_likelihood(g, x, key, prior_logp=prior)
        exact, _ = pf_ode_log_likelihood(g, x, key, divergence="exact", prior_logp=prior)
        want_dtype = jnp.float64 if precision == "x64" else jnp.float32
        assert logp.dtype == want_dtype and exact.dtype == want_dtype
        np.testing.assert_allclose(np.asarray(logp), np.asarray(exact), rtol=1e-5)
        ref = np.asarray(_edm_standard_normal_logp(p.t_min)(jnp.asarray(x)), np.float64)
        np.testing.assert_allclose(np.asarray(logp), ref, atol=2e-4)
        # bits/dim by default (Hutchinson): against the closed form at the dequantised points
        # (48 examples, as above: the same compiled solve)
        levels = 17
        bpd, info = bits_per_dim(g, np.zeros((48, 2)), key, levels=levels, prior_logp=prior)
        assert bpd.dtype == want_dtype
        y = dequantise(np.zeros((48, 2)), jax.random.split(key)[0], levels=levels)
        nll = -np.asarray(_edm_standard_normal_logp(p.t_min)(jnp.asarray(y)), np.float64)
        ref_bpd = (nll / 2 - math.log(level_spacing(levels))) / math.log(2)
        np.testing.assert_allclose(np.asarray(bpd, np.float64), ref_bpd, rtol=0, atol=2e-4)


def _single_level(levels, low, high, n=48, d=2):
    """Data on one level ``c`` and the Gaussian N(c, delta^2/12 I) that fits its dequantised
    version; the closed-form bits/dim of that model through EDM's PF-ODE."""
    delta = (high - low) / (levels - 1)
    c = low + (levels // 3) * delta
    x = quantise(np.full((n, d), c), levels, low=low, high=high)
    v = delta**2 / 12
    process = EDM(sigma_min=0.002 * (high - low) / 2, sigma_max=80.0 * (high - low) / 2)
    source = GaussianScore.from_covariance(process, np.full(d, c), v * np.eye(d))
    s2 = process.sigma_min**2
    # E_u[-log N(u delta; 0, v + s^2)] - log delta, per dimension, in bits
    nats = 0.5 * math.log(2 * math.pi * (v + s2)) + 0.5 * v / (v + s2) - math.log(delta)
    return source, x, nats / math.log(2)


@pytest.mark.parametrize("levels", [17, pytest.param(256, marks=SLOW)])
def test_bits_per_dim_of_discrete_data_closed_form_and_nonnegative(levels):
    source, x, ref = _single_level(levels, -1.0, 1.0)
    bpd, info = bits_per_dim(source, x, jax.random.key(0), levels=levels, divergence="exact")
    bpd = np.asarray(bpd)
    assert ref > 0 and bpd.mean() >= 0
    assert abs(bpd.mean() - ref) < 3 * bpd.std() / math.sqrt(len(bpd)) + 1e-3, (bpd.mean(), ref)
    assert info["offset"] == pytest.approx(-math.log2(2.0 / (levels - 1)))


def test_same_bits_per_dim_in_zero_one_and_minus_one_one(gaussian):
    # 8-bit data; the same Gaussian model written for [-1, 1] and for [0, 1] = (x + 1) / 2:
    # EDM with sigma halved, and the prior moved with the data (the exact marginal at t_max;
    # N(0, sigma_max^2) in both ranges would be two different models)
    mu, cov, _ = gaussian
    mu, cov = mu * 0.3, cov * 0.1
    rng = np.random.default_rng(3)
    # 6 examples at the default tolerances: the [-1, 1] solve is the one
    # test_gaussian_closed_form[EDM] compiled
    x = quantise(rng.multivariate_normal(mu, cov, 6), 256)
    wide, unit = EDM(), EDM(sigma_min=0.001, sigma_max=40.0)
    key = jax.random.key(5)
    opts = dict(levels=256, divergence="exact")
    bpd_w, info_w = bits_per_dim(
        GaussianScore.from_covariance(wide, mu, cov),
        x,
        key,
        prior_logp=_marginal_logp(wide, mu, cov, wide.t_max),
        **opts,
    )
    bpd_u, info_u = bits_per_dim(
        GaussianScore.from_covariance(unit, (mu + 1) / 2, cov / 4),
        (x + 1) / 2,
        key,
        low=0.0,
        high=1.0,
        prior_logp=_marginal_logp(unit, (mu + 1) / 2, cov / 4, unit.t_max),
        **opts,
    )
    np.testing.assert_allclose(np.asarray(bpd_u), np.asarray(bpd_w), atol=1e-3)
    # the log-density term moves by exactly one bit/dim, the offset by exactly -1
    assert info_u["offset"] - info_w["offset"] == pytest.approx(1.0, abs=1e-12)
    dens_w = np.asarray(info_w["nll"]) / (D * math.log(2))
    dens_u = np.asarray(info_u["nll"]) / (D * math.log(2))
    np.testing.assert_allclose(dens_w - dens_u, 1.0, atol=1e-3)


def test_same_key_same_number(gaussian):
    mu, cov, _ = gaussian
    source = GaussianScore.from_covariance(VP(), mu, cov)
    x = quantise(np.random.default_rng(4).multivariate_normal(mu, cov, 4), 17)
    opts = dict(levels=17, rtol=1e-4, atol=1e-4)  # as the chunking test's: one solve
    first = bits_per_dim(source, x, jax.random.key(2), **opts)[0]
    again = bits_per_dim(source, x, jax.random.key(2), **opts)[0]
    other = bits_per_dim(source, x, jax.random.key(3), **opts)[0]
    np.testing.assert_array_equal(np.asarray(first), np.asarray(again))
    assert not np.array_equal(np.asarray(first), np.asarray(other))


def test_dequantise_stays_in_its_bin():
    x = quantise(np.random.default_rng(5).uniform(-1, 1, (50, 3, 3, 1)), 17)
    y = np.asarray(dequantise(x, jax.random.key(0), levels=17))
    delta = level_spacing(17)
    assert delta == 0.125
    assert np.all(np.abs(y - x) <= delta / 2) and np.std(y - x) > delta / 4
    np.testing.assert_array_equal(quantise(y, 17), x)
    assert level_spacing(256, 0.0, 1.0) == 1 / 255


def test_errors(gaussian):
    mu, cov, x = gaussian
    source = GaussianScore.from_covariance(EDM(), mu, cov)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="divergence must be one of"):
        pf_ode_log_likelihood(source, x, key, divergence="trace")
    with pytest.raises(ValueError, match="options of divergence='hutchinson'"):
        pf_ode_log_likelihood(source, x, key, divergence="exact", probes=4)
    with pytest.raises(ValueError, match="probes must be an integer >= 1"):
        pf_ode_log_likelihood(source, x, key, probes=0)
    with pytest.raises(ValueError, match="noise must be one of"):
        pf_ode_log_likelihood(source, x, key, noise="uniform")
    with pytest.raises(ValueError, match="rtol must be"):
        pf_ode_log_likelihood(source, x, key, rtol=0.0)
    with pytest.raises(ValueError, match="must lie on the 17 levels"):
        bits_per_dim(source, x, key, levels=17)  # continuous data
    with pytest.raises(ValueError, match="must lie on the 256 levels"):
        dequantise(np.array([[0.125, 1.0]]), key, levels=256)  # digits' levels read as 8-bit
    shape = re.escape(f"x must have shape [batch, {D}] (the data_shape of the GaussianScore)")
    with pytest.raises(ValueError, match=shape + re.escape("; got shape (6, 2)")):
        pf_ode_log_likelihood(source, x[:, :2], key)
    with pytest.raises(ValueError, match=shape + re.escape(f"; got shape ({D},)")):
        pf_ode_log_likelihood(source, x[0], key)
    with pytest.raises(ValueError, match=r"^x must be a real .* complex"):
        pf_ode_log_likelihood(source, x.astype(complex), key)
    with pytest.raises(ValueError, match=r"^source must be a scorelib ScoreSource"):
        pf_ode_log_likelihood(lambda x, t: x, x, key)
    with pytest.raises(ValueError, match=r"^x must have shape \[batch, \*data_shape\]"):
        dequantise(np.zeros(4), key, levels=17)


def test_an_examples_number_does_not_depend_on_its_batch(gaussian):
    """Chunks evaluated with ``first_index`` at their offsets give each example the probes
    and dequantisation noise it gets in the whole batch; the same chunk at offset 0 does not
    (it reuses the first examples' keys)."""
    mu, cov, _ = gaussian
    source = GaussianScore.from_covariance(VP(), mu, cov)
    x = quantise(np.random.default_rng(6).multivariate_normal(mu, cov, 4), 17)
    key = jax.random.key(7)
    opts = dict(levels=17, rtol=1e-4, atol=1e-4)  # two compiled solves: 4 and 2
    whole = np.asarray(bits_per_dim(source, x, key, **opts)[0])
    parts = [
        np.asarray(bits_per_dim(source, x[a:b], key, first_index=a, **opts)[0])
        for a, b in ((0, 2), (2, 4))
    ]
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=0, atol=1e-5)
    at_zero = np.asarray(bits_per_dim(source, x[2:4], key, **opts)[0])
    assert np.max(np.abs(at_zero - whole[2:4])) > 1e-3
    with pytest.raises(ValueError, match="first_index"):
        bits_per_dim(source, x, key, levels=17, first_index=-1)
