"""Targets with a known score: densities, scores and exact samplers against independent
computations (scipy quadrature, jax.grad, closed-form moments, KS tests)."""

import math

import closed_forms
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from scorelib.data.targets import (
    EnergyTarget,
    GaussianMixtureTarget,
    ManyWellTarget,
    gmm_1d,
    make_target,
    random_gaussian_mixture,
)
from scorelib.processes import EDM, VP
from scorelib.scores import MixtureScore

# ---------------------------------------------------------------- Gaussian mixtures


def test_gmm_1d_log_prob_is_normalised_and_score_is_its_gradient():
    t = gmm_1d()
    x = np.linspace(-8, 10, 20001)
    xs = jnp.linspace(-4, 5, 37)[:, None]

    @jax.jit
    def run(grid, xs):  # one compiled call (eager ops compile one by one)
        auto = jax.grad(lambda z: jnp.sum(t.log_prob(z)))(xs)
        return t.log_prob(grid), t.score(xs), auto

    log_p, score, auto = run(jnp.asarray(x[:, None], jnp.float32), xs)
    p = np.exp(np.asarray(log_p, np.float64))
    assert abs(np.trapezoid(p, x) - 1.0) < 1e-5
    # closed-form score vs autodiff of log_prob
    np.testing.assert_allclose(score, auto, rtol=1e-4, atol=1e-4)
    # against scipy's mixture pdf, independently written
    ref = sum(
        w * stats.norm.pdf(x, m, s) for w, m, s in [(0.3, -2, 0.4), (0.4, 0, 0.2), (0.3, 2.5, 0.6)]
    )
    np.testing.assert_allclose(p, ref, rtol=2e-5, atol=1e-30)


def test_gmm_full_cov_2d_normalised_and_matches_mixture_score_at_tiny_noise():
    t = random_gaussian_mixture(2, 3, seed=1, mean_scale=1.5)
    g = np.linspace(-9, 9, 361)
    xx, yy = np.meshgrid(g, g, indexing="ij")
    pts = jnp.asarray(np.stack([xx.ravel(), yy.ravel()], -1), jnp.float32)
    src = MixtureScore.create(EDM(sigma_min=1e-5), t.weights, t.means, t.covs)

    @jax.jit
    def run(pts):  # one compiled call (eager ops compile one by one)
        x = t.sample(jax.random.key(0), 64)
        auto = jax.grad(lambda z: jnp.sum(t.log_prob(z)))(x)
        return t.log_prob(pts), t.score(x), auto, src.score(x, jnp.full((64,), 1e-4))

    log_p, score, auto, noisy = run(pts)
    p = np.exp(np.asarray(log_p, np.float64)).reshape(xx.shape)
    assert abs(np.trapezoid(np.trapezoid(p, g, axis=1), g) - 1.0) < 1e-4
    np.testing.assert_allclose(score, auto, rtol=1e-4, atol=1e-3)
    # the library's noisy mixture score at sigma = 1e-4 is the clean score up to O(sigma^2)
    np.testing.assert_allclose(score, noisy, rtol=1e-3, atol=1e-3)


def test_gmm_samples_match_mixture_moments():
    t = random_gaussian_mixture(3, 4, seed=2)
    n = 40000
    x = np.asarray(t.sample(jax.random.key(3), n), np.float64)
    mu, cov = t.mean, t.covariance
    se_mu = np.sqrt(np.diag(cov) / n)
    assert np.all(np.abs(x.mean(0) - mu) < 4.5 * se_mu)
    # second moments: SE of each entry of the sample covariance from the sample itself
    c = x - mu
    prods = c[:, :, None] * c[:, None, :]
    se_cov = prods.std(0) / np.sqrt(n)
    assert np.all(np.abs(prods.mean(0) - cov) < 4.5 * se_cov)
    assert abs(t.sigma_data - np.sqrt(np.trace(cov) / 3)) < 1e-12


def test_sample_is_prefix_stable_and_batch_is_deterministic():
    t = random_gaussian_mixture(4, 2, seed=0)
    a = t.sample(jax.random.key(5), 7)
    b = t.sample(jax.random.key(5), 12)
    np.testing.assert_array_equal(a, b[:7])
    np.testing.assert_array_equal(t.batch(8, seed=1, step=3), t.batch(8, seed=1, step=3))
    assert not np.array_equal(t.batch(8, seed=1, step=3), t.batch(8, seed=1, step=4))


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_fisher_scale_of_a_gaussian_is_closed_form():
    """N(m, C): E ||C^{-1}(x - m)||^2 = tr C^{-1}, so fisher_scale = sqrt(d / tr C^{-1});
    for C = s^2 I it is s = sigma_data."""
    c = np.diag([0.25, 1.0, 4.0])
    t = GaussianMixtureTarget.create([1.0], [[1.0, -2.0, 0.5]], [c])
    ref = math.sqrt(3 / np.trace(np.linalg.inv(c)))
    # Monte Carlo: sum_i z_i^2 / c_ii over 65,536 draws, relative sd ~ 0.3%
    assert abs(t.fisher_scale() - ref) < 0.01 * ref, (t.fisher_scale(), ref)
    iso = GaussianMixtureTarget.create([1.0], [[0.0, 0.0]], [0.49 * np.eye(2)])
    assert abs(iso.fisher_scale() - 0.7) < 0.01 * 0.7
    assert abs(iso.sigma_data - 0.7) < 1e-6


def test_fisher_scale_of_a_mixture_against_quadrature():
    """1-D mixture: J_0 = int p'(x)^2 / p(x) dx by scipy quadrature; narrow modes make
    fisher_scale much smaller than sigma_data (Cramér-Rao: never larger)."""
    t = gmm_1d()
    w, m, sd = (
        np.asarray(t.weights),
        np.asarray(t.means)[:, 0],
        np.sqrt(np.asarray(t.covs)[:, 0, 0]),
    )

    def p_and_dp(x):
        comp = w * stats.norm.pdf(x, m, sd)
        return comp.sum(), (comp * -(x - m) / sd**2).sum()

    j0 = integrate.quad(lambda x: p_and_dp(x)[1] ** 2 / p_and_dp(x)[0], -10, 12, limit=400)[0]
    ref = math.sqrt(1.0 / j0)
    got = t.fisher_scale()
    assert abs(got - ref) < 0.02 * ref, (got, ref)
    assert got < 0.2 * t.sigma_data


def test_gmm_validation_names_fields():
    with pytest.raises(ValueError, match="target.weights"):
        GaussianMixtureTarget.create([1.0, -1.0], [[0.0], [1.0]], stds=[1.0, 1.0])
    with pytest.raises(ValueError, match="target.covs"):
        GaussianMixtureTarget.create([1.0], [[0.0, 0.0]], [[[1.0, 2.0], [2.0, 1.0]]])
    with pytest.raises(ValueError, match="target.covs must be of shape"):
        GaussianMixtureTarget.create([1.0], [[0.0, 0.0]], [[[1.0]]])
    with pytest.raises(ValueError, match="exactly one"):
        GaussianMixtureTarget.create([1.0], [[0.0]])
    with pytest.raises(ValueError, match="target.kind"):
        make_target("funnel")
    with pytest.raises(ValueError, match=r"shape \[batch, 1\]"):
        gmm_1d().log_prob(jnp.zeros((3, 2)))


# ---------------------------------------------------------------------- many-well


def _well_pdf_unnorm(x):
    return math.exp(-(x**4) + 6 * x**2 + 0.5 * x)


def test_manywell_normaliser_and_log_prob_against_scipy_quad():
    m = ManyWellTarget.create(2)
    z, _ = integrate.quad(_well_pdf_unnorm, -np.inf, np.inf, epsabs=0, epsrel=1e-12, limit=200)
    assert abs(m.log_z1 - math.log(z)) < 1e-9
    x = jnp.asarray([[1.7, 0.3], [-1.5, -2.0], [0.0, 0.0]], jnp.float32)
    ref = [
        math.log(_well_pdf_unnorm(float(a)) / z) + stats.norm.logpdf(float(b))
        for a, b in np.asarray(x)
    ]
    np.testing.assert_allclose(m.log_prob(x), ref, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize(
    "dim,pairs", [(8, True), (32, True), pytest.param(3, False, marks=pytest.mark.slow)]
)
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_manywell_score_is_grad_and_matches_closed_form(dim, pairs):
    m = ManyWellTarget.create(dim, gaussian_pairs=pairs)
    x = m.sample(jax.random.key(0), 16)
    assert x.shape == (16, dim)
    s = m.score(x)  # jax.grad of log_prob
    ref = np.where(m.well_mask, -4 * x**3 + 12 * x + 0.5, -x)
    np.testing.assert_allclose(s, ref, rtol=1e-5, atol=1e-4)


def test_manywell_samples_pass_ks_against_quadrature_cdf():
    m = ManyWellTarget.create(8)
    x = np.asarray(m.sample(jax.random.key(11), 5000), np.float64)
    z, _ = integrate.quad(_well_pdf_unnorm, -np.inf, np.inf, epsrel=1e-12, limit=200)

    # independent CDF by scipy quad, tabulated then interpolated
    grid = np.linspace(-3.6, 3.6, 1441)
    pdf = np.array([_well_pdf_unnorm(g) for g in grid]) / z
    cdf_tab = np.concatenate([[0.0], integrate.cumulative_trapezoid(pdf, grid)])

    def cdf(v):
        return np.interp(v, grid, cdf_tab)

    wells = x[:, m.well_mask].ravel()  # 4 independent double-well coordinates per sample
    gauss = x[:, ~m.well_mask].ravel()
    assert stats.kstest(wells, cdf).pvalue > 1e-3
    assert stats.kstest(gauss, "norm").pvalue > 1e-3
    # the heavier (right) well: mass from quadrature vs sample frequency
    p_right = integrate.quad(_well_pdf_unnorm, 0, np.inf, epsrel=1e-12)[0] / z
    n = wells.size
    assert abs((wells > 0).mean() - p_right) < 4.5 * math.sqrt(p_right * (1 - p_right) / n)
    assert abs(m.sigma_data**2 - (m.well_var + 1.0) / 2) < 1e-12


def test_manywell_validation():
    with pytest.raises(ValueError, match="target.dim must be even"):
        ManyWellTarget.create(7)
    with pytest.raises(ValueError, match="target.a"):
        ManyWellTarget.create(8, a=0.0)


@pytest.mark.parametrize(
    "process", [EDM(sigma_min=1e-4), pytest.param(VP(), marks=pytest.mark.slow)], ids=["edm", "vp"]
)
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_manywell_noisy_score_against_scipy_convolution(process):
    """The quadrature noisy score vs a finite difference of log p_t by scipy quad (float64)."""
    m = ManyWellTarget.create(2)
    src = m.noisy_score(process)
    z = math.exp(m.log_z1)
    for ve_sigma in (0.02, 0.05, 0.3, 2.0):
        t = float(closed_forms.t_of_ve_sigma(process, ve_sigma))
        a, sig = (float(v) for v in closed_forms.alpha_sigma(process, t))

        def p_t(y, a=a, sig=sig):
            f = lambda x0: _well_pdf_unnorm(x0) / z * stats.norm.pdf(y, a * x0, sig)
            c = y / a
            pts = sorted({-1.7, 1.7, max(min(c, 3.5), -3.5)})
            return integrate.quad(f, -4.5, 4.5, points=pts, epsabs=0, epsrel=1e-11, limit=500)[0]

        ys = [a * 1.6, a * -0.4, a * 2.3]
        h = 1e-3 * sig
        ref = [(math.log(p_t(y + h)) - math.log(p_t(y - h))) / (2 * h) for y in ys]
        x = jnp.asarray([[y, y] for y in ys], jnp.float32)
        got = np.asarray(src.score(x, jnp.full((3,), t, jnp.float32)))
        np.testing.assert_allclose(got[:, 0], ref, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(got[:, 1], -np.asarray(ys) / (a**2 + sig**2), rtol=1e-5)


def test_manywell_noisy_score_rules_agree_in_overlap():
    m = ManyWellTarget.create(2)
    src = m.noisy_score(EDM(sigma_min=1e-4))
    y = jnp.linspace(-2.5, 2.5, 41)[:, None]
    rules = jax.jit(lambda y, sv: (src._well_score_gh(y, sv), src._well_score_grid(y, sv)))
    for s in (0.03, 0.05, 0.08):  # one compilation for the three
        gh, grid = rules(y, jnp.full(y.shape, s))
        np.testing.assert_allclose(gh, grid, rtol=1e-4, atol=1e-3)


# --------------------------------------------------------- targets without samples


def test_target_without_exact_sampler_fails_with_a_clear_message():
    t = EnergyTarget(dim=2, energy=lambda x: 0.5 * jnp.sum(x**4, -1), name="quartic")
    assert not t.has_exact_sampler and not t.normalised
    x = jnp.asarray([[1.0, -2.0]])
    np.testing.assert_allclose(t.score(x), -2.0 * x**3)
    with pytest.raises(ValueError, match=r"'quartic'.*energy distance needs exact samples"):
        t.sample(jax.random.key(0), 10, needed_by="energy distance")
    with pytest.raises(ValueError, match="quartic.*training needs exact samples"):
        t.batch(4, seed=0, step=0)
    assert gmm_1d().has_exact_sampler and ManyWellTarget.create(2).has_exact_sampler


def test_targets_are_static_and_jittable():
    t = ManyWellTarget.create(4)
    f = jax.jit(lambda tgt, x: tgt.score(x))
    x = jnp.ones((2, 4))
    np.testing.assert_allclose(f(t, x), t.score(x), rtol=1e-6)
    assert hash(t) == hash(t) and t == t and t != ManyWellTarget.create(4)
