"""The sigma-CFDM sampler: a float64 loop from the paper, the barycentre theorem, the key
rule, and every registered sampler on a smoothed source."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from scipy.special import logsumexp
from sklearn.datasets import make_moons

from scorelib.processes import EDM
from scorelib.processes.rectified import RectifiedFlow
from scorelib.samplers import GRIDS, SAMPLERS, draw_samples, edm_grid, get_sampler, make_grid
from scorelib.samplers.cfdm import cfdm_sample, cfdm_steps
from scorelib.scores import EmpiricalScore
from scorelib.scores.smoothed import SmoothedScore

TRAIN = make_moons(50, noise=0.05, random_state=0)[0]


def smoothed(sigma_s, M, train=TRAIN, **kw):
    return SmoothedScore.create(
        EmpiricalScore.create(RectifiedFlow(), train, chunk=16), sigma_s=sigma_s, M=M, **kw
    )


def numpy_cfdm(train, key, batch, T, S, sigma_s, M):
    """float64 loop of Scarvelis et al., Algorithm 1, with the documented key scheme."""
    out = []
    h = 1.0 / S
    n = int(round((1 - T) * S))
    for b in range(batch):
        kb = jax.random.fold_in(key, b)
        i = int(jax.random.randint(jax.random.fold_in(kb, 1), (), 0, len(train)))
        xi = np.asarray(jax.random.normal(jax.random.fold_in(kb, 2), (2,)), np.float64)
        x = T * train[i] + (1 - T) * xi
        k0 = jax.random.fold_in(kb, 0)
        eps = [np.asarray(jax.random.normal(jax.random.fold_in(k0, m), (2,))) for m in range(M)]
        for j in range(n):
            s = T + j * h
            means = []
            for e in eps:  # w_i(x + sigma eps) with the flow-time mixture N(s x_i, (1-s)^2)
                logw = -np.sum((x + sigma_s * e - s * train) ** 2, -1) / (2 * (1 - s) ** 2)
                means.append(np.exp(logw - logsumexp(logw)) @ train)
            v = (np.mean(means, 0) - x) / (1 - s)
            x = x + h * v
        out.append(x)
    return np.array(out)


def test_matches_a_float64_loop_of_the_paper():
    key = jax.random.key(0)
    x, info = cfdm_sample(smoothed(0.2, 2), key, 6, T=0.6, S=10)
    assert info == {"nfe": 4, "steps": 4, "start": 0.6}
    ref = numpy_cfdm(TRAIN, key, 6, 0.6, 10, 0.2, 2)
    np.testing.assert_allclose(np.asarray(x), ref, atol=2e-4)


def nearest(x, points):
    return np.min(np.linalg.norm(x[:, None] - points[None], axis=-1), axis=1)


def test_sigma_zero_regenerates_training_points():
    x, _ = cfdm_sample(smoothed(0.0, 2), jax.random.key(1), 128, T=0.99, S=1000)
    assert np.max(nearest(np.asarray(x), TRAIN)) < 1e-6


def test_one_draw_lands_on_training_points():
    x, _ = cfdm_sample(smoothed(0.4, 1), jax.random.key(2), 128, T=0.99, S=1000)
    d = nearest(np.asarray(x), TRAIN)
    assert np.quantile(d, 0.95) < 1e-4 and np.median(d) < 1e-5


def test_two_fixed_draws_land_on_midpoints_of_pairs():
    """The barycentre theorem (Scarvelis et al., Thm. 1): with M = 2 fixed draws a sample
    is (x_i + x_j) / 2; most are not training points (i != j)."""
    x, _ = cfdm_sample(smoothed(0.4, 2), jax.random.key(3), 128, T=0.99, S=1000)
    x = np.asarray(x)
    mids = ((TRAIN[:, None] + TRAIN[None]) / 2).reshape(-1, 2)
    d_mid = nearest(x, mids)
    assert np.quantile(d_mid, 0.95) < 1e-4 and np.max(d_mid) < 5e-3
    assert np.median(nearest(x, TRAIN)) > 1e-2  # new points, not copies


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_samples_do_not_depend_on_their_batch():
    src = smoothed(0.3, 2)
    whole, _ = cfdm_sample(src, jax.random.key(4), 8, T=0.9, S=50)
    part, _ = cfdm_sample(src, jax.random.key(4), 3, T=0.9, S=50, first_index=5)
    np.testing.assert_allclose(np.asarray(whole[5:]), np.asarray(part), atol=1e-6)


@pytest.mark.slow  # 4 compiles per sampler: 24-72 s each at load 13 on 2 cores
@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_every_registered_sampler_runs_on_a_smoothed_source(name):
    """Each sampler of the registry, on its default grid, 3 steps, N = 12 training points:
    at sigma_s = 0 the smoothed source gives the samples of the same sampler on the
    EmpiricalScore (the perturbation vanishes, the keys of the sampler are the same);
    at sigma_s > 0 the samples are finite and do not depend on the batch size."""
    p = EDM(sigma_min=0.002, sigma_max=5.0)
    tab = EmpiricalScore.create(p, TRAIN[:12], chunk=8)
    grid_name = get_sampler(name).default_grid
    top = {"sigma_max": p.sigma_max} if "sigma_max" in GRIDS[grid_name] else {}  # in p's range
    grid = make_grid(grid_name, 3, p, **top)
    sampler = get_sampler(name)
    key = jax.random.key(5)
    exact, _ = get_sampler(name)(tab, key, (4, 2), grid=grid)
    zero, _ = sampler(SmoothedScore.create(tab, sigma_s=0.0, M=2), key, (4, 2), grid=grid)
    np.testing.assert_allclose(np.asarray(zero), np.asarray(exact), rtol=1e-5, atol=1e-5)
    src = SmoothedScore.create(tab, sigma_s=0.3, M=2)
    a, _ = draw_samples(sampler, src, key, (2,), num_samples=4, batch_size=4, grid=grid)
    b, _ = draw_samples(sampler, src, key, (2,), num_samples=4, batch_size=2, grid=grid)
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert not np.allclose(a, np.asarray(exact), atol=1e-3)  # the smoothing acts


def test_steps_and_bad_input():
    assert cfdm_steps(0.95, 100) == pytest.approx((0.95, 5, 0.01))
    assert cfdm_steps(0.0, 10) == pytest.approx((0.1, 9, 0.1))
    with pytest.raises(ValueError, match="sampler.T"):
        cfdm_steps(1.0, 100)
    with pytest.raises(ValueError, match="sampler.T"):
        cfdm_steps(-0.1, 100)
    with pytest.raises(ValueError, match="sampler.S"):
        cfdm_steps(0.5, 0)
    tab = EmpiricalScore.create(EDM(), TRAIN)
    with pytest.raises(ValueError, match="score.process"):
        cfdm_sample(tab, jax.random.key(0), 2)


def test_a_training_set_of_another_shape_is_refused_before_compute():
    src = smoothed(0.3, 2)
    with pytest.raises(ValueError, match=r"shape\[1:\]"):
        get_sampler("heun")(src, jax.random.key(0), (4, 3), grid=edm_grid(4))
