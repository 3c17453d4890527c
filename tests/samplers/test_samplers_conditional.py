"""Every sampler against an exact conditional law (issue 36, item 2).

The source is a ``PerClassScore`` of three 2-D Gaussian classes (classes 1 and 2 overlap),
conditioned on ``Labels.balanced``: example ``i`` belongs to class ``i % 3``. Per class, the
samples whitened by the class's exact mean and covariance must have mean 0 and covariance
``I`` within 4 standard errors (``1 / sqrt(n)``, ``sqrt(2 / n)`` on the diagonal) plus the
sampler's discretisation bias at its grid, measured once with 2 x 200,000 (ODE) or 2 x
100,000 (SDE) samples per class (``BIAS``; for the ODE samplers it is mostly the start's
``N(0, sigma_max^2)`` ignoring the class mean, ``m / sigma_max`` whitened, and annealed
Langevin's is its known variance excess at 100 steps per level). A wrong label per example
moves a class's whitened mean by several units.

Also: an energy-distance two-sample test of Heun's samples against exact draws, at the floor
of exact draws against exact draws (and, known-bad, the overlapping class's law far above
it); classifier-free guidance at ``w = 1`` gives the conditional sampler's samples; guided
samplers (TCFG on an interval, classifier guidance) run and sharpen the classes as guidance
should (the exact classifier's ``log p(c | x)`` of the samples goes up); labels drawn at
random per example survive the driver's CPU blocks.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.metrics.distances import energy_distance
from scorelib.processes import EDM, VE, VP
from scorelib.samplers import SAMPLERS, driver, edm_grid, get_sampler, uniform_t_grid
from scorelib.scores import GaussianScore, Labels, PerClassScore
from scorelib.scores.guidance import ClassifierFreeGuidance, ClassifierGuidance

MEANS = np.array([[1.5, 0.0], [-1.0, 0.6], [-0.7, 0.9]])  # classes 1 and 2 overlap
COVS = np.stack(
    [
        np.diag([0.3, 0.2]),
        np.array([[0.4, 0.1], [0.1, 0.2]]),
        np.array([[0.2, -0.05], [-0.05, 0.5]]),
    ]
)
# sampler -> (process, grid, options, samples per class, bias of the whitened mean, of the
# whitened covariance). 3 x samples per class is a multiple of the driver's CPU block (1024),
# so the compiled sampler holds one block's program, not a block and a remainder.
CASES = {
    "heun": (VP(), lambda p: edm_grid(64), {}, 4096, 0.025, 0.015),
    "dpmpp_2m": (EDM(), lambda p: edm_grid(48), {}, 4096, 0.025, 0.022),
    "pf_ode_euler": (VP(), lambda p: uniform_t_grid(p, 300), {}, 4096, 0.012, 0.01),
    "euler_maruyama": (VE(), lambda p: uniform_t_grid(p, 300), {}, 4096, 0.005, 0.007),
    "pc": (
        VP(),
        lambda p: uniform_t_grid(p, 150),
        dict(snr=0.16, n_corrector=1),
        3072,
        0.016,
        0.016,
    ),
    "annealed_langevin": (
        VE(),
        lambda p: edm_grid(20, 0.01, 50.0),
        dict(n_steps_each=100),
        2048,
        0.006,
        0.06,
    ),
}


def classes(p) -> PerClassScore:
    srcs = [GaussianScore.from_covariance(p, m, c) for m, c in zip(MEANS, COVS, strict=True)]
    return PerClassScore.create(srcs)


def whitened(x, k, of=None):
    """Class ``k``'s samples (every third from ``k``) in the exact whitening of class ``of``
    (default ``k``): standard normal when they have that class's law."""
    of = k if of is None else of
    chol = np.linalg.cholesky(COVS[of])
    return np.linalg.solve(chol, (np.asarray(x, np.float64)[k::3] - MEANS[of]).T).T


@functools.cache
def samples(name):
    """The samples of ``CASES[name]`` (balanced labels, key 0), drawn once per module."""
    p, gridf, opts, n, _, _ = CASES[name]
    src = classes(p).conditioned(Labels.balanced(3))
    x, _ = get_sampler(name)(src, jax.random.key(0), (3 * n, 2), grid=gridf(p), **opts)
    return np.asarray(x, np.float64)


def test_every_registered_sampler_has_a_case():
    assert set(CASES) == set(SAMPLERS)


@pytest.mark.parametrize(
    "name",
    [
        n if n in ("heun", "euler_maruyama") else pytest.param(n, marks=pytest.mark.slow)
        for n in CASES
    ],
)
def test_each_class_has_its_exact_law(name):
    """Moments per class (module docstring)."""
    n, bias_mean, bias_cov = CASES[name][3:]
    x = samples(name)
    se = 1.0 / np.sqrt(n)
    for k in range(3):
        z = whitened(x, k)
        mean, cov = z.mean(0), np.cov(z.T) - np.eye(2)
        assert np.all(np.abs(mean) < 4 * se + bias_mean), (k, mean / se)
        assert np.all(np.abs(np.diag(cov)) < 4 * np.sqrt(2) * se + bias_cov), (k, cov / se)
        assert abs(cov[0, 1]) < 4 * se + bias_cov, (k, cov / se)


def test_cfg_at_w_1_gives_the_conditional_samples():
    """Classifier-free guidance at ``w = 1`` (the model's own null label as guide): Euler-
    Maruyama's samples (noise from the same per-example keys) are the conditional ones. A
    sample depends on its key and global index only, so 300 guided samples are compared with
    the first 300 conditional ones."""
    p, gridf, opts, _, _, _ = CASES["euler_maruyama"]
    cfg = ClassifierFreeGuidance.create(classes(p), scale=1.0).conditioned(Labels.balanced(3))
    guided, _ = get_sampler("euler_maruyama")(cfg, jax.random.key(0), (300, 2), grid=gridf(p))
    np.testing.assert_allclose(guided, samples("euler_maruyama")[:300], rtol=1e-5, atol=1e-5)


def test_two_sample_energy_distance_at_its_floor():
    """Heun's samples of each class, whitened by the class's exact law, against standard
    normal draws: the squared energy distance within the floor of exact against exact (mean
    + 4 std of 20 pairs of 1,000 draws); class 1's samples whitened by class 2's law (the
    overlapping pair) far above it."""
    m = 1000
    rng = np.random.default_rng(1)
    null = [energy_distance(rng.normal(size=(m, 2)), rng.normal(size=(m, 2))) for _ in range(20)]
    floor = np.mean(null) + 4 * np.std(null)
    x = samples("heun")
    for k in range(3):
        got = energy_distance(whitened(x, k)[:m], rng.normal(size=(m, 2)))
        assert got < floor, (k, got, np.mean(null), np.std(null))
    assert energy_distance(whitened(x, 1, of=2)[:m], rng.normal(size=(m, 2))) > 3 * floor


@jax.jit
def mean_class_log_prob(pc, x, labels):
    """The exact classifier's mean ``log p_t(c | x)`` of the samples at VE level 0.002."""
    return jnp.mean(pc.class_log_prob(x, pc.process.t_of_ve_sigma(0.002), labels))


@pytest.mark.slow  # over 5 s on 2 idle cores
def test_guided_samplers_run_and_sharpen_the_classes():
    """TCFG acting on an interval of noise levels (Euler-Maruyama) and classifier guidance by
    the exact classifier (probability-flow Euler), each at scale 1 and 3 (one compiled
    sampler per guidance; plain CFG in samplers: ``tests/scores/test_guidance.py``): finite
    samples, and at scale 3 the exact classifier is more confident of each sample's class
    than at scale 1."""
    p = VP()
    pc = classes(p)
    rule = Labels.balanced(3)
    runs = {
        "euler_maruyama": ClassifierFreeGuidance.create(
            pc, scale=1.0, filter="tangential", interval=(0.05, 5.0)
        ),
        "pf_ode_euler": ClassifierGuidance.create(pc, pc, scale=1.0),
    }
    labels = jnp.asarray(np.arange(300) % 3)
    for name, guided in runs.items():
        score = {}
        for w in (1.0, 3.0):
            src = guided.replace(scale=jnp.float32(w)).conditioned(rule)
            x, _ = get_sampler(name)(src, jax.random.key(2), (300, 2), grid=uniform_t_grid(p, 50))
            assert np.all(np.isfinite(np.asarray(x))), (name, w)
            score[w] = float(mean_class_log_prob(pc, x, labels))
        assert score[3.0] > score[1.0] + 0.05, (name, score)


def test_labels_through_the_drivers_blocks(monkeypatch):
    """Uniform labels from each example's key, batch 7 in blocks of 3 (two blocks and a
    remainder), probability-flow Euler: example ``i`` equals the same example drawn alone
    (``first_index = 5 + i``), and the labels differ between examples (so an example bound to
    another's label would show)."""
    p = EDM()
    src = classes(p).conditioned(Labels.uniform(3))
    sampler, key, grid = get_sampler("pf_ode_euler"), jax.random.key(3), edm_grid(2, 0.1, 5.0)
    labels = np.asarray(src.for_examples(key, 7, 5).labels)
    assert len(set(labels.tolist())) == 3, labels
    monkeypatch.setattr(driver, "CPU_CHUNK", 3)
    blocks, _ = sampler(src, key, (7, 2), grid=grid, first_index=5)
    ones = [sampler(src, key, (1, 2), grid=grid, first_index=5 + i)[0] for i in range(7)]
    np.testing.assert_allclose(np.asarray(blocks), np.concatenate(ones), rtol=1e-5, atol=1e-6)
