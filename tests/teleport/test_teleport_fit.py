"""Gaussian fit, k-means mixture and the empirical (training-set) score.

References: numpy's ``np.cov`` / ``np.linalg.eigh`` on the same data; a brute-force
per-training-point loop for the empirical denoiser; ``jax.grad`` of the explicit
log-density of the noised delta mixture for its score.
"""

import closed_forms
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp

from scorelib.processes import EDM, VP
from scorelib.scores import (
    EmpiricalScore,
    GaussianScore,
    MixtureScore,
    fit_gaussian,
    fit_kmeans_mixture,
)


def data_set(n, d, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d)) / np.sqrt(d)
    return rng.normal(size=(n, d)) @ a * np.linspace(1.5, 0.2, d) + rng.normal(size=d)


def cov_of(g: GaussianScore):
    u, lam = np.asarray(g.eigvecs, np.float64), np.asarray(g.eigvals, np.float64)
    d, r = u.shape
    return u @ np.diag(lam) @ u.T + float(g.residual_var) * (np.eye(d) - u @ u.T)


def test_full_rank_fit_is_the_sample_covariance():
    x = data_set(300, 6).reshape(300, 2, 3)
    with jax.enable_x64(True):
        g = fit_gaussian(EDM(), x)
    flat = x.reshape(300, -1)
    assert g.data_shape == (2, 3) and g.eigvecs.shape == (6, 6)
    np.testing.assert_allclose(np.asarray(g.mean), flat.mean(0), rtol=1e-12)
    np.testing.assert_allclose(cov_of(g), np.cov(flat.T), rtol=1e-10, atol=1e-12)
    lam = np.asarray(g.eigvals)
    assert np.all(np.diff(lam) <= 0) and float(g.residual_var) == 0.0


@pytest.mark.parametrize("n", [300, 12], ids=["n>d", "n<d (svd)"])
def test_rank_r_keeps_top_eigenpairs_and_the_trace(n):
    d, r = 20, 4
    x = data_set(n, d, seed=1)
    with jax.enable_x64(True):
        g = fit_gaussian(VP(), x, rank=r)
    cov = np.cov(x.T)
    lam, u = np.linalg.eigh(cov)
    lam, u = lam[::-1], u[:, ::-1]
    np.testing.assert_allclose(np.asarray(g.eigvals), lam[:r], rtol=1e-9)
    # Same subspace (eigenvectors up to sign).
    proj = np.asarray(g.eigvecs).T @ u[:, :r]
    np.testing.assert_allclose(np.abs(proj), np.eye(r), atol=1e-8)
    np.testing.assert_allclose(float(g.residual_var), lam[r:].sum() / (d - r), rtol=1e-9)
    np.testing.assert_allclose(np.trace(cov_of(g)), np.trace(cov), rtol=1e-10)


def test_rank_larger_than_the_data_span_completes_the_basis():
    x = data_set(5, 10, seed=2)  # centred rank 4
    with jax.enable_x64(True):
        g = fit_gaussian(EDM(), x, rank=7)
    u = np.asarray(g.eigvecs)
    np.testing.assert_allclose(u.T @ u, np.eye(7), atol=1e-10)
    np.testing.assert_allclose(cov_of(g), np.cov(x.T), atol=1e-10)  # residual 0, exact
    assert float(g.residual_var) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("n", [200, 6])  # the covariance's eigh, and the SVD of the data
def test_rank_zero_is_the_isotropic_fit(n):
    x = data_set(n, 10, seed=3)
    with jax.enable_x64(True):
        g = fit_gaussian(EDM(), x, rank=0)
        assert g.eigvecs.shape == (10, 0)
        v = np.trace(np.cov(x.T)) / 10
        np.testing.assert_allclose(cov_of(g), v * np.eye(10), rtol=1e-10)
        q, mu = x[:3] + 0.5, x.mean(0)
        d = g.denoiser(jnp.asarray(q), jnp.asarray(0.7))
        np.testing.assert_allclose(d, mu + v / (v + 0.49) * (q - mu), rtol=1e-6)


@pytest.mark.parametrize("bad", [dict(rank=-1), dict(rank=11), dict(rank=True), dict(ddof=5)])
def test_fit_rejects_bad_arguments(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        fit_gaussian(EDM(), data_set(5, 10), **bad)
    with pytest.raises(ValueError, match="at least 2"):
        fit_gaussian(EDM(), np.zeros((1, 3)))


def test_kmeans_mixture_components():
    rng = np.random.default_rng(3)
    centres = np.array([[-4.0, 0.0], [4.0, 0.0], [0.0, 5.0]])
    lab = rng.integers(0, 3, 600)
    x = centres[lab] + 0.3 * rng.normal(size=(600, 2))
    mix = fit_kmeans_mixture(EDM(), x, 3, ridge=1e-3)
    assert isinstance(mix, MixtureScore) and mix.means.shape == (3, 2)
    order = np.argsort(np.asarray(mix.means)[:, 0] + 10 * np.asarray(mix.means)[:, 1])
    np.testing.assert_allclose(np.asarray(mix.means)[order], centres[[0, 1, 2]], atol=0.1)
    w = np.exp(np.asarray(mix.log_weights))[order]
    np.testing.assert_allclose(w, np.bincount(lab) / 600, atol=1e-6)
    # Each component's covariance is its cluster's ML covariance + ridge I.
    covs = np.einsum(
        "kij,kj,klj->kil",
        np.asarray(mix.eigvecs, np.float64),
        np.asarray(mix.eigvals, np.float64),
        np.asarray(mix.eigvecs, np.float64),
    )
    for j, k in enumerate(order):
        xk = x[lab == j]
        ref = np.cov(xk.T, bias=True) + 1e-3 * np.eye(2)
        np.testing.assert_allclose(covs[k], ref, rtol=1e-4, atol=1e-6)


def brute_denoiser(train, y, s):
    """Posterior mean of (1/n) sum delta(x_i) given y = x + s eps, one point at a time."""
    out = []
    for yb in y:
        logw = np.array([-np.sum((yb - xi) ** 2) / (2 * s**2) for xi in train])
        w = np.exp(logw - logsumexp(logw))
        out.append(w @ train)
    return np.array(out)


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("process", [EDM(), VP()], ids=["edm", "vp"])
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_empirical_denoiser_matches_brute_force(process, chunk):
    train = data_set(23, 3, seed=4)
    src = EmpiricalScore.create(process, train, chunk=chunk)
    t = 0.8 if isinstance(process, EDM) else 0.3
    a = float(closed_forms.alpha_sigma(process, t)[0])
    s = float(closed_forms.ve_sigma(process, t))
    y = np.random.default_rng(5).normal(size=(5, 3)) + 0.3
    got = np.asarray(src.denoiser(jnp.asarray(a * y, jnp.float32), t))
    np.testing.assert_allclose(got, brute_denoiser(train, y, s), rtol=2e-5, atol=2e-5)


def test_empirical_score_is_grad_log_density_and_per_example_time():
    p = VP()
    train = data_set(9, 2, seed=6)
    with jax.enable_x64(True):
        src = EmpiricalScore.create(p, train, chunk=4)
        t = jnp.array([0.2, 0.5, 0.9])
        x = jnp.asarray(np.random.default_rng(7).normal(size=(3, 2)))
        alpha, sigma = closed_forms.alpha_sigma(p, np.asarray(t))

        def logp(xb, a, s):
            sq = jnp.sum((xb - a * jnp.asarray(train)) ** 2, -1)
            return jax.nn.logsumexp(-sq / (2 * s**2))

        ref = jax.vmap(jax.grad(logp))(x, jnp.asarray(alpha), jnp.asarray(sigma))
        np.testing.assert_allclose(np.asarray(src.score(x, t)), np.asarray(ref), rtol=1e-9)


def test_empirical_at_a_training_point_and_tiny_sigma_is_finite_and_exact():
    """A query equal to a training point at sigma = 1e-3: weight 1 on that point (no
    cancellation from ||x||^2 - 2 x.x_i + ||x_i||^2 with large ||x||)."""
    train = data_set(50, 64, seed=8) * 3 + 10.0  # large norms
    src = EmpiricalScore.create(EDM(), train, chunk=16)
    x = jnp.asarray(train[[3, 17]], jnp.float32)
    d = np.asarray(src.denoiser(x, 1e-3))
    np.testing.assert_allclose(d, train[[3, 17]], rtol=1e-6)
    s = np.asarray(src.score(x, 1e-3))
    assert np.all(np.isfinite(s)) and np.max(np.abs(s)) < 1.0
