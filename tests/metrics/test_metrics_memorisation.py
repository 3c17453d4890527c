"""Nearest-neighbour distances and memorisation statistics against brute force."""

import numpy as np
import pytest

from scorelib.metrics import memorisation_stats, nearest_neighbour_distances, nearest_neighbours
from scorelib.metrics.memorisation import leave_one_out_distances


def _brute(samples, train, exclude_self=False):
    s = samples.reshape(len(samples), -1).astype(np.float64)
    t = train.reshape(len(train), -1).astype(np.float64)
    d = np.array([[np.sqrt(np.sum((a - b) ** 2)) for b in t] for a in s])
    if exclude_self:
        np.fill_diagonal(d, np.inf)
    return np.sort(d, axis=1)


def test_against_brute_force_and_blocks():
    rng = np.random.default_rng(0)
    train = rng.uniform(-1, 1, (53, 4, 4, 1)).astype(np.float32)
    samples = rng.uniform(-1, 1, (37, 4, 4, 1)).astype(np.float32)
    ref = _brute(samples, train)
    for block in (16, 37, 256):
        d, idx = nearest_neighbours(samples, train, k=3, block_size=block)
        np.testing.assert_allclose(d, ref[:, :3], rtol=1e-5)
        # the indices point at images at those distances
        back = np.linalg.norm((samples[:, None] - train[idx]).reshape(37, 3, -1), axis=-1)
        np.testing.assert_allclose(back, d, rtol=1e-5)
    np.testing.assert_allclose(nearest_neighbour_distances(samples, train), ref[:, 0], rtol=1e-5)


def test_copy_has_distance_exactly_zero():
    rng = np.random.default_rng(1)
    train = rng.uniform(-1, 1, (40, 8, 8, 1)).astype(np.float32) * 30.0  # large norms
    samples = np.concatenate([train[[3, 17]], rng.uniform(-1, 1, (2, 8, 8, 1)).astype(np.float32)])
    d, idx = nearest_neighbours(samples, train)
    assert d[0, 0] == 0.0 and d[1, 0] == 0.0
    assert idx[0, 0] == 3 and idx[1, 0] == 17
    assert np.all(d[2:, 0] > 0)


def test_leave_one_out_with_duplicates():
    rng = np.random.default_rng(2)
    train = rng.standard_normal((20, 5)).astype(np.float32)
    train[7] = train[2]  # a duplicate at another index still counts
    d, idx = nearest_neighbours(train, train, k=2, exclude_self=True, block_size=8)
    np.testing.assert_allclose(
        d, _brute(train, train, exclude_self=True)[:, :2], rtol=1e-5, atol=1e-6
    )
    assert d[2, 0] == 0.0 and idx[2, 0] == 7 and d[7, 0] == 0.0 and idx[7, 0] == 2
    assert np.all(idx[:, 0] != np.arange(20))


def brute_copy_rate(samples, train, fraction=1 / 3):
    """The definition as a loop: a sample copies if ANY training point x_j lies closer to it
    than fraction x (x_j's own leave-one-out NN distance); float64."""
    s = samples.reshape(len(samples), -1).astype(np.float64)
    t = train.reshape(len(train), -1).astype(np.float64)
    r = [min(np.linalg.norm(t[j] - t[i]) for i in range(len(t)) if i != j) for j in range(len(t))]
    hits = [any(np.linalg.norm(a - t[j]) < fraction * r[j] for j in range(len(t))) for a in s]
    return float(np.mean(hits))


def test_copy_rate_uses_each_training_points_own_radius():
    # a dense cluster (radius ~0.01) and isolated points (radius ~10): samples 0.5 from an
    # isolated point copy it; 0.5 from a cluster point they do not; one global threshold
    # (a third of the median radius) would get both wrong
    rng = np.random.default_rng(5)
    cluster = 0.01 * rng.standard_normal((20, 3))
    isolated = np.diag([10.0, 20.0, 30.0])
    train = np.concatenate([cluster, isolated]).astype(np.float32)
    near_isolated = isolated + np.array([0.5, 0.0, 0.0])
    near_cluster = cluster[:3] + np.array([0.0, 0.0, 0.5])
    samples = np.concatenate([near_isolated, near_cluster]).astype(np.float32)
    st = memorisation_stats(samples, train)
    assert st["copy_rate"] == pytest.approx(brute_copy_rate(samples, train)) == 0.5
    assert memorisation_stats(near_isolated, train)["copy_rate"] == 1.0
    assert memorisation_stats(near_cluster, train)["copy_rate"] == 0.0


def test_copies_against_held_out_digits():
    from scorelib.data import load_digits

    ds = load_digits()
    train, test = np.asarray(ds.train), np.asarray(ds.test)
    rng = np.random.default_rng(6)
    jittered = train[:300] + 0.02 * rng.standard_normal(train[:300].shape).astype(np.float32)
    bad = memorisation_stats(jittered, train, reference=test)
    good = memorisation_stats(test, train)  # 0.16 vs radii >= 0.66
    assert bad["copy_rate"] == 1.0 and bad["reference_copy_rate"] == good["copy_rate"] < 0.05
    assert memorisation_stats(train[:300], train)["copy_rate"] == 1.0


def test_memorisation_stats_brute_force():
    rng = np.random.default_rng(3)
    train = rng.standard_normal((30, 6)).astype(np.float32)
    ref_imgs = rng.standard_normal((12, 6)).astype(np.float32)
    samples = np.concatenate([train[:4], rng.standard_normal((6, 6)).astype(np.float32)])
    st = memorisation_stats(samples, train, ref_imgs)
    bs = _brute(samples, train)
    loo = np.median(_brute(train, train, exclude_self=True)[:, 0])
    br = _brute(ref_imgs, train)[:, 0]
    assert st["sample_nn_mean"] == pytest.approx(bs[:, 0].mean(), rel=1e-5)
    assert st["train_loo_nn_median"] == pytest.approx(loo, rel=1e-5)
    assert st["copy_rate"] == pytest.approx(brute_copy_rate(samples, train))
    assert st["copy_rate"] >= 0.4  # the four copies
    assert st["reference_copy_rate"] == pytest.approx(brute_copy_rate(ref_imgs, train))
    assert st["ratio_copy_rate"] == pytest.approx(np.mean(bs[:, 0] / bs[:, 1] < 1 / 3))
    assert st["reference_nn_mean"] == pytest.approx(br.mean(), rel=1e-5)
    assert st["nn_mean_ratio"] == pytest.approx(bs[:, 0].mean() / br.mean(), rel=1e-5)
    again = memorisation_stats(samples, train, ref_imgs, train_loo=leave_one_out_distances(train))
    assert again == st
    with pytest.raises(ValueError, match="train_loo"):
        memorisation_stats(samples, train, train_loo=np.ones(3))
    copies = memorisation_stats(train[:10], train)
    assert copies["sample_nn_mean"] == 0.0 and copies["copy_rate"] == 1.0
    assert "nn_mean_ratio" not in copies


def test_errors():
    with pytest.raises(ValueError, match=r"^train must have shape \[m, \*shape=\(3,\)\]"):
        nearest_neighbours(np.zeros((2, 3)), np.zeros((4, 2)))
    with pytest.raises(ValueError, match="k must be"):
        nearest_neighbours(np.zeros((2, 3)), np.zeros((2, 3)), k=2, exclude_self=True)
