"""Plain ULA/MALA on a target (the rdMC baseline): Gaussian moments, ULA's bias, the key rule,
the gradient budget and bad input."""

import jax
import numpy as np
import pytest

from scorelib.data.targets import GaussianMixtureTarget, Target
from scorelib.samplers import langevin_mcmc, steps_for_budget
from scorelib.scores.mcmc import chain_evaluations

M = np.array([2.0, -1.0])
S = 0.5
GAUSS = GaussianMixtureTarget.create([1.0], [M], stds=[S])


def test_mala_samples_the_gaussian_and_ula_inflates_its_variance():
    """From N(0, I), step h = step_size S^2 (curvature 1/S^2): MALA's final states have the
    target's mean and variance; ULA's variance is S^2 / (1 - step_size / 2) (Roberts &
    Tweedie 1996), here 4/3 S^2."""
    n = 4000
    kw = dict(n_steps=200, step_size=0.5, curvature=1 / S**2)
    x, info = langevin_mcmc(GAUSS, jax.random.key(0), n, method="mala", **kw)
    assert np.allclose(x.mean(0), M, atol=4 * S / np.sqrt(n))
    assert abs(x.var(0).mean() / S**2 - 1) < 0.06
    assert 0.5 < info["acceptance"] < 1.0
    assert (info["grad_evals"], info["density_evals"]) == (201, 201)
    u, info = langevin_mcmc(GAUSS, jax.random.key(0), n, method="ula", **kw)
    assert np.allclose(u.mean(0), M, atol=5 * S / np.sqrt(n))
    assert abs(u.var(0).mean() / S**2 - 4 / 3) < 0.08
    assert (info["grad_evals"], info["density_evals"], info["acceptance"]) == (200, 0, 1.0)


def test_chains_follow_the_key_rule():
    """Chain i draws from fold_in(key, i): a later slice with first_index is the same; the
    start (n_steps = 0) is the driver's start draw normal(fold_in(fold_in(key, i), 0))."""
    key = jax.random.key(3)
    kw = dict(n_steps=5, step_size=0.5, curvature=4.0, method="mala")
    whole, _ = langevin_mcmc(GAUSS, key, 6, **kw)
    part, _ = langevin_mcmc(GAUSS, key, 2, first_index=4, **kw)
    np.testing.assert_allclose(whole[4:], part, rtol=1e-5, atol=1e-6)
    start, _ = langevin_mcmc(GAUSS, key, 3, n_steps=0, step_size=0.5, init_scale=2.0)
    want = [
        2.0 * np.asarray(jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, i), 0), (2,)))
        for i in range(3)
    ]
    np.testing.assert_allclose(start, np.array(want), rtol=1e-6)


def test_budget_and_evaluation_counts():
    assert steps_for_budget("ula", 100) == 100
    assert steps_for_budget("mala", 100) == 99
    assert chain_evaluations("mala", steps_for_budget("mala", 100), False)["grad"] == 100
    assert chain_evaluations("ula", 7, True) == {"grad": 8, "density": 0}
    assert chain_evaluations("mala", 0, False) == {"grad": 0, "density": 0}
    assert chain_evaluations("mala", 0, True) == {"grad": 1, "density": 1}
    with pytest.raises(ValueError, match="^grad_evals must be an integer >= 2"):
        steps_for_budget("mala", 1)


def test_bad_input():
    with pytest.raises(ValueError, match="^data.target must be a target with a log-density"):
        langevin_mcmc(Target(), jax.random.key(0), 4, n_steps=2, step_size=0.5)
    for field, value in [
        ("step_size", 2.5),
        ("curvature", -1.0),
        ("method", "hmc"),
        ("init_scale", 0.0),
        ("n_steps", -1),
        ("n", 0),
    ]:
        kw = dict(n=4, n_steps=2, step_size=0.5)
        kw[field] = value
        with pytest.raises(ValueError, match=f"^{field} must be"):
            langevin_mcmc(GAUSS, jax.random.key(0), **kw)
    with pytest.raises(ValueError, match="^key must be"):
        langevin_mcmc(GAUSS, 0, 4, n_steps=2, step_size=0.5)
