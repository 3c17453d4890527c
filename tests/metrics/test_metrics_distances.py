"""Pairwise distances, SW2, energy distance and RBF-MMD against brute-force loops and closed
forms."""

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from scorelib.metrics import (
    energy_distance,
    mean_paired_distance,
    median_bandwidth,
    mmd_rbf,
    sample_distances,
    sliced_wasserstein2,
    squared_distances,
    wasserstein2_1d,
)


def _w2sq_by_replication(u, v):
    """Exact W2^2 of equal-weight empirical measures: replicate to a common size, sort, pair."""
    n, m = len(u), len(v)
    L = math.lcm(n, m)
    a = np.sort(np.repeat(u, L // n))
    b = np.sort(np.repeat(v, L // m))
    return np.mean((a - b) ** 2)


def test_sw2_1d_is_exact_w2():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(200), 0.5 + 2 * rng.standard_normal(200)
    exact = np.sqrt(np.mean((np.sort(x) - np.sort(y)) ** 2))
    assert sliced_wasserstein2(x[:, None], y[:, None]) == pytest.approx(exact, rel=1e-12)
    # different sizes
    for n, m in [(7, 5), (12, 18), (1, 4)]:
        u, v = rng.standard_normal(n), rng.standard_normal(m) + 1.0
        ref = _w2sq_by_replication(u, v)
        assert wasserstein2_1d(u, v) == pytest.approx(ref, rel=1e-12)
        assert sliced_wasserstein2(u[:, None], v[:, None]) == pytest.approx(np.sqrt(ref), rel=1e-12)


def test_sw2_shifted_gaussians():
    rng = np.random.default_rng(1)
    d, n = 3, 4000
    delta = np.array([1.5, -1.0, 2.0])
    x = rng.standard_normal((n, d))
    y = rng.standard_normal((n, d)) + delta
    # E_theta (theta . delta)^2 = |delta|^2 / d for theta uniform on the sphere
    expected = np.linalg.norm(delta) / np.sqrt(d)
    sw = sliced_wasserstein2(x, y, n_projections=2000, seed=0)
    assert sw == pytest.approx(expected, rel=0.03)
    assert sliced_wasserstein2(x, rng.standard_normal((n, d)), n_projections=200) < 0.05
    # 1-D: W2 between N(0,1) and N(delta,1) is |delta|
    assert sliced_wasserstein2(x[:, :1], x[:, :1] + 0.7) == pytest.approx(0.7, rel=1e-9)


def test_sw2_seeded():
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((50, 4)), rng.standard_normal((60, 4))
    assert sliced_wasserstein2(x, y, seed=3) == sliced_wasserstein2(x, y, seed=3)
    assert sliced_wasserstein2(x, y, seed=3) != sliced_wasserstein2(x, y, seed=4)


def _energy_loop(x, y):
    dist = lambda a, b: math.sqrt(sum((ai - bi) ** 2 for ai, bi in zip(a, b, strict=True)))
    exy = sum(dist(a, b) for a, b in itertools.product(x, y)) / (len(x) * len(y))
    exx = sum(dist(a, b) for a, b in itertools.product(x, x)) / len(x) ** 2
    eyy = sum(dist(a, b) for a, b in itertools.product(y, y)) / len(y) ** 2
    return 2 * exy - exx - eyy


def test_energy_distance_brute_force():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((5, 3)), rng.standard_normal((7, 3)) + 0.3
    assert energy_distance(x, y) == pytest.approx(_energy_loop(x.tolist(), y.tolist()), rel=1e-10)
    # images are flattened
    assert energy_distance(x.reshape(5, 3, 1), y.reshape(7, 3, 1)) == pytest.approx(
        energy_distance(x, y), rel=1e-12
    )


def test_energy_distance_matches_scipy_1d():
    rng = np.random.default_rng(4)
    u, v = rng.standard_normal(40), rng.exponential(size=30)
    assert energy_distance(u[:, None], v[:, None]) == pytest.approx(
        scipy.stats.energy_distance(u, v) ** 2, rel=1e-9
    )


def test_energy_distance_identical_and_separated():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 2))
    assert abs(energy_distance(x, x.copy())) < 1e-12
    same = energy_distance(x, rng.standard_normal((300, 2)))
    far = energy_distance(x, rng.standard_normal((300, 2)) + 1.0)
    assert same < 0.05 < 0.3 < far


def _mmd_loop(x, y, h, unbiased):
    k = lambda a, b: math.exp(
        -sum((ai - bi) ** 2 for ai, bi in zip(a, b, strict=True)) / (2 * h * h)
    )
    n, m = len(x), len(y)
    if unbiased:
        kxx = sum(k(x[i], x[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
        kyy = sum(k(y[i], y[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    else:
        kxx = sum(k(a, b) for a in x for b in x) / n**2
        kyy = sum(k(a, b) for a in y for b in y) / m**2
    kxy = sum(k(a, b) for a in x for b in y) / (n * m)
    return kxx + kyy - 2 * kxy


@pytest.mark.parametrize("unbiased", [False, True])
def test_mmd_brute_force(unbiased):
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((6, 2)), rng.standard_normal((4, 2)) + 0.5
    ref = _mmd_loop(x.tolist(), y.tolist(), 0.8, unbiased)
    assert mmd_rbf(x, y, 0.8, unbiased=unbiased) == pytest.approx(ref, rel=1e-10, abs=1e-14)


def test_median_heuristic_brute_force():
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((9, 3)), rng.standard_normal((6, 3))
    z = np.concatenate([x, y])
    pair = [np.linalg.norm(z[i] - z[j]) for i in range(15) for j in range(i + 1, 15)]
    assert median_bandwidth(x, y) == pytest.approx(np.median(pair), rel=1e-10)
    assert mmd_rbf(x, y) == pytest.approx(mmd_rbf(x, y, np.median(pair)), rel=1e-10)


def test_mmd_identical_and_separated():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((300, 2))
    assert abs(mmd_rbf(x, x.copy())) < 1e-12
    same = mmd_rbf(x, rng.standard_normal((300, 2)), unbiased=True)
    far = mmd_rbf(x, rng.standard_normal((300, 2)) + 1.0, unbiased=True)
    assert abs(same) < 0.01 and far > 0.05


def test_input_errors():
    x = np.zeros((4, 2))
    with pytest.raises(ValueError, match=r"^y must have shape \[m, \*shape=\(2,\)\]"):
        energy_distance(x, np.zeros((4, 3)))
    with pytest.raises(ValueError, match="finite"):
        mmd_rbf(x, np.full((4, 2), np.nan), 1.0)
    with pytest.raises(ValueError, match="bandwidth"):
        mmd_rbf(x, x)  # median of all-zero distances
    with pytest.raises(ValueError, match="n_projections"):
        sliced_wasserstein2(x, x + 1, n_projections=0)


def test_squared_distances_brute_force_and_exact_zero():
    rng = np.random.default_rng(4)
    a = 50.0 + rng.standard_normal((7, 2, 3))  # large norms: the expanded form cancels
    b = np.concatenate([a[[4]], a[[1]] + 1e-7, 50.0 + rng.standard_normal((3, 2, 3))])
    d2 = squared_distances(a, b)
    brute = np.array([[np.sum((x - y) ** 2) for y in b] for x in a])
    np.testing.assert_allclose(d2, brute, rtol=1e-8, atol=0)
    assert d2[4, 0] == 0.0 and d2[1, 1] == pytest.approx(6e-14, rel=1e-6)
    with pytest.raises(ValueError, match=r"^b must have shape \[m, \*shape=\(3,\)\]"):
        squared_distances(np.zeros((2, 3)), np.zeros((2, 4)))


def test_sample_distances_reports_failed_samples_as_nan():
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((50, 3)), rng.standard_normal((60, 3))
    got = sample_distances(x, y, n_projections=8, seed=2)
    assert got == {
        "energy": energy_distance(x, y),
        "sw2": sliced_wasserstein2(x, y, n_projections=8, seed=2),
    }
    x[3, 1] = np.inf
    assert all(math.isnan(v) for v in sample_distances(x, y).values())


def test_mean_paired_distance_is_a_loop_over_pairs():
    rng = np.random.default_rng(9)
    x, y = rng.normal(size=(7, 2, 3)), rng.normal(size=(7, 2, 3))
    loop = np.mean(
        [math.sqrt(sum(((u - v) ** 2).ravel().tolist())) for u, v in zip(x, y, strict=True)]
    )
    assert mean_paired_distance(x, y) == pytest.approx(loop, rel=1e-12)
    assert mean_paired_distance(x, x) == 0.0
    with pytest.raises(
        ValueError, match=r"^y must have shape \[n=\d+, \*shape=.*\(the shape of x\)"
    ):
        mean_paired_distance(x, y[:3])
