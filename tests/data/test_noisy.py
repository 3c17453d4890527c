"""Noisy training data (scorelib/data/noisy.py): one fixed Gaussian draw per example."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from scorelib.data import ImageDataset, corrupt, noisy_dataset

X = np.linspace(-1, 1, 40 * 6, dtype=np.float32).reshape(40, 2, 3)


def test_the_noise_is_standard_normal_and_scaled():
    y = corrupt(np.zeros((4000, 5), np.float32), 0.3, seed=0)
    n = y / 0.3
    assert y.dtype == np.float32
    assert stats.kstest(n.ravel(), "norm").pvalue > 1e-3
    for a, b in ((n[:, 0], n[:, 1]), (n[1:, 0], n[:-1, 0])):  # coordinates, neighbours
        assert abs(np.corrcoef(a, b)[0, 1]) < 4 / np.sqrt(len(a))
    assert np.abs(y).max() > 1.0  # neither clipped nor quantised


def test_deterministic_by_seed_and_per_example():
    """The same seed gives the same set; example i's noise depends only on (seed, i): not on
    the set's size, its chunks, or an offset part corrupted alone."""
    y = corrupt(X, 0.5, seed=3)
    np.testing.assert_array_equal(y, corrupt(X, 0.5, seed=3))
    np.testing.assert_array_equal(y[:7], corrupt(X[:7], 0.5, seed=3))
    np.testing.assert_array_equal(y, corrupt(X, 0.5, seed=3, chunk=6))
    np.testing.assert_array_equal(y[10:], corrupt(X[10:], 0.5, seed=3, first_index=10))
    other = corrupt(X, 0.5, seed=4)
    assert np.all(np.abs(other - y).reshape(40, -1).max(-1) > 0)
    # noise_sigma only scales the same draw
    np.testing.assert_allclose(corrupt(X, 0.25, seed=3) - X, 0.5 * (y - X), rtol=1e-5, atol=1e-7)


def test_noisy_dataset_corrupts_the_training_split_only():
    ds = ImageDataset("toy", train=X[:30], test=X[30:], levels=17)
    nd = noisy_dataset(ds, 0.2, seed=1)
    assert nd.noise_sigma == 0.2 and ds.noise_sigma == 0.0
    np.testing.assert_array_equal(nd.train, corrupt(X[:30], 0.2, seed=1))
    assert nd.test is ds.test and nd.levels == 17 and nd.name == "toy"
    with pytest.raises(ValueError, match=r"^data\.noise_sigma: toy is already noisy"):
        noisy_dataset(nd, 0.2)


@pytest.mark.parametrize("value", [0.0, -0.1, float("nan"), float("inf"), "0.2", None, True])
def test_bad_noise_sigma_names_the_field(value):
    with pytest.raises(ValueError, match=r"^data\.noise_sigma must be a number in \(0\.0, inf\)"):
        corrupt(X, value, seed=0)
    with pytest.raises(ValueError) as e:
        noisy_dataset(ImageDataset("toy", train=X), value)
    assert str(e.value).startswith("data.noise_sigma") and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"seed": -1}, r"^seed must be an integer >= 0"),
        ({"seed": 0, "chunk": 0}, r"^chunk must be an integer >= 1"),
        ({"seed": 0, "first_index": -2}, r"^first_index must be an integer >= 0"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        corrupt(X, 0.1, **kwargs)
    with pytest.raises(ValueError, match=r"^x must be \[n, \*data_shape\] with n >= 1"):
        corrupt(np.zeros((0, 3)), 0.1, seed=0)
