"""Fréchet distance: closed forms, an independent sqrtm reference, and degenerate inputs."""

import numpy as np
import pytest
import scipy.linalg

from scorelib.metrics import fd_features, fd_floor, frechet_distance, gaussian_stats


def _random_cov(rng, d, cond=10.0):
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return (q * np.geomspace(1.0, 1.0 / cond, d)) @ q.T


def _exact_moment_samples(rng, n, d, mean):
    """Samples whose empirical mean is ``mean`` and unbiased covariance is exactly I."""
    z = rng.standard_normal((n, d))
    z -= z.mean(0)
    c = z.T @ z / (n - 1)
    w, v = np.linalg.eigh(c)
    return z @ v @ np.diag(w**-0.5) @ v.T + mean


@pytest.mark.parametrize("d", [1, 5, 64])
def test_unit_shift_is_d(d):
    eye = np.eye(d)
    assert frechet_distance(np.zeros(d), eye, np.ones(d), eye) == pytest.approx(d, rel=1e-12)
    rng = np.random.default_rng(d)
    a = _exact_moment_samples(rng, 3 * d + 10, d, 0.0)
    b = _exact_moment_samples(rng, 2 * d + 10, d, 1.0)
    assert fd_features(a, b) == pytest.approx(d, rel=1e-9)


def test_diagonal_closed_form_including_singular():
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 2, 6)
    b = rng.uniform(0, 2, 6)
    a[:2] = 0.0  # singular covariance
    mu1, mu2 = rng.standard_normal(6), rng.standard_normal(6)
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)
    assert frechet_distance(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(expected, rel=1e-10)


def test_self_fd_is_zero():
    rng = np.random.default_rng(1)
    c = _random_cov(rng, 30, cond=1e4)
    mu = rng.standard_normal(30)
    assert abs(frechet_distance(mu, c, mu, c)) < 1e-9
    f = rng.standard_normal((200, 16))
    assert abs(fd_features(f, f.copy())) < 1e-9


def test_against_sqrtm_reference():
    rng = np.random.default_rng(2)
    for d in (2, 10, 40):
        c1, c2 = _random_cov(rng, d), _random_cov(rng, d, cond=5.0) * 2.0
        m1, m2 = rng.standard_normal(d), rng.standard_normal(d)
        covmean = scipy.linalg.sqrtm(c1 @ c2)
        assert np.max(np.abs(covmean.imag)) < 1e-8
        ref = np.sum((m1 - m2) ** 2) + np.trace(c1) + np.trace(c2) - 2 * np.trace(covmean.real)
        assert frechet_distance(m1, c1, m2, c2) == pytest.approx(ref, rel=1e-8)
        # symmetric in its arguments
        assert frechet_distance(m2, c2, m1, c1) == pytest.approx(ref, rel=1e-8)


def test_fewer_samples_than_dimensions():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((10, 50)), rng.standard_normal((8, 50)) + 0.1
    mu1, c1 = gaussian_stats(a)
    assert np.linalg.matrix_rank(c1) == 9
    fd = fd_features(a, b)
    assert np.isfinite(fd) and isinstance(fd, float) and fd > 0
    assert abs(fd_features(a, a.copy())) < 1e-9
    # only the mean differs: FD = |dmu|^2 even though cov is singular
    assert frechet_distance(mu1, c1, mu1 + 0.5, c1) == pytest.approx(50 * 0.25, rel=1e-8)
    # two independent rank-deficient covariances: against a brute-force sum over the
    # eigenvalues of C1 C2 (real and >= 0 up to round-off)
    mu2, c2 = gaussian_stats(b)
    ev = np.clip(np.linalg.eigvals(c1 @ c2).real, 0, None)
    ref = np.sum((mu1 - mu2) ** 2) + np.trace(c1) + np.trace(c2) - 2 * np.sum(np.sqrt(ev))
    assert fd == pytest.approx(ref, rel=1e-6)


def test_gaussian_stats_and_errors():
    f = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 8.0]])
    mu, c = gaussian_stats(f)
    np.testing.assert_allclose(mu, [2.0, 4.0])
    np.testing.assert_allclose(c, np.cov(f, rowvar=False))
    with pytest.raises(ValueError):
        gaussian_stats(f[:1])
    with pytest.raises(ValueError):
        frechet_distance(np.zeros(2), np.eye(3), np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match="finite"):
        frechet_distance(np.zeros(2), np.eye(2) * np.nan, np.zeros(2), np.eye(2))


def test_fd_floor_is_the_fd_of_iid_samples_of_the_training_distribution():
    # A large training set of N(0, C) points: bootstrap draws of n rows are then
    # (almost) fresh i.i.d. N(0, C) samples, so the floor must match the mean FD of fresh
    # samples, computed independently; the reference set is a fixed shifted Gaussian.
    rng = np.random.default_rng(0)
    d, n, draws = 3, 50, 400
    c = _random_cov(rng, d, cond=4.0)
    lc = np.linalg.cholesky(c)
    train = rng.standard_normal((100_000, d)) @ lc.T
    ref = 0.3 + rng.standard_normal((400, d)) @ lc.T
    mean, std = fd_floor(train, ref, n, draws=draws, seed=1)
    fresh = [fd_features(rng.standard_normal((n, d)) @ lc.T, ref) for _ in range(draws)]
    se = np.hypot(std, np.std(fresh)) / np.sqrt(draws)
    assert abs(mean - np.mean(fresh)) < 4 * se, (mean, np.mean(fresh), se)
    assert std == pytest.approx(np.std(fresh), rel=0.25)
    # The finite-n noise is real: the floor lies well above the FD of the population.
    assert mean > fd_features(train, ref) + 5 * se


def test_fd_floor_draws_with_replacement():
    # n equal to the training-set size: a subset without replacement would be the whole
    # set every time (FD exactly that of the training set, no spread); i.i.d. draws are not.
    rng = np.random.default_rng(1)
    train, ref = rng.standard_normal((40, 2)), rng.standard_normal((300, 2))
    mean, std = fd_floor(train, ref, 40, draws=50)
    full = fd_features(train, ref)  # 0.09; the floor measured: 0.18 +- 0.08
    assert std > 0.3 * full and mean > 1.5 * full, (mean, std, full)
    assert fd_floor(train, ref, 40, draws=3, seed=7) == fd_floor(train, ref, 40, draws=3, seed=7)
    for bad in ({"n": 1}, {"n": 10, "draws": 0}):
        with pytest.raises(ValueError, match="n >= 2 and draws >= 1"):
            fd_floor(train, ref, **bad)
