"""The k-nearest + l-uniform estimator: limits, weights against a float64 brute force,
backends, and sample agreement with the exact score on digits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp
from sklearn.datasets import load_digits

from scorelib.processes import EDM
from scorelib.processes.rectified import RectifiedFlow
from scorelib.samplers.cfdm import cfdm_sample
from scorelib.scores import EmpiricalScore
from scorelib.scores.neighbours import (
    NeighbourScore,
    complement_draws,
    recall_at_k,
    top_k_neighbours,
)
from scorelib.scores.smoothed import SmoothedScore

RNG = np.random.default_rng(0)
TRAIN = RNG.normal(size=(60, 5))


def table(train=TRAIN, chunk=16):
    return EmpiricalScore.create(EDM(), train, chunk=chunk)


def brute_mean(train, y, s):
    logw = -np.sum((y[:, None] - train[None]) ** 2, -1) / (2 * s**2)
    return np.exp(logw - logsumexp(logw, axis=1, keepdims=True)) @ train


def test_top_k_is_the_exact_nearest_set():
    y = RNG.normal(size=(9, 5))
    got = np.asarray(top_k_neighbours(table(chunk=7), jnp.asarray(y, jnp.float32), 6))
    ref = np.argsort(np.sum((y[:, None] - TRAIN[None]) ** 2, -1), axis=1)[:, :6]
    assert all(set(g) == set(r) for g, r in zip(got, ref, strict=True))


def test_k_equal_n_is_the_exact_posterior_mean():
    y = RNG.normal(size=(7, 5))
    nn = NeighbourScore.create(table(), k=60, l=0)
    got = np.asarray(nn.posterior_mean(jnp.asarray(y, jnp.float32), 0.7))
    np.testing.assert_allclose(got, brute_mean(TRAIN, y, 0.7), rtol=1e-5, atol=1e-6)


def test_one_neighbour_and_no_draws_is_the_nearest_point():
    y = RNG.normal(size=(7, 5))
    nn = NeighbourScore.create(table(), k=1, l=0)
    got = np.asarray(nn.posterior_mean(jnp.asarray(y, jnp.float32), 3.0))
    ref = TRAIN[np.argmin(np.sum((y[:, None] - TRAIN[None]) ** 2, -1), axis=1)]
    np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_complement_draws_never_hit_a_neighbour_and_cover_the_rest():
    nbr = jnp.array([[0, 5, 3], [9, 8, 7]])
    u = jnp.tile(jnp.arange(7), (2, 1))
    got = np.asarray(complement_draws(nbr, u))
    np.testing.assert_array_equal(got[0], [1, 2, 4, 6, 7, 8, 9])
    np.testing.assert_array_equal(got[1], [0, 1, 2, 3, 4, 5, 6])


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_weights_match_a_float64_brute_force_with_the_same_draws():
    """logits + log(1/N) on neighbours and log((N - k)/(l N)) on the uniform draws."""
    k, l, n, s = 4, 6, 60, 1.5
    y = RNG.normal(size=(5, 5))
    keys = jax.random.split(jax.random.key(3), 5)
    nn = NeighbourScore.create(table(), k=k, l=l)
    got = np.asarray(nn.posterior_mean(jnp.asarray(y, jnp.float32), s, keys))
    ref = []
    for yb, kb in zip(y, keys, strict=True):
        nbr = np.argsort(np.sum((yb - TRAIN) ** 2, -1))[:k]
        u = np.asarray(jax.random.randint(kb, (l,), 0, n - k))
        rand = np.setdiff1d(np.arange(n), nbr)[u]
        idx = np.concatenate([nbr, rand])
        logc = np.concatenate([np.full(k, -np.log(n)), np.full(l, np.log((n - k) / (l * n)))])
        logw = -np.sum((yb - TRAIN[idx]) ** 2, -1) / (2 * s**2) + logc
        ref.append(np.exp(logw - logsumexp(logw)) @ TRAIN[idx])
    np.testing.assert_allclose(got, np.array(ref), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_faiss_flat_equals_jax_and_approximate_indexes_report_recall():
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(20, 8)) * 4
    train = centres[rng.integers(0, 20, 2000)] + rng.normal(size=(2000, 8))
    tab = table(train, chunk=256)
    y = jnp.asarray(train[:64] + 0.1 * rng.normal(size=(64, 8)), jnp.float32)
    exact = np.asarray(top_k_neighbours(tab, y, 10))
    flat = NeighbourScore.create(tab, k=10, l=0, backend="faiss")
    assert recall_at_k(np.asarray(flat.search(y)), exact) == 1.0
    np.testing.assert_allclose(
        np.asarray(flat.posterior_mean(y, 0.5)),
        np.asarray(NeighbourScore.create(tab, k=10, l=0).posterior_mean(y, 0.5)),
        rtol=1e-5,
    )
    for kw in ({"index": "ivf", "nprobe": 8}, {"index": "hnsw"}):
        approx = NeighbourScore.create(tab, k=10, l=0, backend="faiss", **kw)
        assert recall_at_k(np.asarray(approx.search(y)), exact) > 0.9
    bad = NeighbourScore.create(tab, k=10, l=0, backend="faiss", index="ivf", nprobe=1, nlist=200)
    assert recall_at_k(np.asarray(bad.search(y)), exact) < 0.999  # the metric can fail


@pytest.mark.slow
def test_nn_samples_agree_with_exact_samples_on_digits():
    """Same x_T and draws, T = 0.5, S = 20, k = l = 15 (1.7% of N = 1797): 90% of the
    samples within 1e-4 of the exact ones (independent exact sets are ~5.7 apart)."""
    x = load_digits().data / 8.0 - 1.0
    tab = EmpiricalScore.create(RectifiedFlow(), x, chunk=512)
    key = jax.random.key(0)
    exact, _ = cfdm_sample(SmoothedScore.create(tab, sigma_s=0.4, M=2), key, 64, T=0.5, S=20)
    nn = SmoothedScore.create(NeighbourScore.create(tab, k=15, l=15), sigma_s=0.4, M=2)
    approx, _ = cfdm_sample(nn, key, 64, T=0.5, S=20)
    d = np.linalg.norm(np.asarray(approx) - np.asarray(exact), axis=1)
    assert np.quantile(d, 0.9) < 1e-4


def test_bad_input_names_the_field():
    tab = table()
    with pytest.raises(ValueError, match="score.k"):
        NeighbourScore.create(tab, k=61)
    with pytest.raises(ValueError, match="score.l"):
        NeighbourScore.create(tab, k=60, l=3)
    with pytest.raises(ValueError, match="score.backend"):
        NeighbourScore.create(tab, backend="annoy")
    with pytest.raises(ValueError, match="score.nprobe"):
        NeighbourScore.create(tab, nprobe=4)  # a faiss option with the jax backend
    with pytest.raises(ValueError, match="score.ef_search"):
        NeighbourScore.create(tab, backend="faiss", index="ivf", ef_search=4)
