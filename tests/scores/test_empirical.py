"""The exact training-set score (matmul logits + exact recomputation) against a float64 loop.

Every process and the rectified-flow convention; float32 at sigma = 1e-4 near and at a
training point, and far from every point (where the score is -(x - alpha x_nn) / sigma^2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from closed_forms import alpha_sigma
from scipy.special import logsumexp

from scorelib.processes import EDM, VE, VP, SubVP
from scorelib.processes.rectified import RectifiedFlow
from scorelib.scores import EmpiricalScore

PROCESSES = [VE(), VP(), SubVP(), EDM(), RectifiedFlow()]
IDS = ["ve", "vp", "subvp", "edm", "rf"]


def coefficients(p, t):
    """float64 ``(alpha, sigma)`` from the papers' closed forms (RF: ``1 - t, t``)."""
    if isinstance(p, RectifiedFlow):
        t = np.asarray(t, np.float64)
        return 1.0 - t, t
    return tuple(np.asarray(v, np.float64) for v in alpha_sigma(p, t))


def brute_score(train, x, alpha, sigma):
    """float64 loop over queries: grad_x log (1/n) sum_i N(x; alpha x_i, sigma^2 I)."""
    out = []
    for xb, a, s in zip(
        x, np.broadcast_to(alpha, len(x)), np.broadcast_to(sigma, len(x)), strict=True
    ):
        logw = np.array([-np.sum((xb - a * xi) ** 2) / (2 * s**2) for xi in train])
        w = np.exp(logw - logsumexp(logw))
        out.append((a * (w @ train) - xb) / s**2)
    return np.array(out)


def mid_time(p):
    return {VE: 0.4, VP: 0.3, SubVP: 0.3, EDM: 0.8, RectifiedFlow: 0.4}[type(p)]


CASES = [(p, 5, 2) for p in PROCESSES] + [(RectifiedFlow(), 1, 1), (VP(), 64, 3)]


@pytest.mark.parametrize("p,chunk,exact_top", CASES, ids=[*IDS, "rf-chunk1", "vp-chunk64"])
def test_score_matches_float64_loop(p, chunk, exact_top):
    rng = np.random.default_rng(0)
    train = rng.normal(size=(37, 3))
    src = EmpiricalScore.create(p, train, chunk=chunk, exact_top=exact_top)
    t = np.array([mid_time(p), p.t_min + 0.05 * (p.t_max - p.t_min), 0.9 * p.t_max, 0.5])
    a, s = coefficients(p, t)
    x = a[:, None] * rng.normal(size=(4, 3)) + s[:, None] * rng.normal(size=(4, 3))
    got = np.asarray(src.score(jnp.asarray(x, jnp.float32), jnp.asarray(t, jnp.float32)))
    ref = brute_score(train, x, a, s)
    np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4 * np.max(np.abs(ref)))


@pytest.mark.parametrize("p", PROCESSES, ids=IDS)
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_denoiser_near_a_training_point_at_sigma_1e_4_in_float32(p):
    """ve_sigma = 1e-4, queries within ~sigma of training points with large norms: the
    matmul form alone is off by ~1e-7 ||y||^2 / (2 sigma^2) ~ 1e4 in the logits."""
    rng = np.random.default_rng(1)
    train = rng.normal(size=(300, 64)) * 0.5 + 3.0
    # two near-duplicates so that the weights between them matter
    train[7] = train[3] + 1.5e-4 * rng.normal(size=64) / 8
    src = EmpiricalScore.create(p, train, chunk=64, exact_top=2)
    t = float(p.t_of_ve_sigma(1e-4)) if not isinstance(p, RectifiedFlow) else 1e-4 / (1 + 1e-4)
    a, s = coefficients(p, t)
    y = train[[3, 3, 50, 120]] + 1e-4 * rng.normal(size=(4, 64)) / 8
    x = a * y
    got = np.asarray(src.denoiser(jnp.asarray(x, jnp.float32), t))
    logw = -np.sum((y[:, None] - train[None]) ** 2, -1) / (2 * (s / a) ** 2)
    w = np.exp(logw - logsumexp(logw, axis=1, keepdims=True))
    ref = w @ train
    np.testing.assert_allclose(got, ref, atol=2e-5)


def test_weights_between_two_near_points_at_small_sigma():
    """Two points 2e-4 apart, query between them at ve_sigma = 1e-4: the weight split is
    a logistic in the exact distance difference (float64 loop); matmul logits alone
    would put all weight on one of them at random."""
    rng = np.random.default_rng(2)
    base = rng.normal(size=64) + 5.0
    u = rng.normal(size=64)
    u /= np.linalg.norm(u)
    train = np.concatenate([rng.normal(size=(100, 64)) + 5.0, [base, base + 2e-4 * u]])
    src = EmpiricalScore.create(EDM(), train, chunk=32, exact_top=2)
    y = base + np.array([0.5, 0.3, 0.7])[:, None] * 2e-4 * u
    got = np.asarray(src.denoiser(jnp.asarray(y, jnp.float32), 1e-4))
    logw = -np.sum((y[:, None] - train[None]) ** 2, -1) / (2 * 1e-8)
    ref = np.exp(logw - logsumexp(logw, axis=1, keepdims=True)) @ train
    lam_ref = (ref - base) @ u / 2e-4
    lam = (got - base) @ u / 2e-4
    np.testing.assert_allclose(lam, lam_ref, atol=0.03)
    assert 0.2 < lam_ref[1] < 0.8  # the split is not 0 or 1: the test can fail


@pytest.mark.parametrize("p", PROCESSES, ids=IDS)
def test_query_equal_to_a_training_point(p):
    rng = np.random.default_rng(3)
    train = rng.normal(size=(200, 16)) * 3 + 10.0
    src = EmpiricalScore.create(p, train, chunk=16)
    t = float(p.t_of_ve_sigma(1e-4)) if not isinstance(p, RectifiedFlow) else 1e-4 / (1 + 1e-4)
    a, _ = coefficients(p, t)
    x = jnp.asarray(a * train[[0, 99, 199]], jnp.float32)
    d = np.asarray(src.denoiser(x, t))
    np.testing.assert_allclose(d, train[[0, 99, 199]], rtol=1e-6)
    assert np.all(np.isfinite(np.asarray(src.score(x, t))))


@pytest.mark.parametrize("ve_sigma", [1e-2, 1e-4])
@pytest.mark.parametrize("p", PROCESSES, ids=IDS)
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_far_from_data_the_score_points_at_the_nearest_point(p, ve_sigma):
    """Far from every point at small noise, score = -(x - alpha x_nn) / sigma^2."""
    rng = np.random.default_rng(4)
    train = rng.normal(size=(500, 8))
    src = EmpiricalScore.create(p, train, chunk=128)
    rf = isinstance(p, RectifiedFlow)  # RF: ve_sigma = t / (1 - t)
    t = float(p.t_of_ve_sigma(ve_sigma)) if not rf else ve_sigma / (1 + ve_sigma)
    a, s = coefficients(p, t)
    y = rng.normal(size=(5, 8)) * 30.0
    nn = train[np.argmin(np.sum((y[:, None] - train[None]) ** 2, -1), axis=1)]
    got = np.asarray(src.score(jnp.asarray(a * y, jnp.float32), t))
    ref = -(a * y - a * nn) / s**2
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=1e-4)


def test_per_example_time_and_jit():
    rng = np.random.default_rng(5)
    train = rng.normal(size=(20, 2))
    p = RectifiedFlow()
    src = EmpiricalScore.create(p, train, chunk=8)
    t = np.array([0.1, 0.5, 0.9])
    x = rng.normal(size=(3, 2))
    got = jax.jit(lambda s, x, t: s.score(x, t))(src, jnp.asarray(x, jnp.float32), t)
    a, s = coefficients(p, t)
    np.testing.assert_allclose(np.asarray(got), brute_score(train, x, a, s), rtol=1e-4)


@pytest.mark.parametrize(
    "field,kwargs",
    [
        ("chunk", {"chunk": 0}),
        ("exact_top", {"exact_top": 0}),
        ("prune", {"prune": -1}),
        ("prune", {"prune": "always"}),
        ("prune", {"prune": 2.0}),
    ],
)
def test_bad_options_name_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        EmpiricalScore.create(EDM(), np.zeros((3, 2)), **kwargs)
