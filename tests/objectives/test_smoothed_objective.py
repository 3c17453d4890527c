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
from scorelib.scores.base import ScoreSource

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
    kx, kt = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)  # two streams
    for b, xb in enumerate(x0):
        ks, ke = jax.random.split(jax.random.fold_in(kx, b))
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
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
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


class Constant(ScoreSource):
    """A "network" whose denoiser is one fixed point, whatever x and t."""

    value: jax.Array = None

    def denoiser(self, x, t):
        return jnp.broadcast_to(self.value, x.shape)


def test_one_training_point_the_label_is_that_point_whatever_the_noise():
    # N = 1: every softmax over the training set is 1 on x_1, so the label is x_1 exactly
    # for any sigma, sigma_s and draws; a student at x_1 + delta has loss lambda(sigma) delta^2
    x1 = np.array([[0.3, -0.7, 1.1]])
    teacher = SmoothedScore.create(EmpiricalScore.create(P, x1), sigma_s=0.5, M=3)
    obj = SmoothedScoreMatching.create(teacher)
    x0 = jnp.asarray(RNG.normal(size=(6, 3)), jnp.float32)  # the clean batch does not matter
    key = jax.random.key(2)
    losses = jax.jit(obj.example_losses)  # one compilation for both students
    exact, aux = losses(Constant(process=P, value=jnp.asarray(x1[0])), x0, key)
    np.testing.assert_allclose(np.asarray(exact), 0.0, atol=1e-10)
    off, aux = losses(Constant(process=P, value=jnp.asarray(x1[0] + 0.1)), x0, key)
    s = np.asarray(aux["sigma"], np.float64)
    np.testing.assert_allclose(np.asarray(off), (s**2 + 0.25) / (0.5 * s) ** 2 * 0.01, rtol=1e-4)


def test_the_two_key_streams_are_independent():
    # the example draws use fold_in(fold_in(key, 0), b), the teacher fold_in(fold_in(key, 1), b):
    # no key is shared, so the noise of example 1 is not the parent of the teacher's draws
    teacher = SmoothedScore.create(EmpiricalScore.create(P, TRAIN, chunk=8), sigma_s=0.3, M=1)
    obj = SmoothedScoreMatching.create(teacher)
    key = jax.random.key(5)
    keys = {
        "example 1": jax.random.fold_in(jax.random.fold_in(key, 0), 1),
        "teacher 1": jax.random.fold_in(jax.random.fold_in(key, 1), 1),
        "teacher parent": jax.random.fold_in(key, 1),
    }
    data = {n: tuple(np.asarray(jax.random.key_data(k)).ravel()) for n, k in keys.items()}
    assert len(set(data.values())) == 3
    # and the loss follows this scheme (the float64 loop of reference_losses)
    x0 = TRAIN[:3]
    net = EmpiricalScore.create(P, OTHER, chunk=8)
    got, _ = jax.jit(obj.example_losses)(net, jnp.asarray(x0, jnp.float32), key)
    np.testing.assert_allclose(np.asarray(got), reference_losses(x0, key, 0.3, 1), rtol=2e-3)


def test_objective_smoothed_composes_and_builds_on_the_digits():
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from experiments import build, schema

    schema.register_configs()
    root = Path(__file__).resolve().parents[2]
    over = ["objective=smoothed", "objective.sigma_s=0.4", "objective.k=7", "objective.l=3"]
    with initialize_config_dir(config_dir=str(root / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=over)
    process = build.build_process(cfg)
    data = build.build_data(cfg)
    obj = build.build_objective(cfg, process, data)
    assert isinstance(obj, SmoothedScoreMatching)
    assert float(obj.teacher.sigma_s) == 0.4 and obj.teacher.M == 2
    assert (obj.teacher.estimator.k, obj.teacher.estimator.l) == (7, 3)
    assert obj.teacher.estimator.n == data.images.train.shape[0]
    assert obj.sigma_data == cfg.data.sigma_data


def test_bad_fields():
    teacher = SmoothedScore.create(EmpiricalScore.create(P, TRAIN), sigma_s=0.1, M=1)
    with pytest.raises(ValueError, match="objective.P_std"):
        SmoothedScoreMatching.create(teacher, P_std=0.0)
    with pytest.raises(ValueError, match="objective.teacher"):
        SmoothedScoreMatching.create(EmpiricalScore.create(P, TRAIN))
