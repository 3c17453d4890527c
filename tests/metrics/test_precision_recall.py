"""Improved precision/recall (k-NN manifolds) against brute force, on known overlaps and
on a mode-dropping sample, and on real digits against a Gaussian fit."""

import numpy as np
import pytest

from scorelib.data.images import load_digits, quantise
from scorelib.metrics import knn_radii, precision_recall
from scorelib.metrics.baselines import gaussian_baseline


def _brute(real, fake, k):
    def radii(x):
        d = np.array([[np.sqrt(np.sum((p - q) ** 2)) for q in x] for p in x])
        np.fill_diagonal(d, np.inf)
        return np.sort(d, axis=1)[:, k - 1]

    def inside(q, s, r):
        return np.mean(
            [any(np.sqrt(np.sum((p - s[j]) ** 2)) <= r[j] for j in range(len(s))) for p in q]
        )

    return inside(fake, real, radii(real)), inside(real, fake, radii(fake)), radii(real)


def test_against_brute_force_and_blocks():
    rng = np.random.default_rng(0)
    real = rng.normal(size=(41, 3))
    fake = rng.normal(size=(37, 3)) * 1.5 + 0.5
    for k in (1, 3):
        p, r, rad = _brute(real, fake, k)
        np.testing.assert_allclose(knn_radii(real, k=k, block_size=7), rad, rtol=1e-12)
        for block in (5, 256):
            out = precision_recall(real, fake, k=k, block_size=block)
            assert out["precision"] == pytest.approx(p) and out["recall"] == pytest.approx(r)


def _mixture(rng, n, centres):
    c = centres[rng.integers(0, len(centres), n)]
    return c + rng.normal(size=(n, centres.shape[1]))


def test_known_overlap_and_mode_dropping():
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 0.0], [30.0, 0.0], [0.0, 30.0], [30.0, 30.0]])
    n = 2000
    real = _mixture(rng, n, centres)
    good = precision_recall(real, _mixture(rng, n, centres))
    assert good["precision"] > 0.9 and good["recall"] > 0.9, good
    # half the samples fall far from the data: precision halves, recall stays
    junk = np.concatenate([_mixture(rng, n // 2, centres), rng.normal(size=(n // 2, 2)) - 100])
    half = precision_recall(real, junk)
    assert abs(half["precision"] - 0.5 * good["precision"]) < 0.03, half
    assert half["recall"] > 0.85, half
    # a sampler that drops two of four modes: recall halves, precision does not fall
    dropped = precision_recall(real, _mixture(rng, n, centres[:2]))
    assert dropped["precision"] > 0.9, dropped
    assert abs(dropped["recall"] - 0.5 * good["recall"]) < 0.03, dropped
    # disjoint sets
    far = precision_recall(real, real + 1000.0)
    assert far == {"precision": 0.0, "recall": 0.0}


def test_digits_floor_vs_gaussian_fit():
    d = load_digits()
    n = d.test.shape[0]
    rng = np.random.default_rng(0)
    floor = precision_recall(d.test, d.train[rng.choice(d.train.shape[0], n, replace=False)])
    gauss = precision_recall(d.test, quantise(gaussian_baseline(d.train, n, seed=0), d.levels))
    assert gauss["precision"] < floor["precision"] - 0.3, (floor, gauss)


def test_errors():
    with pytest.raises(ValueError, match=r"^fake must have shape \[m, \*shape=\(2,\)\]"):
        precision_recall(np.zeros((5, 2)), np.zeros((5, 3)))
    with pytest.raises(ValueError, match="k must be an integer in"):
        precision_recall(np.zeros((5, 2)), np.ones((4, 2)), k=4)
    with pytest.raises(ValueError, match="k must be an integer in"):
        knn_radii(np.zeros((5, 2)), k=0)
