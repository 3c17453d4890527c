"""Smoothed closed-form score matching against a float64 per-example loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp

from scorelib.objectives.smoothed import SmoothedScoreMatching
from scorelib.processes import EDM
from scorelib.scores import EmpiricalScore, SmoothedScore

RNG = np.random.default_rng(0)
TRAIN = RNG.normal(size=(30, 3))
OTHER = RNG.normal(size=(20, 3)) + 0.5  # the "network": another training set's denoiser
P = EDM()


def softmax_mean(points, y, s):
    logw = -np.sum((y - points) ** 2, -1) / (2 * s**2)
    return np.exp(logw - logsumexp(logw)) @ points


def reference_losses(x0, key, sigma_s, M):
    """Per example, from the documented key scheme, in float64."""
    out = []
    kt = jax.random.fold_in(key, 1)
    for b, xb in enumerate(x0):
        ks, ke = jax.random.split(jax.random.fold_in(key, b))
        z = float(jax.random.normal(ks, ()))
        n = np.asarray(jax.random.normal(ke, (3,)), np.float64)
        sigma = np.exp(-1.2 + 1.2 * z)
        x = xb + sigma * n  # EDM: alpha = 1
        k0 = jax.random.fold_in(jax.random.fold_in(kt, b), 0)
        eps = [np.asarray(jax.random.normal(jax.random.fold_in(k0, m), (3,))) for m in range(M)]
        label = np.mean([softmax_mean(TRAIN, x + sigma_s * e, sigma) for e in eps], 0)
        d = softmax_mean(OTHER, x, sigma)
        w = (sigma**2 + 0.25) / (sigma * 0.5) ** 2
        out.append(w * np.mean((d - label) ** 2))
    return np.array(out)


@pytest.mark.parametrize("batch", [1, 2, 7])
def test_matches_a_float64_per_example_loop(batch):
    teacher = SmoothedScore.create(EmpiricalScore.create(P, TRAIN, chunk=8), sigma_s=0.3, M=2)
    obj = SmoothedScoreMatching.create(teacher)
    net = EmpiricalScore.create(P, OTHER, chunk=8)
    x0 = TRAIN[:batch]
    key = jax.random.key(4)
    losses, aux = jax.jit(obj.example_losses)(net, jnp.asarray(x0, jnp.float32), key)
    np.testing.assert_allclose(
        np.asarray(losses), reference_losses(x0, key, 0.3, 2), rtol=2e-3, atol=1e-6
    )
    assert aux["sigma"].shape == (batch,)


def test_the_label_is_the_teacher_a_perfect_student_has_zero_loss():
    teacher = SmoothedScore.create(EmpiricalScore.create(P, TRAIN, chunk=8), sigma_s=0.0, M=1)
    obj = SmoothedScoreMatching.create(teacher)
    loss, _ = obj(
        EmpiricalScore.create(P, TRAIN, chunk=8),
        jnp.asarray(TRAIN[:5], jnp.float32),
        jax.random.key(0),
    )
    assert float(loss) < 1e-8


def test_bad_fields():
    teacher = SmoothedScore.create(EmpiricalScore.create(P, TRAIN), sigma_s=0.1, M=1)
    with pytest.raises(ValueError, match="objective.P_std"):
        SmoothedScoreMatching.create(teacher, P_std=0.0)
    with pytest.raises(ValueError, match="objective.teacher"):
        SmoothedScoreMatching.create(EmpiricalScore.create(P, TRAIN))
