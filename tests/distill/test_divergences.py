"""h(r) = f''(r) r^2 for every divergence, the ratio pipeline and the normalisations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib import distill
from scorelib.distill import ratio

R = np.array([0.15, 0.5, 0.9, 1.0, 1.7, 4.0, 19.0])


@pytest.mark.parametrize("name", distill.DIVERGENCES)
def test_h_is_f_second_derivative_times_r_squared(name):
    with jax.enable_x64(True):
        d = 1e-4 * R
        f = lambda r: np.asarray(distill.f_fn(name, jnp.asarray(r, jnp.float64)))  # noqa: E731
        f2 = (f(R + d) - 2 * f(R) + f(R - d)) / d**2  # central second difference
        h = np.asarray(distill.h_weight(name, jnp.asarray(R)))
    np.testing.assert_allclose(h, f2 * R**2, rtol=1e-5)


@pytest.mark.parametrize("name", distill.DIVERGENCES)
def test_f_is_a_divergence_generator(name):
    """f(1) = 0, f strictly convex (positive second differences of f itself, not of h), so
    D_f(p || q) = sum_i q_i f(p_i / q_i) is 0 for p = q and positive for p != q."""
    with jax.enable_x64(True):
        f = lambda r: np.asarray(distill.f_fn(name, jnp.asarray(r, jnp.float64)))  # noqa: E731
        assert abs(float(f(1.0))) < 1e-12
        r, d = np.geomspace(0.05, 20.0, 41), 1e-3
        second = (f(r + d) - 2 * f(r) + f(r - d)) / d**2
        assert np.all(second > 0), second
        q = np.array([0.4, 0.4, 0.2])
        for p in (np.array([0.2, 0.5, 0.3]), np.array([0.39, 0.41, 0.2])):
            assert float(np.sum(q * f(p / q))) > 0
        assert abs(float(np.sum(q * f(q / q)))) < 1e-12


def test_unknown_divergence_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"distill.divergence must be one of .*got 'tv'"):
        distill.h_weight("tv", jnp.ones(3))
    with pytest.raises(ValueError, match="distill.divergence"):
        distill.DistillConfig(divergence="tv")


def test_ratio_from_logits_clamps_and_averages_heads():
    logits = jnp.array([[0.0, 2.0], [30.0, 30.0], [-30.0, -1.0], [np.log(3.0), np.log(3.0)]])
    r = np.asarray(distill.ratio_from_logits(logits))
    np.testing.assert_allclose(r, [np.e, 20.0, 0.1, 3.0], rtol=1e-6)
    r = np.asarray(distill.ratio_from_logits(logits, logit_clip=1.0, ratio_max=100.0))
    np.testing.assert_allclose(r[1], np.e, rtol=1e-6)
    g = jax.grad(lambda z: jnp.sum(distill.ratio_from_logits(z)))(logits)
    assert np.all(np.asarray(g) == 0)  # no gradient through the ratio


def test_two_stage_normalisation_against_a_loop():
    rng = np.random.default_rng(0)
    b, bins = 64, 10
    sigma = rng.uniform(0.002, 80.0, b) ** 1.0
    sigma[:20] = rng.uniform(0.002, 8.0, 20)  # a crowded first bin
    r = rng.lognormal(0.0, 1.0, b).astype(np.float32)
    previous = rng.uniform(0.5, 2.0, bins).astype(np.float32)
    for ema in (0.0, 0.5):
        idx = np.asarray(distill.bin_index(jnp.asarray(sigma), 0.002, 80.0, bins))
        means = np.asarray(
            distill.bin_means(jnp.asarray(r), jnp.asarray(idx), bins, jnp.asarray(previous), ema)
        )
        for k in range(bins):
            lo, hi = 0.002 + k * (80 - 0.002) / bins, 0.002 + (k + 1) * (80 - 0.002) / bins
            inside = (sigma >= lo) & (sigma < hi) if k < bins - 1 else (sigma >= lo)
            assert np.array_equal(idx == k, inside)
            want = ema * previous[k] + (1 - ema) * r[inside].mean() if inside.any() else previous[k]
            np.testing.assert_allclose(means[k], want, rtol=1e-5)
        rn = distill.normalise_ratio(jnp.asarray(r), jnp.asarray(idx), jnp.asarray(means))
        rn = np.asarray(rn)
        if ema == 0.0:  # each populated bin's normalised ratios average 1
            for k in set(idx.tolist()):
                np.testing.assert_allclose(rn[idx == k].mean(), 1.0, rtol=1e-5)
        for name in distill.DIVERGENCES:
            h = np.asarray(distill.normalise_weights(distill.h_weight(name, jnp.asarray(rn))))
            np.testing.assert_allclose(h.mean(), 1.0, rtol=1e-5)
            assert np.all(h > 0)


def test_rkl_weights_are_one():
    rn = jnp.asarray(np.random.default_rng(1).lognormal(size=32), jnp.float32)
    h = ratio.normalise_weights(distill.h_weight("rkl", rn))
    np.testing.assert_allclose(np.asarray(h), 1.0, rtol=2e-6)


def _np_softplus(x):
    return np.logaddexp(0.0, x)  # log(1 + e^x), stable, float64


def test_gan_discriminator_r1_and_fake_score_losses_against_numpy():
    """Each loss against a float64 numpy loop over examples and heads: the generator's
    and the discriminator's terms are means over heads of per-head softplus terms, R1 the
    mean over heads of squared logit differences, the fake score's the mean over the
    data dimensions of the squared x0 error."""
    rng = np.random.default_rng(1)
    b, heads = 5, 3
    lf, lr_, ln = (rng.normal(scale=4.0, size=(b, heads)) for _ in range(3))
    want_gen = [sum(_np_softplus(-lf[i, k]) for k in range(heads)) / heads for i in range(b)]
    want_disc = [
        sum(_np_softplus(lf[i, k]) + _np_softplus(-lr_[i, k]) for k in range(heads)) / heads
        for i in range(b)
    ]
    want_r1 = [sum((lr_[i, k] - ln[i, k]) ** 2 for k in range(heads)) / heads for i in range(b)]
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    np.testing.assert_allclose(distill.gan_generator_losses(f32(lf)), want_gen, rtol=1e-5)
    np.testing.assert_allclose(
        distill.discriminator_losses(f32(lf), f32(lr_)), want_disc, rtol=1e-5
    )
    np.testing.assert_allclose(distill.r1_example_losses(f32(lr_), f32(ln)), want_r1, rtol=1e-5)
    # softplus of the mean logit (the term before) differs: the test separates the two
    assert not np.allclose(want_gen, _np_softplus(-lf.mean(-1)), rtol=1e-3)
    x_fake, g = rng.normal(size=(b, 2, 3, 1)), rng.normal(size=(b, 2, 3, 1))
    want_fake = [np.sum((x_fake[i] - g[i]) ** 2) / 6 for i in range(b)]
    np.testing.assert_allclose(
        distill.fake_score_example_losses(f32(x_fake), f32(g)), want_fake, rtol=1e-5
    )
    # gradients: the fake-score loss moves x_fake only, the generator term the logits
    gx, gg = jax.grad(
        lambda a, c: jnp.sum(distill.fake_score_example_losses(a, c)), argnums=(0, 1)
    )(f32(x_fake), f32(g))
    np.testing.assert_allclose(gx, 2 * (x_fake - g) / 6, rtol=1e-4, atol=1e-6)
    assert not np.any(np.asarray(gg))
    gl = jax.grad(lambda a: jnp.sum(distill.gan_generator_losses(a)))(f32(lf))
    np.testing.assert_allclose(gl, -1 / (1 + np.exp(lf)) / heads, rtol=1e-4, atol=1e-7)
