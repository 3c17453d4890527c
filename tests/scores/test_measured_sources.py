"""Measurement-conditioned sources (``scorelib.scores.measured``) against independent routes.

* PiGDM against the exact posterior (``gaussian_posterior``, the Gaussian conditioning formula
  in dense numpy): equal pointwise for an isotropic prior ``N(mu, c I)`` with
  ``sigma_data^2 = c`` (EDM and VP, several times, a scalar and a ``[batch]`` time; operators
  with an SVD, GaussianBlur by its SVD and, wrapped in ``Stacked``, on the conjugate-gradient
  path, a stacked measurement with two noise levels), and off by a checked margin for an
  anisotropic prior (``notes/conditioning-anchors.md``, section 4).
* Projection against the exact posterior's denoiser: equal for noiseless inpainting of a
  diagonal-covariance prior, not for a correlated one.
* DPS's added term against ``zeta J^T A^T r / ||r||`` from the closed-form Jacobian of the
  Gaussian denoiser and the dense ``A``; per example; zero for a zero residual; parallel to
  the exact likelihood score for ``C = c I`` and ``A A^T = I``, with the predicted ratio.
* Binding: ``Observations.take`` against a Python loop (repeats, wraparound, traced first
  index); a sampler's batch in CPU blocks against single-example calls; an unbound source and
  the base class refuse to run.
* Heun driven by PiGDM on an isotropic prior draws the exact posterior: whitened sample mean
  and covariance within their standard errors, the discretisation error checked far below.
* The refusals of ``posterior_source`` / ``MeasuredScore.create``.
"""

from __future__ import annotations

import closed_forms as cf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib import operators as ops
from scorelib.processes import EDM, VP
from scorelib.samplers import driver, edm_grid, heun
from scorelib.scores import GaussianScore
from scorelib.scores.measured import (
    DPS,
    MeasuredScore,
    Observations,
    PiGDM,
    Projection,
    posterior_source,
)
from scorelib.scores.posterior import gaussian_posterior, operator_matrix

SHAPE = (4, 4, 1)
D = 16
KEY = jax.random.key(0)
PROCESSES = {"edm": EDM(), "vp": VP()}
TIMES = {"edm": (0.05, 0.7, 8.0), "vp": (0.05, 0.4, 0.9)}


def batch_times(name):
    """A ``[3]`` time, one per example (float64)."""
    return np.asarray(TIMES[name], np.float64)


def measurement(name):
    """A measurement of ``SHAPE`` (build inside x64: its arrays are then float64)."""
    key = jax.random.key(1)
    if name == "stacked":
        low = ops.Measurement.create(ops.Downsample.create(SHAPE, 2), 0.05)
        few = ops.Measurement.create(ops.Inpainting.random(key, SHAPE, 0.25), 0.3)
        return ops.Measurement.stack([low, few])
    if name == "blur_cg":  # the blur's matrix without its SVD: the conjugate-gradient path
        return ops.Measurement.create(
            ops.Stacked.create([ops.GaussianBlur.create(SHAPE, 0.8, 3)]), 0.1
        )
    op, sigma_y = {
        "inpainting": (lambda: ops.Inpainting.random(key, SHAPE, 0.5), 0.2),
        "downsample": (lambda: ops.Downsample.create(SHAPE, 2), 0.1),
        "projection": (lambda: ops.RandomProjection.create(key, SHAPE, 5), 0.15),
        "blur": (lambda: ops.GaussianBlur.create(SHAPE, 0.8, 3), 0.1),
    }[name]
    return ops.Measurement.create(op(), sigma_y)


def isotropic(process, c=0.4, seed=0):
    """``(prior, mu, cov)``: ``N(mu, c I)``."""
    mu = np.random.default_rng(seed).normal(size=D)
    cov = c * np.eye(D)
    return GaussianScore.from_covariance(process, mu, cov, SHAPE), mu, cov


def correlated(process, seed=0):
    """``(prior, mu, cov)``: a random full covariance (eigenvalues spread over ~[0.1, 3])."""
    rng = np.random.default_rng(seed)
    b = rng.normal(size=(D, D))
    cov = b @ b.T / D + 0.1 * np.eye(D)
    mu = rng.normal(size=D)
    return GaussianScore.from_covariance(process, mu, cov, SHAPE), mu, cov


def flat(x):
    return np.asarray(x, np.float64).reshape(np.shape(x)[0], -1)


@jax.jit
def jit_score(source, x, t):
    """``source.score(x, t)`` compiled (the conjugate-gradient loops run eagerly otherwise,
    one dispatch per operation and iteration)."""
    return source.score(x, t)


def assert_rows_close(got, want, rel):
    """Each example's largest error within ``rel`` times its largest ``|want|``."""
    err = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    assert np.all(err <= rel), err


# --------------------------------------------------------------------------- PiGDM
SVD_OPS = ["inpainting", "downsample", "projection", "blur"]
CG_OPS = ["blur_cg", "stacked"]


@pytest.mark.parametrize("proc", ["edm", "vp"])
@pytest.mark.parametrize("op_name", SVD_OPS + CG_OPS)
def test_pigdm_is_the_exact_posterior_score_for_an_isotropic_prior(proc, op_name):
    with jax.enable_x64(True):
        process = PROCESSES[proc]
        prior, mu, _ = isotropic(process)
        meas = measurement(op_name)
        rng = np.random.default_rng(2)
        y = rng.normal(size=meas.operator.m)
        src = posterior_source("pigdm", prior, meas, y, sigma_data=np.sqrt(0.4))
        src = src.for_examples(KEY, 3, 0)
        post = gaussian_posterior(prior, meas, y)
        x = rng.normal(size=(3, *SHAPE))
        # S^-1 r by conjugate gradients stops at a relative residual of 1e-6
        rtol = 1e-5 if op_name in CG_OPS else 1e-10
        for t in [np.float64(t) for t in TIMES[proc]] + [batch_times(proc)]:
            want = flat(post.score(x, t))
            got = flat(jit_score(src, x, t) if op_name in CG_OPS else src.score(x, t))
            assert_rows_close(got, want, rtol)
            # and the likelihood term is not negligible: the prior alone is far off
            prior_gap = np.abs(flat(prior.score(x, t)) - want).max(axis=1)
            assert np.all(prior_gap > 1e-3 * np.abs(want).max(axis=1))


@pytest.mark.parametrize("op_name", ["projection", "blur"])
def test_pigdm_is_biased_for_an_anisotropic_prior(op_name):
    """With a correlated prior, ``p(x0 | x_t)`` is not ``N(D, r_t^2 I)`` for any single
    ``sigma_data``: PiGDM at the prior's mean variance misses the exact score by far more
    than its own numerical tolerance (1e-5 relative, above)."""
    with jax.enable_x64(True):
        prior, _, cov = correlated(EDM(), seed=3)
        meas = measurement(op_name)
        rng = np.random.default_rng(4)
        y = rng.normal(size=meas.operator.m)
        sd = float(np.sqrt(np.trace(cov) / D))
        src = posterior_source("pigdm", prior, meas, y, sigma_data=sd).for_examples(KEY, 3, 0)
        post = gaussian_posterior(prior, meas, y)
        x = rng.normal(size=(3, *SHAPE))
        for t in (np.float64(0.3), np.float64(1.0)):
            want = flat(post.score(x, t))
            gap = np.abs(flat(src.score(x, t)) - want).max(axis=1)
            assert np.all(gap > 1e-2 * np.abs(want).max(axis=1))


def test_pigdm_cg_path_is_accurate_per_example():
    """On the conjugate-gradient path (no SVD) each example's ``S^-1 r`` is solved to its own
    tolerance, whatever the other examples of the batch: a 12 x 12 blur in ``Stacked`` (no
    SVD), example 0 with a residual 1e6 times larger than example 1's. Example 1's score
    matches the exact posterior's relative to its own size, in the batch and alone. (One CG over the
    flattened batch stopped at 1e-6 of the whole batch's residual: off by 3e-5 at t = 2.)"""
    with jax.enable_x64(True):
        shape = (12, 12, 1)
        rng = np.random.default_rng(5)
        prior = GaussianScore.from_covariance(EDM(), rng.normal(size=144), 0.4 * np.eye(144), shape)
        blur = ops.Stacked.create([ops.GaussianBlur.create(shape, 1.5, 9)])
        meas = ops.Measurement.create(blur, 1e-3)
        ys = np.stack([1e6 * rng.normal(size=144), rng.normal(size=144)])
        src = posterior_source("pigdm", prior, meas, ys, sigma_data=np.sqrt(0.4))
        x = rng.normal(size=(2, *shape))
        for t in (np.float64(0.5), np.float64(2.0)):
            want = flat(gaussian_posterior(prior, meas, ys[1]).score(x[1:], t))
            both = flat(jit_score(src.for_examples(KEY, 2, 0), x, t))[1:]
            alone = flat(jit_score(src.for_examples(KEY, 1, 1), x[1:], t))
            assert_rows_close(both, want, 1e-5)
            assert_rows_close(alone, want, 1e-5)


# --------------------------------------------------------------------------- Projection
@pytest.mark.parametrize("proc", ["edm", "vp"])
def test_projection_is_exact_for_noiseless_inpainting_of_a_diagonal_prior(proc):
    with jax.enable_x64(True):
        process = PROCESSES[proc]
        rng = np.random.default_rng(6)
        mu = rng.normal(size=D)
        diag_cov = np.diag(rng.uniform(0.2, 2.0, size=D))
        b = rng.normal(size=(D, D))
        full_cov = b @ b.T / D + 0.2 * np.eye(D)
        meas = ops.Measurement.create(ops.Inpainting.random(jax.random.key(2), SHAPE, 0.5), 0.0)
        y = rng.normal(size=meas.operator.m)
        x = rng.normal(size=(3, *SHAPE))
        gaps = []
        for cov in (diag_cov, full_cov):
            prior = GaussianScore.from_covariance(process, mu, cov, SHAPE)
            src = posterior_source("projection", prior, meas, y).for_examples(KEY, 3, 0)
            post = gaussian_posterior(prior, meas, y)
            for t in [np.float64(t) for t in TIMES[proc]] + [batch_times(proc)]:
                want = flat(post.denoiser(x, t))
                got = flat(src.denoiser(x, t))
                small_t = np.ndim(t) == 0 and t == TIMES[proc][0]
                gap = np.abs(got - want).max() / np.abs(want).max()
                gaps.append((cov is diag_cov, small_t, gap))
        exact = [g for diag, _, g in gaps if diag]
        biased = [g for diag, small_t, g in gaps if not diag and not small_t]
        assert max(exact) < 1e-12
        # correlated prior: the missing pixels should move with the measured ones, and the
        # replacement leaves them at the prior's denoiser (at small t both denoisers near x)
        assert len(biased) == 3 and min(biased) > 1e-2


# --------------------------------------------------------------------------- DPS
def gaussian_jacobian(process, t, cov):
    """``dD/dx = alpha C (alpha^2 C + sigma^2 I)^-1`` (symmetric) of ``N(mu, C)`` at ``t``."""
    a, s = cf.alpha_sigma(process, t)
    return a * cov @ np.linalg.inv(a**2 * cov + s**2 * np.eye(len(cov)))


def gaussian_denoiser(process, t, mu, cov, xf):
    a, s = cf.alpha_sigma(process, t)
    m = a**2 * cov + s**2 * np.eye(len(cov))
    return mu + np.linalg.solve(m, (xf - a * mu).T).T @ (a * cov)


@pytest.mark.parametrize("proc", ["edm", "vp"])
@pytest.mark.parametrize("op_name", ["projection", "downsample", "blur"])
def test_dps_term_against_the_dense_jacobian(proc, op_name):
    with jax.enable_x64(True):
        process = PROCESSES[proc]
        prior, mu, cov = correlated(process, seed=7)
        meas = measurement(op_name)
        a_mat = operator_matrix(meas, D, SHAPE)
        rng = np.random.default_rng(8)
        ys = rng.normal(size=(3, meas.operator.m))
        zeta = 0.7
        src = posterior_source("dps", prior, meas, ys, zeta=zeta).for_examples(KEY, 3, 0)
        x = rng.normal(size=(3, *SHAPE))
        xf = flat(x)
        for t in TIMES[proc]:
            t = np.float64(t)
            jac = gaussian_jacobian(process, t, cov)
            r = ys - gaussian_denoiser(process, t, mu, cov, xf) @ a_mat.T
            unit = r / np.linalg.norm(r, axis=1, keepdims=True)
            want = zeta * unit @ a_mat @ jac  # J^T A^T r/||r||, J symmetric
            got = flat(src.score(x, t)) - flat(prior.score(x, t))
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-10 * np.abs(want).max())
            _, term = src.likelihood_score(x, t)
            np.testing.assert_allclose(flat(term), want, rtol=0, atol=1e-10 * np.abs(want).max())


def test_dps_is_per_example():
    """An example's score is that of a batch of one at its global index, and does not move
    when another example's state does."""
    with jax.enable_x64(True):
        prior, _, _ = correlated(EDM(), seed=9)
        meas = measurement("projection")
        rng = np.random.default_rng(10)
        ys = rng.normal(size=(4, meas.operator.m))
        src = posterior_source("dps", prior, meas, ys, zeta=1.3)
        x = rng.normal(size=(4, *SHAPE))
        t = np.float64(0.5)
        whole = flat(src.for_examples(KEY, 4, 0).score(x, t))
        for i in range(4):
            alone = flat(src.for_examples(KEY, 1, i).score(x[i : i + 1], t))
            np.testing.assert_allclose(whole[i], alone[0], rtol=1e-13, atol=1e-13)
        moved = x.copy()
        moved[0] += 3.0
        other = flat(src.for_examples(KEY, 4, 0).score(moved, t))
        np.testing.assert_allclose(other[1:], whole[1:], rtol=1e-13, atol=1e-13)
        assert np.abs(other[0] - whole[0]).max() > 0.1


def test_dps_zero_residual_adds_nothing():
    """``y = A D(x)`` exactly (inpainting reads D's entries): the term is 0, not a unit
    vector of rounding noise; an example with a nonzero residual still gets its term."""
    with jax.enable_x64(True):
        prior, _, _ = correlated(EDM(), seed=11)
        op = ops.Inpainting.random(jax.random.key(3), SHAPE, 0.5)
        meas = ops.Measurement.create(op, 0.1)
        x = np.random.default_rng(12).normal(size=(2, *SHAPE))
        t = np.float64(0.8)
        den = np.asarray(prior.denoiser(jnp.asarray(x), t)).reshape(2, -1)
        idx = np.asarray(op.index)
        ys = np.stack([den[0, idx], den[1, idx] + 0.5])
        src = posterior_source("dps", prior, meas, ys, zeta=2.0).for_examples(KEY, 2, 0)
        _, term = src.likelihood_score(x, t)
        term = flat(term)
        np.testing.assert_array_equal(term[0], 0.0)
        assert np.linalg.norm(term[1]) > 0.1


@pytest.mark.parametrize("proc", ["edm", "vp"])
def test_dps_is_parallel_to_the_exact_likelihood_score(proc):
    """``C = c I`` and ``A A^T = I`` (inpainting): the exact likelihood score is
    ``J A^T r / (r_t^2 + sigma_y^2)`` and DPS's term ``zeta J A^T r / ||r||``, so the term is
    the exact one times ``zeta (r_t^2 + sigma_y^2) / ||r||`` per example."""
    with jax.enable_x64(True):
        process = PROCESSES[proc]
        c, sigma_y, zeta = 0.4, 0.2, 0.9
        prior, mu, cov = isotropic(process, c=c, seed=13)
        op = ops.Inpainting.random(jax.random.key(4), SHAPE, 0.5)
        meas = ops.Measurement.create(op, sigma_y)
        a_mat = operator_matrix(meas, D, SHAPE)
        rng = np.random.default_rng(14)
        y = rng.normal(size=op.m)
        src = posterior_source("dps", prior, meas, y, repeats=3, zeta=zeta)
        src = src.for_examples(KEY, 3, 0)
        post = gaussian_posterior(prior, meas, y)
        x = rng.normal(size=(3, *SHAPE))
        for t in TIMES[proc]:
            t = np.float64(t)
            exact = flat(post.score(x, t)) - flat(prior.score(x, t))
            term = flat(src.score(x, t)) - flat(prior.score(x, t))
            cos = np.sum(exact * term, 1) / np.linalg.norm(exact, axis=1)
            cos = cos / np.linalg.norm(term, axis=1)
            np.testing.assert_allclose(cos, 1.0, rtol=0, atol=1e-10)
            s_ve = cf.ve_sigma(process, t)
            r2 = c * s_ve**2 / (c + s_ve**2)
            r = y - gaussian_denoiser(process, t, mu, cov, flat(x)) @ a_mat.T
            ratio = zeta * (r2 + sigma_y**2) / np.linalg.norm(r, axis=1)
            want = exact * ratio[:, None]
            np.testing.assert_allclose(term, want, rtol=0, atol=1e-10 * np.abs(want).max())


# --------------------------------------------------------------------------- binding
def test_observations_take_against_a_loop():
    values = np.arange(5 * 3, dtype=np.float64).reshape(5, 3)
    for repeats in (1, 2, 3):
        obs = Observations.create(values, 3, repeats)
        take = jax.jit(lambda f, obs=obs: obs.take(f, 9))
        for first in (0, 4, 13, 29):
            want = np.stack([values[((first + b) // repeats) % 5] for b in range(9)])
            np.testing.assert_array_equal(np.asarray(obs.take(first, 9)), want)
            np.testing.assert_array_equal(np.asarray(take(first)), want)  # traced first
    one = Observations.create(np.array([1.0, 2.0]), 2)
    assert one.values.shape == (1, 2) and one.m == 2


@pytest.mark.parametrize("method", ["pigdm", "dps"])
def test_a_batch_in_blocks_equals_single_examples(monkeypatch, method):
    """Batch 7 from first index 5 with blocks of 3 (two blocks and a remainder) against 7
    calls of one example; 3 measurements held by 2 examples each, so example 5 + b reads
    measurement ((5 + b) // 2) % 3 (wrapping around). Binding acts: with every example on
    measurement 0 the samples differ."""
    prior, _, _ = correlated(EDM(), seed=15)
    meas = measurement("downsample")
    ys = np.random.default_rng(16).normal(size=(3, meas.operator.m)) * 2.0
    opts = {"pigdm": {"sigma_data": 1.0}, "dps": {"zeta": 1.0}}[method]
    src = posterior_source(method, prior, meas, ys, repeats=2, **opts)
    grid = edm_grid(4, 0.05, 5.0)
    key = jax.random.key(3)
    monkeypatch.setattr(driver, "CPU_CHUNK", 3)
    blocks, info = heun(src, key, (7, *SHAPE), grid=grid, first_index=5)
    ones = [heun(src, key, (1, *SHAPE), grid=grid, first_index=5 + i)[0] for i in range(7)]
    np.testing.assert_allclose(np.asarray(blocks), np.concatenate(ones), rtol=1e-5, atol=1e-5)
    same = posterior_source(method, prior, meas, ys[:1], repeats=2, **opts)
    other, _ = heun(same, key, (7, *SHAPE), grid=grid, first_index=5)
    gap = np.abs(flat(other) - flat(blocks)).max(axis=1)
    # examples 5 and 12 read measurement 2 and 0; with one measurement everyone reads 0
    reads = [((5 + b) // 2) % 3 for b in range(7)]
    assert all((g > 1e-2) == (k != 0) for g, k in zip(gap, reads, strict=True)), (gap, reads)
    assert info == {"nfe": 7, "steps": 4}


@pytest.mark.parametrize("cls", [Projection, DPS, PiGDM])
def test_an_unbound_source_refuses_to_run(cls):
    prior, _, _ = isotropic(EDM())
    meas = measurement("downsample")
    opts = {Projection: {}, DPS: {"zeta": 1.0}, PiGDM: {"sigma_data": 0.5}}[cls]
    src = cls.create(prior, meas, np.zeros(4), **opts)
    x = jnp.zeros((2, *SHAPE))
    for source, got in ((src, "None"), (src.for_examples(KEY, 3, 0), r"'shape \(3, 4\)'")):
        call = source.denoiser if cls is Projection else source.score
        with pytest.raises(
            ValueError, match=rf"^{cls.__name__}\.y must be \[2, 4\] .*; got {got}$"
        ) as e:
            call(x, 1.0)
        assert "\n" not in str(e.value)


def test_the_base_class_adds_no_likelihood_term():
    prior, _, _ = isotropic(EDM())
    src = MeasuredScore.create(prior, measurement("downsample"), np.zeros(4))
    src = src.for_examples(KEY, 2, 0)
    x = jnp.zeros((2, *SHAPE))
    with pytest.raises(NotImplementedError, match="MeasuredScore adds no likelihood term"):
        src.score(x, 1.0)
    with pytest.raises(NotImplementedError, match="MeasuredScore adds no likelihood term"):
        src.denoiser(x, 1.0)
    np.testing.assert_array_equal(  # the prior's denoiser stays available (DDRM reads it)
        np.asarray(src.prior_denoiser(x, 1.0)), np.asarray(prior.denoiser(x, 1.0))
    )


# --------------------------------------------------------------------------- sampling
def test_heun_on_pigdm_draws_the_exact_posterior():
    """Isotropic prior, a random projection (a correlated posterior), two measurements of
    ``n`` draws each (``repeats = n``). The start is an exact draw of the noised posterior at
    sigma 10, so the only errors are Heun's and the Monte Carlo error. Whitened by the exact
    posterior (``z``, ``N(0, I)`` if exact), the draws have mean within 4 s.e.
    (``1 / sqrt(n)``) and second moments within 4 s.e. of the identity (``sqrt(2 / n)`` on
    the diagonal, ``sqrt(1 / n)`` off it). Heun's discretisation bias is checked to be far
    below those: the same moments of the closed-form probability-flow map of the exact
    posterior from the same starts differ from Heun's by under 0.2 s.e. (at 40 steps from
    sigma 80, as the posterior tests elsewhere run, the second moments are biased by about
    1.5 s.e. here)."""
    n, d, sigma_t = 4000, 4, 10.0
    with jax.enable_x64(True):
        c = 0.5
        mu = np.array([0.3, -0.5, 0.8, 0.1])
        prior = GaussianScore.from_covariance(EDM(), mu, c * np.eye(d))
        op = ops.RandomProjection.create(jax.random.key(5), (d,), 2)
        meas = ops.Measurement.create(op, 0.1)
        a_mat = operator_matrix(meas, d, (d,))
        ys = np.array([[0.9, -0.2], [-0.6, 0.4]])
        src = posterior_source("pigdm", prior, meas, ys, repeats=n, sigma_data=np.sqrt(c))
        rng = np.random.default_rng(17)
        posts, x_T = [], []
        for y in ys:  # the Gaussian conditioning formula, written here
            s = c * a_mat @ a_mat.T + 0.1**2 * np.eye(2)
            gain = c * a_mat.T @ np.linalg.inv(s)
            m_post = mu + gain @ (y - a_mat @ mu)
            c_post = c * np.eye(d) - gain @ a_mat * c
            posts.append((m_post, 0.5 * (c_post + c_post.T)))
            start_cov = c_post + sigma_t**2 * np.eye(d)
            x_T.append(rng.multivariate_normal(m_post, start_cov, size=n))
        x_T = np.concatenate(x_T)
        grid = edm_grid(80, 0.002, sigma_t)
        x, _ = heun(src, jax.random.key(0), (2 * n, d), grid=grid, x_T=x_T, float64=True)
        x = np.asarray(x)
    se_mean = 1 / np.sqrt(n)
    se_cov = np.where(np.eye(d, dtype=bool), np.sqrt(2 / n), np.sqrt(1 / n))
    for k, (m_post, c_post) in enumerate(posts):
        lam, u = np.linalg.eigh(c_post)
        start = x_T[k * n : (k + 1) * n] - m_post
        flow = (start @ u) * np.sqrt(lam / (sigma_t**2 + lam))  # eigen-coordinates at 0
        z_flow = flow / np.sqrt(lam)
        z = ((x[k * n : (k + 1) * n] - m_post) @ u) / np.sqrt(lam)
        # the discretisation bias of the moments, far below their standard errors
        assert np.all(np.abs(z.mean(0) - z_flow.mean(0)) < 0.2 * se_mean)
        assert np.all(np.abs(z.T @ z - z_flow.T @ z_flow) / n < 0.2 * se_cov)
        # the moments of the exact posterior
        assert np.all(np.abs(z.mean(0)) < 4 * se_mean), z.mean(0)
        cov_z = z.T @ z / n
        assert np.all(np.abs(cov_z - np.eye(d)) < 4 * se_cov), cov_z


# --------------------------------------------------------------------------- refusals
def _stacked(prior, down, cg, other, y):
    return posterior_source("ddrm", prior, measurement("stacked"), np.zeros(8))


REFUSALS = [  # (make(prior, down, cg, other, y), field); cg: a blur in Stacked (no SVD)
    (lambda p, down, cg, other, y: posterior_source("replace", p, down, y), "method.name"),
    (lambda p, down, cg, other, y: posterior_source("dps", p, down, y[:3], zeta=1.0), "y"),
    (lambda p, down, cg, other, y: posterior_source("dps", p, down, y[None, None], zeta=1), "y"),
    (lambda p, down, cg, other, y: posterior_source("dps", p, down, y + np.nan, zeta=1), "y"),
    (lambda p, down, cg, other, y: posterior_source("dps", p, down, y - np.inf, zeta=1), "y"),
    (lambda p, down, cg, other, y: posterior_source("dps", p, down, "abcd", zeta=1.0), "y"),
    (
        lambda p, down, cg, other, y: posterior_source("dps", p, down, y, repeats=0, zeta=1),
        "task.draws",
    ),
    (
        lambda p, down, cg, other, y: posterior_source("dps", p, down, y, repeats=1.5, zeta=1),
        "task.draws",
    ),
    (
        lambda p, down, cg, other, y: posterior_source("pigdm", p, down, y, zeta=1, sigma_data=1),
        "method",
    ),
    (
        lambda p, down, cg, other, y: posterior_source("projection", p, down, y, zeta=1.0),
        "method",
    ),
    (lambda p, down, cg, other, y: posterior_source("ddrm", p, down, y, eta=0.5), "method"),
    (lambda p, down, cg, other, y: posterior_source("dps", p, down, y), "method.zeta"),
    (lambda p, down, cg, other, y: posterior_source("dps", p, down, y, zeta=-1.0), "method.zeta"),
    (lambda p, down, cg, other, y: posterior_source("pigdm", p, down, y), "method.sigma_data"),
    (
        lambda p, down, cg, other, y: posterior_source("pigdm", p, down, y, sigma_data=0),
        "method.sigma_data",
    ),
    (
        lambda p, down, cg, other, y: posterior_source("projection", p, other, np.zeros(16)),
        "task",
    ),
    (
        lambda p, down, cg, other, y: posterior_source("ddrm", p, cg, np.zeros(16)),
        "method.name",
    ),
    (_stacked, "method.name"),
    (lambda p, down, cg, other, y: posterior_source("dps", "prior", down, y, zeta=1), "source"),
    (
        lambda p, down, cg, other, y: posterior_source("dps", p, down.operator, y, zeta=1),
        "measurement",
    ),
]


@pytest.mark.parametrize("make, field", REFUSALS, ids=[f for _, f in REFUSALS])
def test_refusals_name_their_field(make, field):
    prior, _, _ = isotropic(EDM())
    down, cg = measurement("downsample"), measurement("blur_cg")
    other = ops.Measurement.create(ops.Downsample.create((8, 8, 1), 2), 0.1)
    with pytest.raises(ValueError, match=rf"^{field} must ") as e:
        make(prior, down, cg, other, np.zeros(4))
    assert "\n" not in str(e.value)
