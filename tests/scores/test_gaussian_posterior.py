"""The exact Gaussian posterior (``scorelib.scores.posterior``) against independent routes:
the information form ``(C^-1 + A^T A / sigma_y^2)^-1``, noiseless inpainting's data
consistency, and the noised likelihood's gradient (posterior score minus prior score equals
``grad_x log N(y; A D(x), A Sigma_t A^T + sigma_y^2 I)`` of the prior's denoiser)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from scorelib.operators import Downsample, Inpainting, Measurement, RandomProjection
from scorelib.processes import EDM, VP
from scorelib.scores import GaussianScore
from scorelib.scores.posterior import gaussian_posterior, operator_matrix, prior_covariance


def random_prior(process, shape, seed=0):
    rng = np.random.default_rng(seed)
    d = int(np.prod(shape))
    b = rng.normal(size=(d, d))
    cov = b @ b.T / d + 0.2 * np.eye(d)
    return GaussianScore.from_covariance(process, rng.normal(size=d), cov, shape)


def operators(shape):
    key = jax.random.key(1)
    return {
        "projection": RandomProjection.create(key, shape, 3),
        "inpainting": Inpainting.random(key, shape, 0.5),
        "downsample": Downsample.create(shape, 2),
    }


@pytest.mark.parametrize("name", ["projection", "inpainting", "downsample"])
def test_the_information_form_gives_the_same_posterior(name):
    with jax.enable_x64(True):
        shape = (4, 4, 1)
        prior = random_prior(EDM(), shape)
        meas = Measurement.create(operators(shape)[name], 0.3)
        mu, cov = prior_covariance(prior)
        a = operator_matrix(meas, mu.size, shape)
        y = a @ mu + np.random.default_rng(2).normal(size=a.shape[0])
        post = gaussian_posterior(prior, meas, y)
        m_post, c_post = prior_covariance(post)
        # the independent route: precision form
        prec = np.linalg.inv(cov) + a.T @ a / 0.3**2
        c_info = np.linalg.inv(prec)
        m_info = c_info @ (np.linalg.solve(cov, mu) + a.T @ y / 0.3**2)
        np.testing.assert_allclose(c_post, c_info, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(m_post, m_info, rtol=1e-8, atol=1e-10)


def test_per_entry_noise_levels_give_the_information_form():
    """A stacked measurement (a downsampling at sigma_y 0.05, a few pixels at 0.4): the
    posterior against the information form ``(C^-1 + A^T diag(1 / sigma_y^2) A)^-1``."""
    with jax.enable_x64(True):
        shape = (4, 4, 1)
        prior = random_prior(EDM(), shape, seed=7)
        few = Inpainting.random(jax.random.key(5), shape, 0.25)
        meas = Measurement.stack(
            [Measurement.create(Downsample.create(shape, 2), 0.05), Measurement.create(few, 0.4)]
        )
        mu, cov = prior_covariance(prior)
        a = operator_matrix(meas, 16, shape)
        sigma = np.array([0.05] * 4 + [0.4] * few.m)
        y = a @ mu + np.random.default_rng(8).normal(size=a.shape[0])
        m_post, c_post = prior_covariance(gaussian_posterior(prior, meas, y))
        prec = np.linalg.inv(cov) + a.T @ (a / sigma[:, None] ** 2)
        c_info = np.linalg.inv(prec)
        m_info = c_info @ (np.linalg.solve(cov, mu) + a.T @ (y / sigma**2))
        np.testing.assert_allclose(c_post, c_info, rtol=0, atol=1e-10 * np.abs(c_info).max())
        np.testing.assert_allclose(m_post, m_info, rtol=0, atol=1e-10 * np.abs(m_info).max())
        # one noise level for all would give another posterior
        one = gaussian_posterior(prior, Measurement.create(meas.operator, 0.05), y)
        assert np.abs(prior_covariance(one)[1] - c_info).max() > 1e-3


def test_noiseless_inpainting_keeps_the_measured_pixels():
    with jax.enable_x64(True):
        shape = (3, 3, 1)
        prior = random_prior(EDM(), shape, seed=3)
        op = Inpainting.random(jax.random.key(0), shape, 0.5)
        meas = Measurement.create(op, 0.0)
        keep = np.asarray(op.mask).reshape(-1)
        y = np.linspace(-1, 1, int(keep.sum()))
        m_post, c_post = prior_covariance(gaussian_posterior(prior, meas, y))
        np.testing.assert_allclose(m_post[keep], y, atol=1e-9)
        np.testing.assert_allclose(np.diag(c_post)[keep], 0.0, atol=1e-9)
        assert np.all(np.diag(c_post)[~keep] > 1e-3)  # the missing pixels stay uncertain


@pytest.mark.parametrize("process", [EDM(), VP()], ids=["edm", "vp"])
def test_posterior_minus_prior_score_is_the_noised_likelihood_gradient(process):
    """At every time, grad_x log p_t(y | x) with p_t(y | x) = N(y; A D(x), A Sigma A^T +
    sigma_y^2 I), D the prior's denoiser and Sigma = C - alpha^2 C M^-1 C (M = alpha^2 C +
    sigma^2 I): exact for a Gaussian prior."""
    with jax.enable_x64(True):
        shape = (6,)
        prior = random_prior(process, shape, seed=4)
        op = RandomProjection.create(jax.random.key(2), shape, 2)
        meas = Measurement.create(op, 0.2)
        mu, cov = prior_covariance(prior)
        a = operator_matrix(meas, 6, shape)
        y = np.array([0.5, -1.0])
        post = gaussian_posterior(prior, meas, y)
        x = np.random.default_rng(5).normal(size=(3, 6))
        for t in (0.1, 0.5, 0.9) if isinstance(process, VP) else (0.05, 1.0, 10.0):
            tt = np.float64(t)
            alpha, sigma = float(process.alpha(tt)), float(process.sigma(tt))
            m = alpha**2 * cov + sigma**2 * np.eye(6)
            gain = alpha * cov @ np.linalg.inv(m)  # dD/dx (symmetric)
            den = mu + (x - alpha * mu) @ gain.T
            post_cov = cov - alpha**2 * cov @ np.linalg.solve(m, cov)
            v = a @ post_cov @ a.T + 0.2**2 * np.eye(2)
            resid = y - den @ a.T
            want = np.linalg.solve(v, resid.T).T @ a @ gain
            got = np.asarray(post.score(x, tt)) - np.asarray(prior.score(x, tt))
            np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9)


def test_bad_inputs_name_their_field():
    prior = random_prior(EDM(), (4, 4, 1))
    meas = Measurement.create(Downsample.create((4, 4, 1), 2), 0.1)
    with pytest.raises(ValueError, match=r"y must be \[4\] finite values"):
        gaussian_posterior(prior, meas, np.zeros(3))
    other = Measurement.create(Downsample.create((8, 8, 1), 2), 0.1)
    with pytest.raises(ValueError, match="measurement must be an operator on data of shape"):
        gaussian_posterior(prior, other, np.zeros(16))
    rank1 = GaussianScore.from_covariance(EDM(), np.zeros(16), np.ones((16, 16)), (4, 4, 1))
    noiseless = Measurement.create(Downsample.create((4, 4, 1), 2), 0.0)
    with pytest.raises(ValueError, match="sigma_y must be > 0 when A C A"):
        gaussian_posterior(rank1, noiseless, np.zeros(4))


def test_a_sampler_on_the_exact_posterior_draws_its_moments():
    """Heun on the posterior source: the sample mean within 4 standard errors of m_post, and
    each variance within 4 of its own (chi-square) standard errors."""
    from scorelib.samplers import edm_grid, heun

    shape = (2, 2, 1)
    prior = random_prior(EDM(), shape, seed=6)
    meas = Measurement.create(Inpainting.random(jax.random.key(3), shape, 0.5), 0.1)
    post = gaussian_posterior(prior, meas, np.array([0.8, -0.4]))
    m_post, c_post = prior_covariance(post)
    n = 4000
    x, _ = heun(post, jax.random.key(0), (n, *shape), grid=edm_grid(40, 0.002, 80.0))
    x = np.asarray(x, np.float64).reshape(n, -1)
    var = np.diag(c_post)
    assert np.all(np.abs(x.mean(0) - m_post) < 4 * np.sqrt(var / n) + 1e-6)
    assert np.all(np.abs(x.var(0) - var) < 4 * var * np.sqrt(2 / n) + 1e-6)
