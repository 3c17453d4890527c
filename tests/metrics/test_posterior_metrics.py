"""``scorelib.metrics.posterior``: W2 to a known Gaussian against closed forms, exact draws at
the Monte-Carlo floor and bad ones above it, and the stochastic statistics against their
standard errors."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from scorelib.metrics.posterior import (
    exact_draws,
    gaussian_w2,
    gaussian_w2_floor,
    std_calibration,
)


def _rotation(rng, d):
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return q


def _with_moments(rng, n, mean, cov):
    """``n`` samples whose sample mean is ``mean`` and unbiased covariance ``cov``, exactly."""
    d = mean.size
    z = rng.standard_normal((n, d))
    z -= z.mean(0)
    w, v = np.linalg.eigh(z.T @ z / (n - 1))
    white = z @ v @ np.diag(w**-0.5) @ v.T
    lam, u = np.linalg.eigh(cov)
    return white @ (u * np.sqrt(np.clip(lam, 0, None))) @ u.T + mean


def test_commuting_covariances_give_the_closed_form():
    """Covariances diagonal in one rotated basis: W2^2 = |m1 - m2|^2 + ||C1^1/2 - C2^1/2||_F^2,
    with the per-coordinate std error and the mean errors from their definitions."""
    rng = np.random.default_rng(0)
    d = 6
    q = _rotation(rng, d)
    a, b = rng.uniform(0.1, 2.0, d), rng.uniform(0.1, 2.0, d)
    c1, c2 = (q * a) @ q.T, (q * b) @ q.T
    m1, m2 = rng.standard_normal(d), rng.standard_normal(d)
    x = _with_moments(rng, 50, m1, c1).reshape(50, 2, 3)  # any example shape with d entries
    got = gaussian_w2(x, m2, c2)
    want = np.sum((m1 - m2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)
    assert got["w2_squared"] == pytest.approx(want, rel=1e-9)
    assert got["w2"] == pytest.approx(np.sqrt(want), rel=1e-9)
    assert got["mean_error"] == pytest.approx(np.linalg.norm(m1 - m2), rel=1e-9)
    assert got["rel_mean_error"] == pytest.approx(
        np.linalg.norm(m1 - m2) / np.sqrt(b.sum()), rel=1e-9
    )
    s1, s2 = np.sqrt(np.diag(c1)), np.sqrt(np.diag(c2))
    assert got["std_error"] == pytest.approx(np.linalg.norm(s1 - s2) / np.linalg.norm(s2), rel=1e-9)
    assert got["n"] == 50


def test_samples_with_the_exact_moments_are_at_zero():
    rng = np.random.default_rng(1)
    d = 5
    b = rng.standard_normal((d, d))
    cov, mean = b @ b.T + 0.1 * np.eye(d), rng.standard_normal(d)
    got = gaussian_w2(_with_moments(rng, 30, mean, cov), mean, cov)
    assert abs(got["w2_squared"]) < 1e-9 and got["mean_error"] < 1e-9 and got["std_error"] < 1e-9


def test_singular_exact_covariance():
    """A posterior with a known coordinate (noiseless measurement): zero variance there."""
    rng = np.random.default_rng(2)
    a, b = np.array([0.0, 1.0, 4.0]), np.array([0.0, 0.25, 1.0])
    x = _with_moments(rng, 40, np.zeros(3), np.diag(a))
    want = np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)
    assert gaussian_w2(x, np.zeros(3), np.diag(b))["w2_squared"] == pytest.approx(want, rel=1e-8)


def _posterior_like(seed=3, d=16):
    rng = np.random.default_rng(seed)
    q = _rotation(rng, d)
    lam = np.geomspace(1.0, 0.01, d)
    return rng.standard_normal(d), (q * lam) @ q.T


def test_exact_draws_sit_at_the_floor_and_bad_ones_above_it():
    mean, cov = _posterior_like()
    n = 2000
    fl = gaussian_w2_floor(mean, cov, n, draws=8, seed=0)
    assert len(fl["per_draw"]) == 8 and fl["w2_std"] > 0
    rng = np.random.default_rng(10)
    good = gaussian_w2(exact_draws(mean, cov, n, rng), mean, cov)
    for k in ("w2", "rel_mean_error", "std_error"):
        assert abs(good[k] - fl[k]) < 4 * fl[f"{k}_std"] + 1e-12, k
    # shifted by 0.3 along one direction: W2 about 0.3, far above the floor
    shift = np.zeros_like(mean)
    shift[0] = 0.3
    moved = gaussian_w2(exact_draws(mean + shift, cov, n, rng), mean, cov)
    assert moved["w2"] > fl["w2"] + 10 * fl["w2_std"]
    assert moved["mean_error"] == pytest.approx(0.3, abs=4 * np.sqrt(np.trace(cov) / n))
    # over-dispersed by 1.5 in std: W2^2 = (1.5 - 1)^2 tr C in the limit
    wide = gaussian_w2(exact_draws(mean, 2.25 * cov, n, rng), mean, cov)
    assert wide["w2"] > fl["w2"] + 10 * fl["w2_std"]
    assert wide["w2_squared"] == pytest.approx(0.25 * np.trace(cov), rel=0.15)
    assert wide["std_error"] == pytest.approx(0.5, abs=0.05)


def test_the_mean_error_of_exact_draws_has_its_expected_square():
    """E ||m_hat - m||^2 = tr(C) / n: the floor's rel_mean_error^2 averages 1 / n, within its
    standard error over the draws."""
    mean, cov = _posterior_like(seed=4, d=8)
    n, draws = 200, 400
    fl = gaussian_w2_floor(mean, cov, n, draws=draws, seed=1)
    sq = np.array([p["rel_mean_error"] ** 2 for p in fl["per_draw"]])
    assert abs(sq.mean() - 1 / n) < 4 * sq.std() / np.sqrt(draws)


def test_floor_is_seeded():
    mean, cov = _posterior_like()
    a = gaussian_w2_floor(mean, cov, 100, draws=2, seed=5)
    b = gaussian_w2_floor(mean, cov, 100, draws=2, seed=5)
    assert a["w2"] == b["w2"] and a["per_draw"] == b["per_draw"]


def test_std_calibration_of_exact_and_miscalibrated_draws():
    rng = np.random.default_rng(6)
    d, n = 40, 4000
    mean = rng.standard_normal(d)
    s = rng.uniform(0.2, 1.0, d)
    s[:3] = 0.0  # known coordinates: left out of the ratios
    x = mean + rng.standard_normal((n, d)) * s
    cal = std_calibration(x, s, exact_mean=mean, level=0.9)
    assert cal["kept"] == d - 3 and np.all(np.isnan(cal["ratio"][:3]))
    # the ratio of a sample std: standard error about 1 / sqrt(2 (n - 1)) per coordinate
    se = 1 / np.sqrt(2 * (n - 1))
    assert abs(cal["mean_ratio"] - 1) < 4 * se / np.sqrt(d - 3)
    assert np.all(np.abs(cal["ratio"][3:] - 1) < 5 * se)
    assert cal["rel_error"] < 5 * se
    # the exact mass of the draws' central 90% interval: 0.9 up to its sampling error (the
    # empirical quantiles' error, about phi(z) sqrt(q (1 - q) / n) / phi(z) per end)
    se_cov = np.sqrt(2 * 0.05 * 0.95 / n) / np.sqrt(d - 3)
    assert abs(cal["coverage"] - 0.9) < 5 * se_cov + 1e-3
    # over-dispersed by 1.3: ratio 1.3, coverage of the wider interval 2 Phi(1.3 z) - 1
    wide = std_calibration(mean + 1.3 * (x - mean), s, exact_mean=mean)
    assert wide["median_ratio"] == pytest.approx(1.3, abs=0.02)
    assert wide["coverage"] == pytest.approx(2 * norm.cdf(1.3 * norm.ppf(0.95)) - 1, abs=0.01)
    narrow = std_calibration(mean + 0.5 * (x - mean), s, exact_mean=mean)
    assert narrow["coverage"] == pytest.approx(2 * norm.cdf(0.5 * norm.ppf(0.95)) - 1, abs=0.01)
    assert "coverage" not in std_calibration(x, s)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: gaussian_w2(np.zeros((1, 3)), np.zeros(3), np.eye(3)), "samples must be"),
        (lambda: gaussian_w2(np.zeros((5, 4)), np.zeros(3), np.eye(3)), "d = 3 entries"),
        (
            lambda: gaussian_w2(np.full((5, 3), np.nan), np.zeros(3), np.eye(3)),
            "samples must be finite",
        ),
        (lambda: gaussian_w2(np.zeros((5, 3)), np.zeros(3), np.eye(2)), r"cov must be \[d, d\]"),
        (
            lambda: gaussian_w2(np.zeros((5, 3)), np.zeros(3), np.triu(np.ones((3, 3)))),
            "cov must be symmetric",
        ),
        (lambda: gaussian_w2_floor(np.zeros(3), np.eye(3), 1), "n must be"),
        (lambda: gaussian_w2_floor(np.zeros(3), np.eye(3), 10, draws=0), "draws must be"),
        (lambda: std_calibration(np.zeros((5, 3)), np.zeros(3)), "exact_std must be"),
        (lambda: std_calibration(np.zeros((5, 3)), -np.ones(3)), "exact_std must be"),
        (lambda: std_calibration(np.zeros((5, 3)), np.ones(3), level=1.0), "level must be"),
        (
            lambda: std_calibration(np.zeros((5, 3)), np.ones(3), exact_mean=np.zeros(2)),
            "exact_mean must be",
        ),
    ],
)
def test_bad_inputs_name_their_field(call, match):
    with pytest.raises(ValueError, match=match):
        call()
