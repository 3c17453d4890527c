"""Perceptual distances: one layer's term against a brute-force loop over positions and
channels; the digits-classifier distance is 0 on identical images, symmetric, and separates
digits of the same class (known good) from draws of a Gaussian fit to the digits (known
bad); LPIPS from an .npz of VGG16's shapes (random weights: the real ones cannot be fetched
here) and its one-line refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scorelib.data import load_digits
from scorelib.metrics import ClassifierConfig, FeatureExtractor
from scorelib.metrics.baselines import gaussian_baseline
from scorelib.metrics.perceptual import (
    VGG16Features,
    digits_classifier_distance,
    layer_distance,
    lpips_vgg16,
)


def test_layer_distance_is_the_loop_over_positions():
    rng = np.random.default_rng(0)
    fx, fy = rng.normal(size=(2, 3, 5, 4)), rng.normal(size=(2, 3, 5, 4))
    w = rng.uniform(size=4)
    want = np.zeros(2)
    for b in range(2):
        for i in range(3):
            for j in range(5):
                u = fx[b, i, j] / np.linalg.norm(fx[b, i, j])
                v = fy[b, i, j] / np.linalg.norm(fy[b, i, j])
                want[b] += np.sum(w * (u - v) ** 2) / 15
    got = layer_distance(jnp.asarray(fx), jnp.asarray(fy), jnp.asarray(w))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    flat = layer_distance(jnp.asarray(fx[:, 0, 0]), jnp.asarray(fy[:, 0, 0]))  # [batch, C]
    np.testing.assert_allclose(flat, layer_distance(fx[:, :1, :1], fy[:, :1, :1]), rtol=1e-6)


@pytest.fixture(scope="module")
def digits_distance(tmp_path_factory):
    ext = FeatureExtractor.load_or_train(ClassifierConfig(), tmp_path_factory.mktemp("clf"))
    return digits_classifier_distance(ext)


def test_digits_distance_separates_digits_from_a_gaussian_fit(digits_distance):
    d = load_digits()
    x = jnp.asarray(d.test[:200])
    assert float(jnp.max(jnp.abs(digits_distance(x, x)))) == 0.0
    rng = np.random.default_rng(0)
    # a training digit of the same class for each test digit (known good)
    same = np.stack(
        [d.train[rng.choice(np.flatnonzero(d.train_labels == k))] for k in d.test_labels[:200]]
    )
    gauss = np.clip(gaussian_baseline(d.train, 200, seed=0), -1, 1)  # known bad
    good = np.asarray(digits_distance(x, jnp.asarray(same)))
    bad = np.asarray(digits_distance(x, jnp.asarray(gauss, jnp.float32)))
    np.testing.assert_allclose(good, digits_distance(jnp.asarray(same), x), rtol=1e-5)
    se = np.sqrt(good.var() / good.size + bad.var() / bad.size)
    assert bad.mean() - good.mean() > 5 * se, (good.mean(), bad.mean(), se)
    # differentiable in its first argument (the loss's gradient reaches the estimate only)
    g = jax.grad(lambda z: jnp.sum(digits_distance(z, jnp.asarray(same))))(x)
    assert float(jnp.sum(g**2)) > 0


def vgg_npz(path, scale=0.05):
    g, state = nnx.split(VGG16Features(rngs=nnx.Rngs(0)), nnx.Param)
    pure = nnx.to_pure_dict(state)
    rng = np.random.default_rng(1)
    arrays = {}
    for i, conv in pure["convs"].items():
        arrays[f"conv{i}_kernel"] = (scale * rng.normal(size=conv["kernel"].shape)).astype(
            np.float32
        )
        arrays[f"conv{i}_bias"] = np.zeros(conv["bias"].shape, np.float32)
    for s, ch in enumerate((64, 128, 256, 512, 512)):
        arrays[f"lin{s}"] = rng.uniform(size=ch).astype(np.float32)
    np.savez(path, **arrays)
    return arrays


def test_lpips_from_an_npz(tmp_path):
    path = tmp_path / "lpips.npz"
    arrays = vgg_npz(path)
    lp = lpips_vgg16(path)
    np.testing.assert_array_equal(lp.params["convs"][3]["kernel"][...], arrays["conv3_kernel"])
    x = jax.random.uniform(jax.random.key(0), (2, 16, 16, 1), minval=-1, maxval=1)
    y = jax.random.uniform(jax.random.key(1), (2, 16, 16, 1), minval=-1, maxval=1)
    assert float(jnp.max(lp(x, x))) == 0.0
    d = lp(x, y)
    assert d.shape == (2,) and bool(jnp.all(d > 0))
    np.testing.assert_allclose(d, lp(y, x), rtol=1e-5)
    bad = dict(arrays)
    bad["lin2"] = bad["lin2"][:10]
    np.savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(ValueError, match=r"objective.metric_weights: .* must hold lin2, \[256\]"):
        lpips_vgg16(tmp_path / "bad.npz")
    with pytest.raises(FileNotFoundError, match="objective.metric_weights: no LPIPS weights"):
        lpips_vgg16(tmp_path / "missing.npz")
    (tmp_path / "text.npz").write_text("not an archive")
    with pytest.raises(ValueError, match="objective.metric_weights: .* is not a readable .npz"):
        lpips_vgg16(tmp_path / "text.npz")
