"""The smoothed closed-form score against a float64 brute force with the documented draws."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from closed_forms import alpha_sigma
from scipy.special import logsumexp

from scorelib.processes import EDM, VP
from scorelib.processes.rectified import RectifiedFlow
from scorelib.scores import EmpiricalScore
from scorelib.scores.smoothed import SmoothedScore


def documented_eps(key, b_index, M, d, t=None):
    """eps_m of example b as the module docstring states it, written out with jax.random."""
    k = jax.random.fold_in(jax.random.fold_in(key, b_index), 0)
    if t is not None:
        bits = np.float32(t).view(np.uint32)
        k = jax.random.fold_in(k, int(bits))
    return np.stack(
        [
            np.asarray(jax.random.normal(jax.random.fold_in(k, m), (d,)), np.float64)
            for m in range(M)
        ]
    )


def brute_smoothed_denoiser(train, x, alpha, ve_sigma, eps, sigma_s):
    """float64 loop: (1/M) sum_m softmax-mean of the training set at (x + sigma_s eps_m)/alpha."""
    out = []
    for xb, eb in zip(x, eps, strict=True):
        means = []
        for e in eb:
            y = (xb + sigma_s * e) / alpha
            logw = -np.sum((y - train) ** 2, -1) / (2 * ve_sigma**2)
            means.append(np.exp(logw - logsumexp(logw)) @ train)
        out.append(np.mean(means, 0))
    return np.array(out)


@pytest.mark.parametrize("redraw", [False, True], ids=["fixed", "redraw"])
@pytest.mark.parametrize(
    "p,t", [(RectifiedFlow(), 0.3), (VP(), 0.4), (EDM(), 0.5)], ids=["rf", "vp", "edm"]
)
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_matches_float64_brute_force_with_the_documented_draws(p, t, redraw):
    rng = np.random.default_rng(0)
    train = rng.normal(size=(40, 3))
    key = jax.random.key(7)
    src = SmoothedScore.create(
        EmpiricalScore.create(p, train, chunk=16), sigma_s=0.3, M=3, redraw=redraw
    ).for_examples(key, 4, first_index=5)
    x = rng.normal(size=(4, 3))
    got = np.asarray(src.denoiser(jnp.asarray(x, jnp.float32), t))
    a = float(p.alpha(jnp.float32(t)))
    vs = float(p.ve_sigma(jnp.float32(t)))
    eps = np.stack([documented_eps(key, 5 + b, 3, 3, t if redraw else None) for b in range(4)])
    ref = brute_smoothed_denoiser(train, x, a, vs, eps, 0.3)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_fixed_draws_do_not_depend_on_time_and_redraws_do():
    rng = np.random.default_rng(1)
    train = rng.normal(size=(30, 2))
    tab = EmpiricalScore.create(EDM(), train, chunk=8)
    key = jax.random.key(0)
    x = jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)
    # at tiny sigma_s * large M the draws barely matter; use one draw and a large sigma_s
    fixed = SmoothedScore.create(tab, sigma_s=1.0, M=1).for_examples(key, 3)
    redraw = SmoothedScore.create(tab, sigma_s=1.0, M=1, redraw=True).for_examples(key, 3)
    # the fixed source at t is the exact denoiser at the shifted query x + eps (EDM: alpha=1)
    eps = np.stack([documented_eps(key, b, 1, 2)[0] for b in range(3)])
    for t in (0.2, 0.7):
        np.testing.assert_allclose(
            np.asarray(fixed.denoiser(x, t)),
            np.asarray(tab.denoiser(x + jnp.asarray(eps, jnp.float32), t)),
            rtol=1e-5,
        )
    assert not np.allclose(redraw.denoiser(x, 0.2), redraw.denoiser(x, 0.2000001))


@pytest.mark.parametrize("M", [1, 4])
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_sigma_s_zero_is_the_exact_score_for_any_M(M):
    """sigma_s = 0: the score of the noised training mixture, a float64 loop over
    grad_x log (1/n) sum_i N(x; alpha x_i, sigma^2 I) at each example's own time."""
    rng = np.random.default_rng(2)
    train = rng.normal(size=(25, 4))
    p = VP()
    src = SmoothedScore.create(
        EmpiricalScore.create(p, train, chunk=8), sigma_s=0.0, M=M
    ).for_examples(jax.random.key(1), 5)
    x = rng.normal(size=(5, 4))
    t = np.linspace(0.1, 0.9, 5)
    got = np.asarray(src.score(jnp.asarray(x, jnp.float32), jnp.asarray(t, jnp.float32)))
    ref = []
    for xb, tb in zip(x, t, strict=True):
        a, s = (float(v) for v in alpha_sigma(p, np.float32(tb)))  # the paper's closed form
        logw = -np.sum((xb - a * train) ** 2, -1) / (2 * s**2)
        w = np.exp(logw - logsumexp(logw))
        ref.append((a * (w @ train) - xb) / s**2)
    np.testing.assert_allclose(got, np.array(ref), rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_per_example_draws_do_not_depend_on_the_batch():
    rng = np.random.default_rng(3)
    tab = EmpiricalScore.create(EDM(), rng.normal(size=(25, 2)), chunk=8)
    src = SmoothedScore.create(tab, sigma_s=0.5, M=2)
    key = jax.random.key(3)
    x = jnp.asarray(rng.normal(size=(6, 2)), jnp.float32)
    whole = src.for_examples(key, 6).denoiser(x, 0.3)
    part = src.for_examples(key, 2, first_index=4).denoiser(x[4:], 0.3)
    np.testing.assert_allclose(np.asarray(whole[4:]), np.asarray(part), rtol=1e-6)


def test_bad_input_names_the_field():
    tab = EmpiricalScore.create(EDM(), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="score.sigma_s"):
        SmoothedScore.create(tab, sigma_s=-0.1, M=2)
    with pytest.raises(ValueError, match="score.M"):
        SmoothedScore.create(tab, sigma_s=0.1, M=0)
    src = SmoothedScore.create(tab, sigma_s=0.1, M=2)
    with pytest.raises(ValueError, match="for_examples"):
        src.denoiser(jnp.zeros((2, 2)), 0.5)
    with pytest.raises(ValueError, match="for_examples"):
        src.for_examples(jax.random.key(0), 3).denoiser(jnp.zeros((2, 2)), 0.5)
