"""Gaussian and Gaussian-mixture score sources against independent computations.

References: for x_0 ~ N(mu, Sigma), x_t ~ N(alpha mu, alpha^2 Sigma + sigma^2 I); the
score is checked against jax.grad of that log-density written here with slogdet/solve,
and the denoiser against the textbook posterior mean (Wang & Vastola 2024, eq. 5).
"""

import math

import closed_forms
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from scorelib.processes import EDM, VE, VP, SubVP
from scorelib.scores import GaussianScore, MixtureScore, ScoreSource

PROCESSES = [VE(), VP(), SubVP(), EDM(), VP(beta_min=0.5, beta_max=8.0)]


def times(p):
    """Three times spread over the process range (log-spaced for EDM)."""
    if isinstance(p, EDM):
        return [0.05, 1.0, 20.0]
    return [p.t_min + f * (p.t_max - p.t_min) for f in (0.05, 0.4, 0.9)]


def ref_alpha_sigma(p, t):
    """Closed-form alpha, sigma (float64 scalars), independent of the library."""
    a, s = closed_forms.alpha_sigma(p, t)
    return float(a), float(s)


def random_cov(rng, d, scale=1.0):
    a = rng.normal(size=(d, d)) * scale
    return a @ a.T / d + 0.05 * np.eye(d)


def gauss_logpdf(x, mean, cov):
    """Explicit log N(x; mean, cov) for one x: [d]; jnp so jax.grad can differentiate it."""
    d = mean.shape[0]
    diff = x - mean
    _, logdet = jnp.linalg.slogdet(cov)
    return -0.5 * (diff @ jnp.linalg.solve(cov, diff) + logdet + d * jnp.log(2 * jnp.pi))


# jit-compiled wrappers: one compilation per (source type, process, shape), not per op.
score_fn = jax.jit(lambda src, x, t: src.score(x, t))
denoiser_fn = jax.jit(lambda src, x, t: src.denoiser(x, t))
log_prob_fn = jax.jit(lambda src, x, t: src.log_prob(x, t))


@jax.jit
def _grad_gauss(x_flat, m, c):
    return jax.vmap(jax.grad(lambda xx: gauss_logpdf(xx, m, c)))(x_flat)


def convolved_gauss_score(x_flat, t, p, mean, cov):
    """jax.grad of log N(x; alpha mu, alpha^2 Sigma + sigma^2 I), per row of ``x_flat``."""
    a, s = ref_alpha_sigma(p, t)
    c = jnp.asarray(a**2 * cov + s**2 * np.eye(mean.size), jnp.float32)
    return _grad_gauss(x_flat, jnp.asarray(a * mean, jnp.float32), c)


def _mixture_logpdf(x, log_w, m, c):
    comps = jax.vmap(lambda mk, ck: gauss_logpdf(x, mk, ck))(m, c)
    return jax.nn.logsumexp(log_w + comps)


@jax.jit
def _grad_mixture(x_flat, log_w, m, c):
    return jax.vmap(jax.grad(lambda xx: _mixture_logpdf(xx, log_w, m, c)))(x_flat)


def convolved_mixture_score(x_flat, t, p, w, means, covs):
    """jax.grad of log sum_k w_k N(x; alpha m_k, alpha^2 C_k + sigma^2 I), per row."""
    a, s = ref_alpha_sigma(p, t)
    c = a**2 * covs + s**2 * np.eye(means.shape[1])[None]
    f32 = lambda v: jnp.asarray(v, jnp.float32)
    return _grad_mixture(x_flat, f32(np.log(w)), f32(a * means), f32(c))


def assert_close_rel(actual, expected, rtol):
    """Max-norm relative error over the whole array (robust to tiny components)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    err = np.max(np.abs(actual - expected)) / np.max(np.abs(expected))
    assert err < rtol, f"relative error {err:.3g} >= {rtol}"


CASES = [(p, (3,)) for p in PROCESSES] + [(VP(), (4, 4, 1)), (EDM(), (4, 4, 1))]


@pytest.mark.parametrize("p, data_shape", CASES, ids=repr)
def test_gaussian_score_equals_grad_of_convolved_log_density(p, data_shape):
    rng = np.random.default_rng(0)
    d = math.prod(data_shape)
    mean = rng.normal(size=d)
    cov = random_cov(rng, d)  # non-isotropic
    src = GaussianScore.from_covariance(p, mean, cov, data_shape=data_shape)
    for t in times(p):
        _, s = ref_alpha_sigma(p, t)
        x = jnp.asarray(rng.normal(size=(5, *data_shape)) * (1 + s), jnp.float32)
        ref = convolved_gauss_score(x.reshape(5, -1), t, p, mean, cov)
        got = score_fn(src, x, t)
        assert got.shape == x.shape
        assert_close_rel(got.reshape(5, -1), ref, 2e-3)


@pytest.mark.parametrize("p", PROCESSES, ids=repr)
def test_gaussian_denoiser_equals_textbook_posterior_mean(p):
    rng = np.random.default_rng(1)
    d = 4
    mean, cov = rng.normal(size=d), random_cov(rng, d, 2.0)
    src = GaussianScore.from_covariance(p, mean, cov)
    for t in times(p):
        a, s = ref_alpha_sigma(p, t)
        x = rng.normal(size=(6, d)) * (a + s)
        # mu + alpha Sigma (alpha^2 Sigma + sigma^2 I)^-1 (x - alpha mu), float64.
        c = a**2 * cov + s**2 * np.eye(d)
        ref = mean + (a * cov @ np.linalg.solve(c, (x - a * mean).T)).T
        got = denoiser_fn(src, jnp.asarray(x, jnp.float32), t)
        assert_close_rel(got, ref, 1e-4)
        # Tweedie, both directions, against the float64 score -(C)^-1 (x - alpha mu).
        ref_score = -np.linalg.solve(c, (x - a * mean).T).T
        assert_close_rel(score_fn(src, jnp.asarray(x, jnp.float32), t), ref_score, 2e-3)


@pytest.mark.parametrize("p", [EDM(), VE(), VP()], ids=repr)
def test_gaussian_score_accurate_at_the_smallest_noise(p):
    """At t_min (sigma = 0.002 for EDM) the score must not lose digits to cancellation."""
    rng = np.random.default_rng(2)
    d = 6
    mean, cov = rng.normal(size=d), random_cov(rng, d)
    src = GaussianScore.from_covariance(p, mean, cov)
    t = p.t_min
    a, s = ref_alpha_sigma(p, t)
    x = a * (mean + rng.normal(size=(8, d)))
    c = a**2 * cov + s**2 * np.eye(d)
    ref_score = -np.linalg.solve(c, (x - a * mean).T).T
    got = score_fn(src, jnp.asarray(x, jnp.float32), t)
    assert np.all(np.isfinite(got))
    assert_close_rel(got, ref_score, 1e-3)


@pytest.mark.parametrize("p", [EDM(), VP()], ids=repr)
def test_rank_r_gaussian_equals_full_covariance(p):
    rng = np.random.default_rng(3)
    d, r, resid = 6, 2, 0.3
    u, _ = np.linalg.qr(rng.normal(size=(d, r)))
    lam = np.array([2.5, 0.7])
    mean = rng.normal(size=d)
    full = u @ np.diag(lam) @ u.T + resid * (np.eye(d) - u @ u.T)
    low = GaussianScore(
        process=p,
        mean=jnp.asarray(mean, jnp.float32),
        eigvecs=jnp.asarray(u, jnp.float32),
        eigvals=jnp.asarray(lam, jnp.float32),
        residual_var=jnp.asarray(resid, jnp.float32),
        data_shape=(d,),
    )
    ref_src = GaussianScore.from_covariance(p, mean, full)
    for t in times(p):
        a, s = ref_alpha_sigma(p, t)
        x = jnp.asarray(rng.normal(size=(5, d)) * (a + s), jnp.float32)
        ref = convolved_gauss_score(x, t, p, mean, full)
        assert_close_rel(score_fn(low, x, t), ref, 2e-3)
        assert_close_rel(score_fn(low, x, t), score_fn(ref_src, x, t), 2e-3)
        assert_close_rel(denoiser_fn(low, x, t), denoiser_fn(ref_src, x, t), 1e-4)


def make_mixture(rng, k, d, spread=3.0):
    w = rng.uniform(0.5, 2.0, size=k)
    w = w / w.sum()
    means = rng.normal(size=(k, d)) * spread
    covs = np.stack([random_cov(rng, d, 0.7) for _ in range(k)])
    return w, means, covs


@pytest.mark.parametrize("p, data_shape", CASES, ids=repr)
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_mixture_score_equals_grad_of_convolved_log_density(p, data_shape):
    rng = np.random.default_rng(4)
    d = math.prod(data_shape)
    w, means, covs = make_mixture(rng, 3, d)
    src = MixtureScore.create(p, w, means, covs, data_shape=data_shape)
    for t in times(p):
        a, s = ref_alpha_sigma(p, t)
        # Points near the components and in between, where responsibilities are mixed.
        x = a * means[rng.integers(0, 3, size=5)] + rng.normal(size=(5, d)) * (a + s)
        x = jnp.asarray(x.reshape(5, *data_shape), jnp.float32)
        xf = x.reshape(5, -1)
        ref = convolved_mixture_score(xf, t, p, w, means, covs)
        got = score_fn(src, x, t)
        assert got.shape == x.shape
        assert_close_rel(got.reshape(5, -1), ref, 3e-3)
        # log_prob against scipy in float64.
        a, s = ref_alpha_sigma(p, t)
        xn = np.asarray(xf, np.float64)
        dens = sum(
            w[j]
            * stats.multivariate_normal(a * means[j], a**2 * covs[j] + s**2 * np.eye(d)).pdf(xn)
            for j in range(3)
        )
        np.testing.assert_allclose(log_prob_fn(src, x, t), np.log(dens), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("p", [EDM(), VP(), SubVP()], ids=repr)
def test_mixture_denoiser_equals_textbook_posterior_mean(p):
    """E[x0 | x] = sum_k r_k(x) [m_k + alpha C_k (alpha^2 C_k + sigma^2 I)^-1 (x - alpha m_k)]."""
    rng = np.random.default_rng(5)
    d = 3
    w, means, covs = make_mixture(rng, 4, d)
    src = MixtureScore.create(p, w, means, covs)
    for t in times(p):
        a, s = ref_alpha_sigma(p, t)
        x = a * means[rng.integers(0, 4, size=6)] + rng.normal(size=(6, d)) * (a + s)
        logr, post = [], []
        for k in range(4):
            c = a**2 * covs[k] + s**2 * np.eye(d)
            logr.append(np.log(w[k]) + stats.multivariate_normal(a * means[k], c).logpdf(x))
            post.append(means[k] + (a * covs[k] @ np.linalg.solve(c, (x - a * means[k]).T)).T)
        logr = np.stack(logr, 1)
        r = np.exp(logr - logr.max(1, keepdims=True))
        r /= r.sum(1, keepdims=True)
        ref = np.einsum("bk,kbd->bd", r, np.stack(post))
        assert_close_rel(denoiser_fn(src, jnp.asarray(x, jnp.float32), t), ref, 2e-4)


def test_single_component_mixture_equals_gaussian():
    rng = np.random.default_rng(6)
    d = 5
    mean, cov = rng.normal(size=d), random_cov(rng, d)
    for p in [EDM(), VP()]:
        mix = MixtureScore.create(p, [1.0], mean[None], cov[None])
        g = GaussianScore.from_covariance(p, mean, cov)
        x = jnp.asarray(rng.normal(size=(4, d)), jnp.float32)
        for t in times(p):
            assert_close_rel(score_fn(mix, x, t), score_fn(g, x, t), 2e-3)


def test_mixture_stable_far_away_and_at_tiny_sigma():
    rng = np.random.default_rng(7)
    d = 3
    w, means, covs = make_mixture(rng, 3, d)
    covs[1] = np.diag([1.0, 0.5, 0.0])  # a singular component too
    p = EDM()
    src = MixtureScore.create(p, w, means, covs)
    # Far from all means: every component log-density is ~ -1e7; logsumexp must cope.
    x = jnp.asarray(np.full((2, d), 3e3) * np.array([[1.0], [-1.0]]), jnp.float32)
    sc = score_fn(src, x, p.sigma_min)
    assert np.all(np.isfinite(sc)) and np.all(np.isfinite(log_prob_fn(src, x, p.sigma_min)))
    assert np.all(np.isfinite(denoiser_fn(src, x, p.sigma_min)))
    # Far away the score points back towards the data (x . score < 0).
    assert np.all(np.sum(np.asarray(x) * np.asarray(sc), -1) < 0)
    # Tiny sigma, x exactly at each mean: the score is ~0 (the own component dominates),
    # the denoiser returns the mean.
    x = jnp.asarray(means, jnp.float32)
    for t in (p.sigma_min, 1e-4):
        sc = score_fn(src, x, t)
        assert np.all(np.isfinite(sc))
        np.testing.assert_allclose(sc, 0.0, atol=1e-2)
        np.testing.assert_allclose(denoiser_fn(src, x, t), means, atol=1e-4)


@pytest.mark.parametrize(
    "src_fn",
    [
        lambda p, rng: GaussianScore.from_covariance(
            p, rng.normal(size=16), random_cov(rng, 16), data_shape=(4, 4, 1)
        ),
        lambda p, rng: MixtureScore.create(p, *make_mixture(rng, 2, 16), data_shape=(4, 4, 1)),
    ],
    ids=["gaussian", "mixture"],
)
@pytest.mark.parametrize("p", [VP(), EDM()], ids=repr)
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_scalar_and_batched_time(src_fn, p):
    rng = np.random.default_rng(8)
    src = src_fn(p, rng)
    assert src.data_shape == (4, 4, 1)
    x = jnp.asarray(rng.normal(size=(3, 4, 4, 1)), jnp.float32)
    ts = times(p)
    batched = score_fn(src, x, jnp.asarray(ts, jnp.float32))
    for i, t in enumerate(ts):
        single = score_fn(src, x[i : i + 1], t)[0]
        np.testing.assert_allclose(batched[i], single, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(
            denoiser_fn(src, x, jnp.asarray(ts, jnp.float32))[i],
            denoiser_fn(src, x[i : i + 1], jnp.asarray([t]))[0],
            rtol=1e-4,
            atol=1e-5,
        )
    for bad in (jnp.asarray(ts[:2]), jnp.asarray(ts)[:, None], jnp.ones((3, 2))):
        with pytest.raises(ValueError, match="shape"):
            score_fn(src, x, bad)
        with pytest.raises(ValueError, match="shape"):
            denoiser_fn(src, x, bad)


def test_sources_are_pytrees_with_static_process():
    """Sources go into jax.jit as arguments (as ``score_fn`` above does): arrays are leaves,
    the process and data_shape are static (a different process is a different treedef)."""
    rng = np.random.default_rng(9)
    g = GaussianScore.from_covariance(VP(), rng.normal(size=3), random_cov(rng, 3))
    m = MixtureScore.create(VP(), *make_mixture(rng, 2, 3))
    assert len(jax.tree_util.tree_leaves(g)) == 4 and len(jax.tree_util.tree_leaves(m)) == 4
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves((g, m)))
    assert jax.tree_util.tree_structure(g) != jax.tree_util.tree_structure(g.replace(process=EDM()))


def test_source_with_neither_method_raises():
    class Empty(ScoreSource):
        pass

    src = Empty(process=EDM())
    with pytest.raises(NotImplementedError):
        src.score(jnp.ones((1, 2)), 1.0)
    with pytest.raises(NotImplementedError):
        src.denoiser(jnp.ones((1, 2)), 1.0)


def test_constructors_validate_shapes():
    with pytest.raises(ValueError, match="cov"):
        GaussianScore.from_covariance(EDM(), np.zeros(3), np.eye(2))
    with pytest.raises(ValueError, match="weights"):
        MixtureScore.create(EDM(), [1.0, -1.0], np.zeros((2, 3)), np.stack([np.eye(3)] * 2))
    with pytest.raises(ValueError, match="covs"):
        MixtureScore.create(EDM(), [1.0, 1.0], np.zeros((2, 3)), np.stack([np.eye(2)] * 2))
    with pytest.raises(ValueError, match="means"):
        MixtureScore.create(EDM(), [1.0], np.zeros(3), np.eye(3)[None])
