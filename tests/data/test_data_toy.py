"""Toy distributions: determinism, the streaming contract, and each law against its construction."""

import jax
import numpy as np
import pytest
from sklearn.datasets import make_moons, make_swiss_roll

from scorelib.data import TOY_NAMES, ring_means, toy_batch, toy_sample
from scorelib.data.toy import RING_STD

N = 20_000


@pytest.fixture(scope="module")
def samples():
    return {name: toy_sample(name, N, seed=0) for name in TOY_NAMES}


def test_six_names():
    assert set(TOY_NAMES) == {
        "8gaussians",
        "checkerboard",
        "moons",
        "swissroll",
        "rings",
        "pinwheel",
    }


@pytest.mark.parametrize("name", TOY_NAMES)
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_shape_dtype_determinism(name, samples):
    x = samples[name]
    assert x.shape == (N, 2) and x.dtype == np.float32 and np.all(np.isfinite(x))
    np.testing.assert_array_equal(toy_sample(name, 100, seed=0), x[:100])  # prefix, same seed
    assert not np.allclose(toy_sample(name, 100, seed=1), x[:100])


def test_unknown_name_lists_names():
    with pytest.raises(ValueError, match="checkerboard"):
        toy_sample("spiral", 10, 0)
    with pytest.raises(ValueError, match="moons"):
        toy_batch("nope", 4, seed=0, step=0)


def _moment_close(x, ref, tol):
    np.testing.assert_allclose(x.mean(0), ref.mean(0), atol=tol)
    np.testing.assert_allclose(np.cov(x.T), np.cov(ref.T), atol=2 * tol)


def test_eight_gaussians(samples):
    x = samples["8gaussians"]
    mu = ring_means()
    np.testing.assert_allclose(np.linalg.norm(mu, axis=1), 2.0, rtol=1e-6)
    d = np.linalg.norm(x[:, None] - mu[None], axis=-1)
    comp = d.argmin(1)
    counts = np.bincount(comp, minlength=8)
    assert np.all(np.abs(counts - N / 8) < 5 * np.sqrt(N / 8))
    resid = x - mu[comp]
    np.testing.assert_allclose(resid.std(0), RING_STD, rtol=0.05)


def test_checkerboard(samples):
    x = samples["checkerboard"]
    assert np.all(np.abs(x) <= 2.0)
    col, row = np.floor(x[:, 0]).astype(int) + 2, np.floor(x[:, 1]).astype(int) + 2
    assert np.all((col + row) % 2 == 0)
    counts = np.bincount(col * 4 + row, minlength=16)
    dark = [c * 4 + r for c in range(4) for r in range(4) if (c + r) % 2 == 0]
    assert np.all(np.abs(counts[dark] - N / 8) < 5 * np.sqrt(N / 8))
    # uniform inside a square: fractional parts have mean 1/2, variance 1/12
    frac = x - np.floor(x)
    np.testing.assert_allclose(frac.var(0), 1 / 12, rtol=0.05)


def test_moons_matches_sklearn(samples):
    ref, _ = make_moons(N, noise=0.05, random_state=0)  # noise 0.05 before the x2 scaling
    ref = 2.0 * (ref - np.array([0.5, 0.25]))
    _moment_close(samples["moons"], ref, 0.05)


def test_swissroll_matches_sklearn(samples):
    ref, _ = make_swiss_roll(N, noise=0.5, random_state=0)  # noise 0.5 before the /5
    ref = ref[:, [0, 2]] / 5.0
    _moment_close(samples["swissroll"], ref, 0.05)
    r = np.linalg.norm(samples["swissroll"], axis=1)
    rr = np.linalg.norm(ref, axis=1)
    np.testing.assert_allclose(
        np.quantile(r, [0.1, 0.5, 0.9]), np.quantile(rr, [0.1, 0.5, 0.9]), atol=0.05
    )


def test_rings(samples):
    r = np.linalg.norm(samples["rings"], axis=1)
    radii = np.array([0.5, 1.0, 1.5, 2.0])
    ring = np.abs(r[:, None] - radii[None]).argmin(1)
    assert np.all(np.abs(r - radii[ring]) < 0.25)  # 5 sigma of the 0.05 noise
    frac = np.bincount(ring, minlength=4) / N
    np.testing.assert_allclose(frac, radii / radii.sum(), atol=0.015)


def test_pinwheel_against_numpy_construction(samples):
    rng = np.random.default_rng(0)
    k = rng.integers(0, 5, N)
    z = rng.standard_normal((N, 2))
    f = np.array([1.0, 0.0]) + np.array([0.3, 0.1]) * z
    a = 2 * np.pi * k / 5 + 0.25 * np.exp(f[:, 0])
    ref = 2 * np.stack(
        [np.cos(a) * f[:, 0] - np.sin(a) * f[:, 1], np.sin(a) * f[:, 0] + np.cos(a) * f[:, 1]], 1
    )
    x = samples["pinwheel"]
    _moment_close(x, ref, 0.05)
    q = [0.1, 0.5, 0.9]
    np.testing.assert_allclose(
        np.quantile(np.linalg.norm(x, axis=1), q),
        np.quantile(np.linalg.norm(ref, axis=1), q),
        atol=0.05,
    )
    # five arms: the angle (mod 72 degrees) distribution matches
    ang = lambda p: np.mod(np.arctan2(p[:, 1], p[:, 0]), 2 * np.pi / 5)
    np.testing.assert_allclose(np.quantile(ang(x), q), np.quantile(ang(ref), q), atol=0.03)


def test_stream_contract():
    name = "pinwheel"
    b = toy_batch(name, 8, seed=3, step=5)
    assert b.shape == (8, 2) and b.dtype == np.float32
    jitted = jax.jit(lambda s, p: toy_batch(name, 4, seed=3, step=s, process_index=p))
    # process 0 and 1 with B=4 together are the B=8 batch of one process
    np.testing.assert_allclose(np.concatenate([jitted(5, 0), jitted(5, 1)]), b, rtol=1e-6)
    np.testing.assert_array_equal(toy_batch(name, 8, seed=3, step=5), b)
    assert not np.allclose(toy_batch(name, 8, seed=3, step=6), b)
    assert not np.allclose(toy_batch(name, 8, seed=4, step=5), b)
