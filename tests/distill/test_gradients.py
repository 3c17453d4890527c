"""The student loss's gradient is the f-divergence gradient (Xu et al. 2025, Thm. 1):
checked on 1-D Gaussians against finite differences of D_f computed by quadrature, and
reduced to DMD/VSD for reverse-KL; the discriminator recovers a known log density ratio."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from scipy import integrate, stats

from scorelib import distill
from scorelib.nets import MLP
from scorelib.processes import EDM

MU_P, S_P = 0.3, 1.0  # teacher p_0 = N(MU_P, S_P^2)
M, S = -0.2, 0.8  # student q_0 = N(M, S^2), g = M + S z
SIGMA = 0.5  # noise level (EDM: alpha = 1)


def divergence_by_quadrature(name, m, s):
    """D_f(p_t || q_t) = int q_t f(p_t / q_t) dx with scipy.integrate.quad (float64)."""
    vp, vq = S_P**2 + SIGMA**2, s**2 + SIGMA**2

    def integrand(x):
        lq = stats.norm.logpdf(x, m, np.sqrt(vq))
        r = np.exp(stats.norm.logpdf(x, MU_P, np.sqrt(vp)) - lq)
        return np.exp(lq) * float(distill.f_fn(name, jnp.float64(r)))

    return integrate.quad(integrand, -25, 25, epsabs=1e-13, epsrel=1e-12, limit=200)[0]


def estimated_gradient(name, m, s, nodes=80):
    """(1 / sigma^2) grad_theta E[student loss] with exact scores, exact r and w = 1,
    the expectation over (z, eps) by a Gauss-Hermite tensor rule."""
    x, wq = np.polynomial.hermite_e.hermegauss(nodes)  # weight exp(-x^2 / 2)
    wq = wq / wq.sum()
    z, e = (a.ravel() for a in np.meshgrid(x, x, indexing="ij"))
    weight = jnp.asarray(np.outer(wq, wq).ravel())
    vp = S_P**2 + SIGMA**2

    def loss(theta):
        mm, ss = theta
        g = (mm + ss * jnp.asarray(z))[:, None]  # [batch, 1]
        x_t = g + SIGMA * jnp.asarray(e)[:, None]
        vq = ss**2 + SIGMA**2
        score_p, score_q = -(x_t - MU_P) / vp, -(x_t - mm) / vq
        log_r = (
            -0.5 * (x_t - MU_P) ** 2 / vp
            - 0.5 * jnp.log(vp)
            + 0.5 * (x_t - mm) ** 2 / vq
            + 0.5 * jnp.log(vq)
        )[:, 0]
        h = distill.h_weight(name, jnp.exp(log_r))
        x_teacher, x_fake = x_t + SIGMA**2 * score_p, x_t + SIGMA**2 * score_q  # Tweedie
        per = distill.student_example_losses(g, x_teacher, x_fake, h, jnp.ones_like(h))
        return jnp.sum(weight * per)

    return np.asarray(jax.grad(loss)(jnp.asarray([m, s]))) / SIGMA**2


@pytest.mark.parametrize("name", distill.DIVERGENCES)
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_gradient_matches_finite_differences_of_the_divergence(name):
    with jax.enable_x64(True):
        d = 1e-4
        D = lambda m, s: divergence_by_quadrature(name, m, s)  # noqa: E731
        fd = np.array([D(M + d, S) - D(M - d, S), D(M, S + d) - D(M, S - d)]) / (2 * d)
        est = estimated_gradient(name, M, S)
    assert np.all(np.abs(fd) > 1e-3)  # a gradient worth comparing
    np.testing.assert_allclose(est, fd, rtol=2e-4, atol=1e-7)


def test_rkl_student_gradient_is_the_dmd_gradient():
    """With h from reverse-KL the gradient is DMD's, mean_b w_b (x_fake - x_teacher)_b / d
    times dg_b / dtheta (Yin et al. 2024a, eq. 7-8), for any discriminator logits."""
    rng = np.random.default_rng(0)
    b, d = 7, 3
    z = jnp.asarray(rng.normal(size=(b, d)), jnp.float32)
    x_teacher = jnp.asarray(rng.normal(size=(b, d)), jnp.float32)
    x_fake = jnp.asarray(rng.normal(size=(b, d)), jnp.float32)
    logits = jnp.asarray(rng.normal(size=(b, 2)) * 3, jnp.float32)
    A, c = jnp.asarray(rng.normal(size=(d, d)), jnp.float32), jnp.zeros(d) + 0.5

    def loss(params):
        g = z @ params[0] + params[1]
        r = distill.ratio_from_logits(logits)
        h = distill.normalise_weights(distill.h_weight("rkl", r))
        w = distill.dmd_weight(g, x_teacher)
        return jnp.mean(distill.student_example_losses(g, x_teacher, x_fake, h, w))

    gA, gc = jax.grad(loss)((A, c))
    g = np.asarray(z @ A + c)
    w = 1.0 / (np.abs(g - np.asarray(x_teacher)).mean(1) + 1e-6)
    delta = w[:, None] * (np.asarray(x_fake) - np.asarray(x_teacher)) / (b * d)  # dL/dg
    np.testing.assert_allclose(np.asarray(gc), delta.sum(0), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(gA), np.asarray(z).T @ delta, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_discriminator_recovers_the_log_density_ratio():
    """Trained with the logistic loss on N(0, 1) ("real") against N(0.8, 1.3^2), the
    logit approaches log p / q in the bulk of both (|x| <= 1.5)."""
    process, sigma_data = EDM(), 1.0
    backbone = MLP((1,), width=64, depth=2, rngs=nnx.Rngs(1))
    disc = distill.Discriminator([(64,), (64,)], 32, backbone, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(disc, nnx.Param)
    opt = optax.adam(3e-3)
    t = jnp.full((512,), 0.01)  # nearly clean: p_t ~ p_0

    def logits(p, x):
        return nnx.merge(graphdef, p)(
            *distill.network_inputs(process, x, t[: x.shape[0]], sigma_data)
        )

    def step(carry, key):
        p, o = carry
        kr, kf = jax.random.split(key)
        real = jax.random.normal(kr, (512, 1))
        fake = 0.8 + 1.3 * jax.random.normal(kf, (512, 1))
        loss, g = jax.value_and_grad(
            lambda q: jnp.mean(distill.discriminator_losses(logits(q, fake), logits(q, real)))
        )(p)
        u, o = opt.update(g, o, p)
        return (optax.apply_updates(p, u), o), loss

    train = jax.jit(lambda c: jax.lax.scan(step, c, jax.random.split(jax.random.key(0), 2000)))
    (params, _), _ = train((params, opt.init(params)))
    x = np.linspace(-1.5, 1.5, 13)[:, None].astype(np.float32)
    vt = 0.01**2
    want = stats.norm.logpdf(x[:, 0], 0, np.sqrt(1 + vt)) - stats.norm.logpdf(
        x[:, 0], 0.8, np.sqrt(1.69 + vt)
    )
    got = np.asarray(jnp.mean(logits(params, jnp.asarray(x)), -1))
    np.testing.assert_allclose(got, want, atol=0.15)
    # a constant (the prior log ratio) or a sign flip would fail:
    assert np.corrcoef(got, want)[0, 1] > 0.99
