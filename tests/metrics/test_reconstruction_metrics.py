"""scorelib.metrics.reconstruction: PSNR against its formula, SSIM's identity and its
ordering of a good and a bad reconstruction, the central-interval coverage of exact
Gaussian draws at its level (within the binomial standard error) and below it for
overconfident draws, the posterior std and data consistency against numpy, and bad input
refused naming the argument."""

from __future__ import annotations

import numpy as np
import pytest

from scorelib.data.images import load_digits
from scorelib.metrics import reconstruction as rm


def _images(n=6, seed=0):
    return load_digits().test[:n].astype(np.float64)


def test_psnr_is_the_mse_formula_per_example_and_per_draw():
    rng = np.random.default_rng(0)
    truth = _images()
    x = truth + 0.1 * rng.standard_normal(truth.shape)
    mse = ((x - truth) ** 2).reshape(len(x), -1).mean(axis=1)
    np.testing.assert_allclose(rm.psnr(x, truth), 10 * np.log10(4.0 / mse), rtol=1e-12)
    np.testing.assert_allclose(
        rm.psnr(x, truth, data_range=1.0), 10 * np.log10(1.0 / mse), rtol=1e-12
    )
    draws = np.stack([x, truth + 0.3], axis=1)  # [n, 2, ...]
    got = rm.psnr(draws, truth)
    assert got.shape == (len(x), 2)
    np.testing.assert_allclose(got[:, 0], 10 * np.log10(4.0 / mse), rtol=1e-12)
    np.testing.assert_allclose(got[:, 1], 10 * np.log10(4.0 / 0.09), rtol=1e-12)
    assert np.all(rm.psnr(truth, truth) == np.inf)  # exact: inf, no warning
    bad = x.copy()
    bad[2, 0, 0, 0] = np.nan
    assert np.isnan(rm.psnr(bad, truth)[2]) and np.all(np.isfinite(rm.psnr(bad, truth)[:2]))
    points = np.array([[0.0, 1.0], [2.0, 2.0]])  # flat data too
    np.testing.assert_allclose(rm.psnr(points + 0.5, points), 10 * np.log10(4 / 0.25))


def test_ssim_is_one_on_identical_images_and_orders_good_before_bad():
    rng = np.random.default_rng(1)
    truth = _images()
    np.testing.assert_allclose(rm.ssim(truth, truth), 1.0, atol=1e-12)
    good = truth + 0.05 * rng.standard_normal(truth.shape)
    bad = truth + 0.5 * rng.standard_normal(truth.shape)
    s_good, s_bad = rm.ssim(good, truth), rm.ssim(bad, truth)
    assert np.all(s_good < 1) and np.all(s_good > s_bad + 0.1), (s_good, s_bad)
    both = rm.ssim(np.stack([good, bad], axis=1), truth)
    np.testing.assert_allclose(both, np.stack([s_good, s_bad], axis=1), rtol=1e-12)
    assert rm.ssim_window((8, 8, 1)) == 7 and rm.ssim_window((6, 5, 3)) == 5
    assert np.all(rm.ssim(truth[:, :4, :4], truth[:, :4, :4]) > 0.999)  # a 3x3 window fits


@pytest.mark.parametrize("k", [19, 39])
def test_coverage_of_exact_gaussian_draws_is_the_level(k):
    """Truth and draws from the same Gaussian (a calibrated posterior): the fraction of
    true entries inside the central 90% interval is 0.9 within 3 binomial standard errors
    (19 and 39 draws: integer order-statistic positions, so 0.9 exactly in expectation)."""
    rng = np.random.default_rng(k)
    n, d = 40, 8 * 8
    mean = rng.standard_normal((n, d))
    std = rng.uniform(0.2, 2.0, (n, d))  # a different posterior spread per pixel
    truth = mean + std * rng.standard_normal((n, d))
    draws = mean[:, None] + std[:, None] * rng.standard_normal((n, k, d))
    cov = rm.coverage(draws.reshape(n, k, 8, 8, 1), truth.reshape(n, 8, 8, 1))
    assert cov.shape == (n,)
    se = np.sqrt(0.9 * 0.1 / (n * d))
    assert abs(cov.mean() - 0.9) < 3 * se, (cov.mean(), se)
    assert rm.calibrated_coverage(k) == pytest.approx(0.9)
    # overconfident: draws at half the true spread cover far less (about 59%)
    narrow = mean[:, None] + 0.5 * std[:, None] * rng.standard_normal((n, k, d))
    assert rm.coverage(narrow, truth).mean() < 0.9 - 20 * se
    # numpy's default quantile position would show calibrated draws as overconfident
    lo, hi = np.quantile(draws, [0.05, 0.95], axis=1)
    assert ((truth >= lo) & (truth <= hi)).mean() < 0.9 - 5 * se


def test_calibrated_coverage_of_few_draws():
    assert rm.calibrated_coverage(5) == pytest.approx(4 / 6)  # smallest to largest of 5
    assert rm.calibrated_coverage(20) == pytest.approx(0.9)
    assert rm.interval_positions(19, 0.9) == (1.0, 19.0)


def test_posterior_std_and_data_consistency_against_numpy():
    rng = np.random.default_rng(2)
    draws = rng.standard_normal((3, 5, 4, 4, 1))
    np.testing.assert_allclose(rm.posterior_std(draws), draws.std(axis=1, ddof=1))
    y = rng.standard_normal((3, 7))
    ax = y[:, None] + 0.1 * np.ones((3, 5, 7))
    np.testing.assert_allclose(rm.data_consistency(ax, y), 0.1)
    np.testing.assert_allclose(rm.data_consistency(ax[:, 0], y), 0.1)
    assert rm.mean_std([1.0, 3.0]) == (2.0, 1.0)
    assert rm.mean_std([np.inf, np.inf]) == (np.inf, 0.0)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda t: rm.psnr(t[:2], t), "x must be"),
        (lambda t: rm.psnr(t[:, :4], t), "x must be"),
        (lambda t: rm.psnr(t, t, data_range=0), "data_range must be a number in (0"),
        (lambda t: rm.ssim(t.reshape(len(t), -1), t.reshape(len(t), -1)), "truth must be images"),
        (lambda t: rm.coverage(t[:, None], t), "draws must be [n, draws, *shape] with draws >= 2"),
        (lambda t: rm.coverage(np.stack([t, t], 1), t[:2]), "truth must be [n, *shape]"),
        (lambda t: rm.coverage(np.stack([t, t], 1), t, level=1.0), "level must be a number"),
        (lambda t: rm.data_consistency(np.zeros((2, 3)), np.zeros((2, 4))), "ax must be"),
        (lambda t: rm.calibrated_coverage(1), "draws must be an integer >= 2"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(call, field):
    with pytest.raises(ValueError) as e:
        call(_images(3))
    assert str(e.value).startswith(field), str(e.value)
