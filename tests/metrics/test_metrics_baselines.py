"""The Gaussian baseline: its draws have the data's mean and covariance (and nothing more)."""

import numpy as np
import pytest

from scorelib.metrics.baselines import gaussian_baseline


def test_draws_have_the_fitted_mean_and_covariance():
    rng = np.random.default_rng(0)
    # data with a known, non-diagonal covariance, shaped like tiny images [m, 2, 2, 1]
    a = rng.standard_normal((4, 4))
    train = (rng.standard_normal((500, 4)) @ a + np.array([1.0, -2.0, 0.5, 3.0])).reshape(
        500, 2, 2, 1
    )
    n = 200_000
    x = gaussian_baseline(train, n, seed=1)
    assert x.shape == (n, 2, 2, 1) and x.dtype == np.float32
    flat, data = x.reshape(n, -1).astype(np.float64), train.reshape(500, -1)
    mean, cov = data.mean(0), np.cov(data, rowvar=False)  # the fit, computed independently
    # sampling error of the mean of n draws: sqrt(diag(cov) / n); allow 5 standard errors
    assert np.all(np.abs(flat.mean(0) - mean) < 5 * np.sqrt(np.diag(cov) / n))
    # covariance entries: std of the estimate ~ sqrt((c_ii c_jj + c_ij^2) / n)
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / n)
    assert np.all(np.abs(np.cov(flat, rowvar=False) - cov) < 5 * se)


def test_singular_covariance_and_determinism():
    rng = np.random.default_rng(0)
    train = np.zeros((50, 3))
    train[:, 0] = rng.standard_normal(50)
    train[:, 1] = 2 * train[:, 0]  # rank 1, and a constant coordinate
    x = gaussian_baseline(train, 1000, seed=3)
    assert np.all(np.isfinite(x))
    np.testing.assert_allclose(x[:, 1], 2 * x[:, 0], atol=1e-4)  # stays on the data's line
    np.testing.assert_allclose(x[:, 2], 0.0, atol=1e-6)
    np.testing.assert_array_equal(x, gaussian_baseline(train, 1000, seed=3))
    assert not np.array_equal(x, gaussian_baseline(train, 1000, seed=4))


@pytest.mark.parametrize(
    "train, n, match",
    [
        (np.zeros((1, 3)), 5, "m >= 2"),
        (np.full((4, 2), np.nan), 5, "finite"),
        (np.zeros((4, 2)), 0, "n must be"),
    ],
)
def test_bad_input_is_refused(train, n, match):
    with pytest.raises(ValueError, match=match):
        gaussian_baseline(train, n, seed=0)
