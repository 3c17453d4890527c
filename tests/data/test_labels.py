"""Class labels with every batch (issue 36, item 1): images, toys and targets.

The labels belong to their rows (images: read from the label table by the same index; toys:
recomputed from each point, e.g. the nearest 8gaussians component; targets: the component),
the points are exactly those drawn without labels, and the batches keep the contract of
``tests/data/test_data_batching.py``: the same call gives the same batch, the processes'
local batches concatenate to the global one, a batch is a prefix of a larger one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.data import (
    TOY_CLASSES,
    TOY_NAMES,
    ImageDataset,
    ManyWellTarget,
    get_batch,
    get_dequantised_batch,
    level_spacing,
    ring_means,
    toy_batch,
    toy_sample,
)
from scorelib.data.targets import GaussianMixtureTarget
from scorelib.processes import VP
from scorelib.scores import MixtureScore, PerClassScore

N_ROWS = 50


@pytest.fixture(scope="module")
def table():
    """Rows holding their own index (so a row says where it came from) and random labels."""
    data = np.repeat(np.arange(N_ROWS, dtype=np.float32)[:, None], 3, axis=1)
    labels = np.random.default_rng(0).integers(0, 10, N_ROWS).astype(np.int32)
    return data, labels


# --------------------------------------------------------------------------- images


def test_image_labels_belong_to_their_rows_in_python_and_jit(table):
    data, labels = table
    x, y = get_batch(data, 16, seed=1, step=7, labels=labels)
    assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and y.dtype == np.int32
    np.testing.assert_array_equal(y, labels[x[:, 0].astype(int)])
    np.testing.assert_array_equal(x, get_batch(data, 16, seed=1, step=7))  # rows unchanged
    fn = jax.jit(lambda d, lab, s, p: get_batch(d, 16, seed=1, step=s, process_index=p, labels=lab))
    xj, yj = fn(jnp.asarray(data), jnp.asarray(labels), 7, 0)
    assert yj.dtype == jnp.int32
    np.testing.assert_array_equal(xj, x)
    np.testing.assert_array_equal(yj, y)


def test_image_label_batches_keep_the_batch_contract(table):
    data, labels = table
    x, y = get_batch(data, 8, seed=0, step=3, labels=labels)
    x2, y2 = get_batch(data, 8, seed=0, step=3, labels=labels)
    np.testing.assert_array_equal(y2, y)
    parts = [get_batch(data, 4, seed=0, step=3, process_index=p, labels=labels) for p in (0, 1)]
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)
    xl, yl = get_batch(data, 20, seed=0, step=3, labels=labels)
    np.testing.assert_array_equal(yl[:8], y)  # prefix
    np.testing.assert_array_equal(xl[:8], x)
    assert not np.array_equal(get_batch(data, 8, seed=0, step=4, labels=labels)[1], y)


def test_dequantised_batch_with_labels(table):
    data, labels = table
    delta = level_spacing(256)
    x, y = get_dequantised_batch(data, 8, delta, seed=2, step=5, labels=labels)
    np.testing.assert_array_equal(x, get_dequantised_batch(data, 8, delta, seed=2, step=5))
    rows, want = get_batch(data, 8, seed=2, step=5, labels=labels)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(y, labels[rows[:, 0].astype(int)])


@pytest.mark.parametrize(
    "bad",
    [np.zeros(N_ROWS, np.float32), np.zeros(N_ROWS - 1, np.int32), np.zeros((N_ROWS, 1), int)],
    ids=["float", "short", "2d"],
)
def test_bad_image_labels_name_the_field(table, bad):
    with pytest.raises(ValueError, match=r"^data\.labels must be integer class labels"):
        get_batch(table[0], 4, seed=0, step=0, labels=bad)


def test_image_dataset_classes():
    x = np.zeros((6, 2, 2, 1), np.float32)
    ds = ImageDataset("u", x, x[:2], np.array([0, 1, 2, 0, 1, 2]), np.array([4, 0]))
    assert ds.num_classes == 5
    np.testing.assert_array_equal(ds.require_labels(), [0, 1, 2, 0, 1, 2])
    none = ImageDataset("plain", x)
    assert none.num_classes is None
    with pytest.raises(ValueError, match=r"^data\.labels must be false for 'plain'"):
        none.require_labels()
    neg = ImageDataset("neg", x, train_labels=np.array([0, -1, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"^data\.labels"):
        neg.require_labels()


# --------------------------------------------------------------------------- toys


def _classes_from_points(name: str, x: np.ndarray) -> np.ndarray:
    """Each point's class recomputed from the point alone (module docstring of toy.py)."""
    if name == "8gaussians":
        return np.argmin(((x[:, None] - ring_means()[None]) ** 2).sum(-1), axis=1)
    if name == "checkerboard":
        col, row = np.floor(x[:, 0] + 2.0), np.floor(x[:, 1] + 2.0)
        return (2 * col + row // 2).astype(int)
    if name == "rings":
        r = np.linalg.norm(x, axis=1)
        return np.argmin(np.abs(r[:, None] - np.array([0.5, 1.0, 1.5, 2.0])[None]), axis=1)
    if name == "moons":
        th = np.linspace(0.0, np.pi, 400)  # 0.008 apart: far below the noise (0.05)
        arcs = [
            np.stack([np.cos(th), np.sin(th)], -1),  # 0: upper
            np.stack([1.0 - np.cos(th), 0.5 - np.sin(th)], -1),  # 1: lower
        ]
        p = x / 2.0 + np.array([0.5, 0.25])
        dist = [np.min(np.linalg.norm(p[:, None] - a[None], axis=-1), axis=1) for a in arcs]
        return np.argmin(np.stack(dist, 1), axis=1)
    if name == "pinwheel":  # angle = 2 pi k / 5 + 0.25 exp(r) + atan(tangential / r)
        r = np.linalg.norm(x, axis=1) / 2.0
        phi = np.arctan2(x[:, 1], x[:, 0]) - 0.25 * np.exp(r)
        return np.mod(np.round(phi / (2 * np.pi / 5)), 5).astype(int)
    raise AssertionError(name)


#: the share of points whose recomputed class must agree (noise can cross a border: the
#: 8gaussians' neighbours are 3.8 stds from the midpoint, the rings 5, the moons 5)
AGREE = {"8gaussians": 0.997, "checkerboard": 1.0, "rings": 0.997, "moons": 0.997, "pinwheel": 0.98}


@pytest.mark.parametrize("name", [n for n in TOY_NAMES if TOY_CLASSES[n]])
def test_toy_classes_are_read_from_the_points(name):
    """Recomputed from the point, the class agrees (random labels would agree 1/K of the
    time); every class occurs; the points are exactly those drawn without labels."""
    k = TOY_CLASSES[name]
    x, y = toy_sample(name, 3000, 4, labels=True)
    assert y.dtype == np.int32 and y.shape == (3000,)
    np.testing.assert_array_equal(x, toy_sample(name, 3000, 4))
    assert set(np.unique(y)) == set(range(k))
    agree = np.mean(_classes_from_points(name, x) == y)
    assert agree >= AGREE[name], agree


def test_toy_label_batches_keep_the_batch_contract():
    name = "moons"
    x, y = toy_batch(name, 8, seed=3, step=11, labels=True)
    np.testing.assert_array_equal(x, toy_batch(name, 8, seed=3, step=11))  # points unchanged
    x2, y2 = toy_batch(name, 8, seed=3, step=11, labels=True)
    np.testing.assert_array_equal(y2, y)
    parts = [toy_batch(name, 4, seed=3, step=11, process_index=p, labels=True) for p in (0, 1)]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)  # processes;
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)  # 4 a prefix of 8
    assert not np.array_equal(toy_batch(name, 8, seed=3, step=12, labels=True)[0], x)
    _, ys = toy_sample(name, 30, 4, labels=True)
    np.testing.assert_array_equal(toy_sample(name, 10, 4, labels=True)[1], ys[:10])


def test_a_toy_without_classes_refuses_labels():
    assert TOY_CLASSES["swissroll"] is None
    for call in (
        lambda: toy_batch("swissroll", 4, seed=0, step=0, labels=True),
        lambda: toy_sample("swissroll", 4, 0, labels=True),
    ):
        with pytest.raises(ValueError, match=r"^data\.labels must be false for toy 'swissroll'"):
            call()


# --------------------------------------------------------------------------- targets


@pytest.fixture(scope="module")
def separated():
    """Three well-separated components (6 stds apart at least): the nearest mean is the
    component."""
    return GaussianMixtureTarget.create(
        weights=[0.2, 0.5, 0.3],
        means=[[-4.0, 0.0], [0.0, 3.0], [4.0, -1.0]],
        stds=[0.3, 0.5, 0.4],
        name="sep",
    )


def test_target_labels_are_the_components_and_points_are_unchanged(separated):
    t = separated
    assert t.num_classes == 3
    x, y = t.batch(600, seed=2, step=9, labels=True)
    np.testing.assert_array_equal(x, t.batch(600, seed=2, step=9))
    nearest = np.argmin(((np.asarray(x)[:, None] - t.means[None]) ** 2).sum(-1), axis=1)
    np.testing.assert_array_equal(nearest, y)
    counts = np.bincount(np.asarray(y), minlength=3)
    np.testing.assert_allclose(counts / 600, t.weights, atol=4 * np.sqrt(0.25 / 600))
    parts = [t.batch(300, seed=2, step=9, process_index=p, labels=True) for p in (0, 1)]
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)
    xs, ys = t.sample(jax.random.key(5), 300, labels=True)  # the compiled shape of a batch
    np.testing.assert_array_equal(xs, t.sample(jax.random.key(5), 300))


def test_conditional_clean_score_against_float64():
    """``score_given(x, k)`` is component k's score ``-C_k^{-1} (x - m_k)`` (full covariances,
    solved in float64 numpy here); the null label is the mixture's score."""
    t = GaussianMixtureTarget.create(
        weights=[0.3, 0.7],
        means=[[0.5, -1.0, 0.2], [-0.4, 0.8, 1.0]],
        covs=[
            [[0.5, 0.1, 0.0], [0.1, 0.3, 0.05], [0.0, 0.05, 0.4]],
            [[0.2, -0.05, 0.02], [-0.05, 0.6, 0.1], [0.02, 0.1, 0.3]],
        ],
    )
    x = np.random.default_rng(1).normal(size=(7, 3)).astype(np.float32)
    labels = np.array([0, 1, 2, 1, 0, 2, 0], np.int32)  # 2: the null label
    both = jax.jit(lambda z, y: (t.score_given(z, y), t.score(z)))
    got, mix = (np.asarray(v, np.float64) for v in both(jnp.asarray(x), jnp.asarray(labels)))
    for b in range(7):
        if labels[b] == 2:
            want = mix[b]
        else:
            k = labels[b]
            want = -np.linalg.solve(t.covs[k], x[b].astype(np.float64) - t.means[k])
        np.testing.assert_allclose(got[b], want, rtol=2e-5, atol=2e-5)
    with pytest.raises(ValueError, match=r"^labels must be class labels in \[0, 1\]"):
        t.score_given(jnp.asarray(x), jnp.full((7,), 3, jnp.int32))


def test_conditional_noisy_source_is_each_component_under_the_process(separated):
    """``noisy_score(process, conditional=True)``: class k is N(alpha m_k, alpha^2 C_k +
    sigma^2 I); the null label is the mixture's noisy score; the prior is the weights."""
    proc = VP()
    src = separated.noisy_score(proc, conditional=True)
    assert isinstance(src, PerClassScore) and src.num_classes == 3
    np.testing.assert_allclose(np.exp(np.asarray(src.log_prior)), separated.weights, rtol=1e-6)
    x = jnp.asarray(np.random.default_rng(2).normal(size=(5, 2)) * 3, jnp.float32)
    tt = jnp.asarray([0.1, 0.3, 0.5, 0.7, 0.9], jnp.float32)
    labels = jnp.asarray([0, 1, 2, 3, 1], jnp.int32)
    mixture = separated.noisy_score(proc)
    assert isinstance(mixture, MixtureScore)
    both = jax.jit(lambda c, m: (c.with_labels(labels).score(x, tt), m.score(x, tt)))
    got, mix = (np.asarray(v, np.float64) for v in both(src, mixture))
    a, s = np.asarray(proc.alpha(tt), np.float64), np.asarray(proc.sigma(tt), np.float64)
    for b in range(5):
        k = int(labels[b])
        if k == 3:
            want = mix[b]
        else:
            cov = a[b] ** 2 * separated.covs[k] + s[b] ** 2 * np.eye(2)
            want = -np.linalg.solve(cov, np.asarray(x[b], np.float64) - a[b] * separated.means[k])
        np.testing.assert_allclose(got[b], want, rtol=1e-4, atol=1e-4)


def test_targets_without_classes_refuse_labels():
    mw = ManyWellTarget.create(2, grid_size=1001)
    assert mw.num_classes is None
    calls = (
        lambda: mw.batch(4, seed=0, step=0, labels=True),
        lambda: mw.sample(jax.random.key(0), 4, labels=True),
        lambda: mw.score_given(jnp.zeros((1, 2)), jnp.zeros((1,), jnp.int32)),
        lambda: mw.noisy_score(VP(), conditional=True),
    )
    for call in calls:
        with pytest.raises(ValueError, match=r"^data\.labels must be false for target"):
            call()
