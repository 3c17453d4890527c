"""Image loaders: the bundled digits and MNIST subset, and user .npz files."""

import numpy as np
import pytest
from sklearn.datasets import load_digits as sk_digits

from scorelib.data import load_digits, load_mnist_subset, load_npz, stratified_split


def _rows(a):
    return {r.tobytes() for r in np.ascontiguousarray(a.reshape(a.shape[0], -1))}


def test_digits_split_and_scaling():
    d = load_digits()
    sk = sk_digits()
    assert d.train.shape[1:] == (8, 8, 1) and d.train.dtype == np.float32
    assert d.train.shape[0] + d.test.shape[0] == 1797
    assert d.data_shape == (8, 8, 1)
    # values: grey levels 0..16 -> [-1, 1], exactly
    ref = (sk.images.astype(np.float32) / 8.0 - 1.0)[..., None]
    assert d.train.min() == -1.0 and d.train.max() == 1.0
    all_imgs = np.concatenate([d.train, d.test])
    all_lab = np.concatenate([d.train_labels, d.test_labels])
    order_ref = np.lexsort(ref.reshape(1797, -1).T)
    order = np.lexsort(all_imgs.reshape(1797, -1).T)
    np.testing.assert_array_equal(all_imgs[order], ref[order_ref])
    np.testing.assert_array_equal(np.sort(all_lab), np.sort(sk.target))
    # stratified: each class contributes round(0.2 n_c) test images
    np.testing.assert_array_equal(
        np.bincount(d.test_labels), np.round(0.2 * np.bincount(sk.target)).astype(int)
    )
    assert d.sigma_data == pytest.approx(float(np.std(d.train.astype(np.float64))))
    # fixed: same split every call; another seed gives another split
    np.testing.assert_array_equal(load_digits().test, d.test)
    assert not np.array_equal(load_digits(seed=1).test, d.test)


def test_stratified_split_disjoint_and_complete():
    labels = np.repeat(np.arange(3), [10, 20, 30])
    tr, te = stratified_split(labels, 0.3, seed=0)
    assert np.intersect1d(tr, te).size == 0
    np.testing.assert_array_equal(np.union1d(tr, te), np.arange(60))
    np.testing.assert_array_equal(np.bincount(labels[te]), [3, 6, 9])
    with pytest.raises(ValueError):
        stratified_split(labels, 1.0, seed=0)


def test_mnist_subset():
    d = load_mnist_subset()
    assert d.train.shape == (4000, 28, 28, 1) and d.test.shape == (1000, 28, 28, 1)
    np.testing.assert_array_equal(np.bincount(d.test_labels), [100] * 10)
    np.testing.assert_array_equal(np.bincount(d.train_labels), [400] * 10)
    # the source is sorted by class; the splits are shuffled, so prefixes mix classes
    assert np.all(np.abs(np.bincount(d.train_labels[:1000]) - 100) < 40)
    assert d.train.min() == -1.0 and d.train.max() == 1.0
    # uint8 grid: (x + 1) * 127.5 is an integer
    v = (d.test.astype(np.float64) + 1.0) * 127.5
    np.testing.assert_allclose(v, np.round(v), atol=1e-3)
    assert len(_rows(d.train) & _rows(d.test)) < 5  # no overlap beyond chance duplicates


def test_npz_roundtrip(tmp_path):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (6, 4, 5, 3), dtype=np.uint8)
    test = rng.integers(0, 256, (2, 4, 5, 3), dtype=np.uint8)
    p = tmp_path / "cifar_small.npz"
    np.savez(p, images=imgs, test_images=test, labels=np.arange(6), test_labels=np.array([1, 2]))
    d = load_npz(p)
    np.testing.assert_allclose(d.train, imgs.astype(np.float64) / 127.5 - 1.0, atol=1e-6)
    np.testing.assert_allclose(d.test, test.astype(np.float64) / 127.5 - 1.0, atol=1e-6)
    assert d.data_shape == (4, 5, 3) and d.train.dtype == np.float32
    np.testing.assert_array_equal(d.train_labels, np.arange(6))
    # a custom key, no optional arrays
    q = tmp_path / "mnist_small.npz"
    np.savez(q, x_train=imgs[..., :1])
    d = load_npz(q, key="x_train")
    assert d.train.shape == (6, 4, 5, 1) and d.test is None and d.train_labels is None


def test_npz_errors_name_path_and_expectations(tmp_path):
    missing = tmp_path / "nope.npz"
    with pytest.raises(FileNotFoundError, match="nope.npz.*'images'.*uint8"):
        load_npz(missing)
    bad = tmp_path / "garbage.npz"
    bad.write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="garbage.npz.*'images'"):
        load_npz(bad)
    p = tmp_path / "wrongkey.npz"
    np.savez(p, x=np.zeros((2, 4, 4, 1), np.uint8))
    with pytest.raises(ValueError, match=r"wrongkey.npz: missing key 'images' \(found \['x'\]\)"):
        load_npz(p)
    p = tmp_path / "float.npz"
    np.savez(p, images=np.zeros((2, 4, 4, 1), np.float32))
    with pytest.raises(ValueError, match="float.npz.*float32.*uint8 \\[n, H, W, C\\]"):
        load_npz(p)
    p = tmp_path / "rank3.npz"
    np.savez(p, images=np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(ValueError, match=r"rank3.npz.*\(2, 28, 28\)"):
        load_npz(p)
    p = tmp_path / "labels.npz"
    np.savez(p, images=np.zeros((2, 4, 4, 1), np.uint8), labels=np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="labels.npz.*'labels'.*integer \\[2\\]"):
        load_npz(p)
    p = tmp_path / "mismatch.npz"
    np.savez(
        p, images=np.zeros((2, 4, 4, 1), np.uint8), test_images=np.zeros((2, 4, 4, 3), np.uint8)
    )
    with pytest.raises(ValueError, match="mismatch.npz.*'test_images'"):
        load_npz(p)
