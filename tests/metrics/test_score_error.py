"""Relative score error and explained fraction against closed forms for Gaussian data and an
independent numpy computation of the same pooled sums."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.metrics import explained_fraction, noisy_samples, relative_score_error
from scorelib.processes import EDM, VP
from scorelib.scores import GaussianScore, ScoreSource

D = 3
MU = np.array([0.5, -1.0, 0.2])
COV = np.array([[1.0, 0.3, 0.0], [0.3, 0.5, 0.1], [0.0, 0.1, 0.2]])


def gaussian(process, mean=MU, cov=COV):
    return GaussianScore.from_covariance(process, mean=mean, cov=cov)


def x0_draws(n, seed=0):
    rng = np.random.default_rng(seed)
    return (MU + rng.standard_normal((n, D)) @ np.linalg.cholesky(COV).T).astype(np.float32)


def coefficients(process, ve_sigma):
    t = process.t_of_ve_sigma(ve_sigma)
    return t, float(process.alpha(t)), float(process.sigma(t))


def test_noisy_samples_are_per_example():
    p = EDM()
    x0 = jnp.asarray(x0_draws(6))
    key = jax.random.key(3)
    x = noisy_samples(p, x0, 0.7, key)
    # example b uses fold_in(key, b): an independent loop over examples
    for b in range(6):
        eps = jax.random.normal(jax.random.fold_in(key, b), (D,))
        np.testing.assert_allclose(x[b], x0[b] + 0.7 * eps, rtol=1e-6)
    # a chunk with its first_index gives the same points; a prefix batch is a prefix
    np.testing.assert_array_equal(noisy_samples(p, x0[2:5], 0.7, key, first_index=2), x[2:5])
    np.testing.assert_array_equal(noisy_samples(p, x0[:3], 0.7, key), x[:3])


class Scaled(ScoreSource):
    """``c`` times another source's score (``c`` a pytree leaf: one compilation for every c)."""

    inner: Any = None
    c: float = 1.0

    def score(self, x, t):
        return self.c * self.inner.score(x, t)


@pytest.mark.parametrize("process", [EDM(), VP()], ids=["EDM", "VP"])
def test_relative_error_of_a_scaled_score_is_exact(process):
    """s = c s_ref at every point: the ratio is (c - 1)^2 whatever the points."""
    ref = gaussian(process)
    for c in (1.0, 0.0, 1.25, -1.0):
        err = relative_score_error(
            Scaled(process=process, inner=ref, c=c), ref, x0_draws(200), 0.5, jax.random.key(0)
        )
        assert err == pytest.approx((c - 1) ** 2, rel=1e-6, abs=1e-12)
        # the explained fraction in score space is one minus it: 1, 0, 0.9375, -3
        frac = explained_fraction(
            Scaled(process=process, inner=ref, c=c), ref, x0_draws(200), 0.5, jax.random.key(0)
        )
        assert frac["score"] == pytest.approx(1 - (c - 1) ** 2, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("process", [EDM(), VP()], ids=["EDM", "VP"])
@pytest.mark.parametrize("ve_sigma", [0.05, 1.0, 5.0])
def test_relative_error_of_a_wrong_gaussian_matches_the_closed_form(process, ve_sigma):
    """N(mu + delta, k C) against N(mu, C): with A = alpha^2 C + sigma^2 I, A' = alpha^2 k C +
    sigma^2 I and M = A'^-1 - A^-1, E||s' - s||^2 = tr(M A M) + alpha^2 ||A'^-1 delta||^2
    and E||s||^2 = tr A^-1."""
    delta, k = np.array([0.1, -0.2, 0.05]), 1.3
    t, a, s = coefficients(process, ve_sigma)
    a_mat = a**2 * COV + s**2 * np.eye(D)
    a_prime = a**2 * k * COV + s**2 * np.eye(D)
    m = np.linalg.inv(a_prime) - np.linalg.inv(a_mat)
    num = np.trace(m @ a_mat @ m) + a**2 * np.sum(np.linalg.solve(a_prime, delta) ** 2)
    expected = num / np.trace(np.linalg.inv(a_mat))
    wrong = gaussian(process, MU + delta, k * COV)
    err = relative_score_error(wrong, gaussian(process), x0_draws(40_000), t, jax.random.key(1))
    assert err == pytest.approx(expected, rel=0.03)


def test_against_an_independent_numpy_computation_and_chunking():
    p = VP()
    t, a, s = coefficients(p, 0.8)
    x0 = x0_draws(50)
    key = jax.random.key(5)
    eps = np.stack(
        [np.asarray(jax.random.normal(jax.random.fold_in(key, b), (D,))) for b in range(50)]
    )
    x = a * x0.astype(np.float64) + s * eps
    a_mat = a**2 * COV + s**2 * np.eye(D)
    other_mean, other_cov = MU + 0.3, 0.7 * COV
    a_other = a**2 * other_cov + s**2 * np.eye(D)
    s_ref = -np.linalg.solve(a_mat, (x - a * MU).T).T
    s_other = -np.linalg.solve(a_other, (x - a * other_mean).T).T
    expected = np.sum((s_other - s_ref) ** 2) / np.sum(s_ref**2)
    other, ref = gaussian(p, other_mean, other_cov), gaussian(p, MU, COV)
    got = relative_score_error(other, ref, x0, t, key)
    assert got == pytest.approx(expected, rel=1e-4)
    for bs in (7, 50, 64):  # chunks (a padded last one) give the same points
        assert relative_score_error(other, ref, x0, t, key, batch_size=bs) == pytest.approx(
            got, rel=1e-6
        )
    # the denoiser-space fraction from the closed-form posterior means
    d_ref = MU + (a * COV @ np.linalg.solve(a_mat, (x - a * MU).T)).T
    d_other = other_mean + (a * other_cov @ np.linalg.solve(a_other, (x - a * other_mean).T)).T
    frac = explained_fraction(other, ref, x0, t, key, batch_size=16)
    centred = d_ref - d_ref.mean(0)
    assert frac["score"] == pytest.approx(1 - expected, rel=1e-4)
    assert frac["denoiser"] == pytest.approx(
        1 - np.sum((d_other - d_ref) ** 2) / np.sum(centred**2), rel=1e-4
    )


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_stacked_models_equal_separate_calls():
    p = EDM()
    sources = [gaussian(p, MU + 0.1 * i, (1 + 0.2 * i) * COV) for i in range(3)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *sources)
    x0, key = x0_draws(300), jax.random.key(2)
    errs = relative_score_error(stacked, gaussian(p), x0, 0.3, key, stacked=True)
    assert errs.shape == (3,)
    for i, src in enumerate(sources):
        assert errs[i] == pytest.approx(
            relative_score_error(src, gaussian(p), x0, 0.3, key), rel=1e-5
        )
    fr = explained_fraction(stacked, gaussian(p), x0, 0.3, key, stacked=True)
    assert fr["score"] == pytest.approx(1 - errs, rel=1e-5)
    # a mapping of approximations: each as if alone, at the same points
    many = explained_fraction(dict(enumerate(sources)), gaussian(p), x0, 0.3, key)
    assert set(many) == {0, 1, 2}
    for i, src in enumerate(sources):
        alone = explained_fraction(src, gaussian(p), x0, 0.3, key)
        assert many[i] == pytest.approx(alone, rel=1e-6)
        assert many[i]["denoiser"] == pytest.approx(fr["denoiser"][i], rel=1e-5)


@pytest.mark.parametrize("process", [EDM(), VP()], ids=["EDM", "VP"])
def test_explained_fraction_of_an_exact_gaussian_and_of_a_shifted_one(process):
    """An exact source explains 100%; a mean shift delta: D' - D = sigma^2 A^-1 delta per
    point, and the reference's denoiser varies with covariance alpha^2 C A^-1 C."""
    x0 = x0_draws(40_000)
    ref = gaussian(process)
    for ve_sigma in (0.1, 2.0):
        t, a, s = coefficients(process, ve_sigma)
        # (10,000 points in one chunk: the compiled chunk of the shifted source's call below)
        f = explained_fraction(ref, ref, x0[:10_000], t, jax.random.key(0))
        assert f == {"score": 1.0, "denoiser": 1.0}
        delta = np.array([0.2, 0.1, -0.3])
        a_mat = a**2 * COV + s**2 * np.eye(D)
        a_inv = np.linalg.inv(a_mat)
        score_num = a**2 * np.sum((a_inv @ delta) ** 2)
        den_num = np.sum((s**2 * a_inv @ delta) ** 2)
        f = explained_fraction(
            gaussian(process, MU + delta), ref, x0, t, jax.random.key(1), batch_size=10_000
        )
        # the unexplained parts, to Monte-Carlo accuracy (40k points)
        assert 1 - f["score"] == pytest.approx(score_num / np.trace(a_inv), rel=0.03)
        den = a**2 * np.trace(COV @ a_inv @ COV)
        assert 1 - f["denoiser"] == pytest.approx(den_num / den, rel=0.03)


def test_bad_inputs_are_refused():
    ref = gaussian(EDM())
    x0 = x0_draws(8)
    with pytest.raises(ValueError, match="source.process must be the reference's process"):
        relative_score_error(gaussian(VP()), ref, x0, 0.5, jax.random.key(0))
    with pytest.raises(ValueError, match=r"t must be a scalar or have shape \[batch="):
        relative_score_error(ref, ref, x0, jnp.ones(3), jax.random.key(0))
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        explained_fraction(ref, ref, x0, 0.5, jax.random.key(0), batch_size=0)
    with pytest.raises(ValueError, match="approximation must be a score source or a non-empty"):
        explained_fraction({}, ref, x0, 0.5, jax.random.key(0))
    with pytest.raises(ValueError, match=r"b.process must be the reference's process"):
        explained_fraction({"a": ref, "b": gaussian(VP())}, ref, x0, 0.5, jax.random.key(0))
    with pytest.raises(ValueError, match="same leading model axis"):
        relative_score_error(ref, ref, x0, 0.5, jax.random.key(0), stacked=True)
