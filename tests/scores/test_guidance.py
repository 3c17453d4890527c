"""Guidance against closed forms on a Gaussian mixture whose classes are its components.

``notes/conditioning-anchors.md``, section 4: component ``k`` of ``x_t`` is ``N(alpha m_k,
alpha^2 C_k + sigma^2 I)``, the conditional score ``s_k = -(alpha^2 C_k + sigma^2 I)^-1 (x -
alpha m_k)``, the unconditional ``s_mix = sum_k r_k s_k`` with responsibilities ``r``, and
the exact classifier's gradient ``s_k - s_mix``. So classifier-free guidance with exact parts
is ``s_mix + w (s_k - s_mix)`` and equals classifier guidance with the exact classifier at
scale ``w``; ``w = 1`` is ``s_k``, ``w = 0`` is ``s_mix``. Everything here is computed in
float64 numpy from those formulas (``solve``, scipy's log-densities), never by the library.

Fault kind 12 (``notes/fault-kinds.md``, guidance conventions) as a whole: the library's
convention is the lerp weight (1 = conditional); Ho and Salimans' ``w_HS`` converts as
``1 + w_HS``; the mixed form ``D_c + w (D_c - D_u)`` is not what is computed (the closed
form at several ``w`` tells them apart); guidance is on for every ``w != 1`` (``w`` below 1,
0 and a small ``w`` above 1 evaluate the guide and change the answer, ``w = 1`` does not
evaluate it at all).
"""

from __future__ import annotations

import closed_forms as cf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from scorelib.processes import EDM, VP
from scorelib.samplers import edm_grid, get_sampler
from scorelib.scores import GaussianScore, Labels, PerClassScore, ScoreSource
from scorelib.scores.guidance import (
    ClassifierFreeGuidance,
    ClassifierGuidance,
    lerp_weight_from_ho_salimans,
    tangential_filter,
)

MEANS = np.array([[1.5, 0.0], [-1.0, 0.6], [-0.7, 0.9]])  # classes 1 and 2 overlap
COVS = np.stack(
    [
        np.diag([0.3, 0.2]),
        np.array([[0.4, 0.1], [0.1, 0.2]]),
        np.array([[0.2, -0.05], [-0.05, 0.5]]),
    ]
)
WEIGHTS = np.array([0.25, 0.35, 0.4])
LABELS = np.array([0, 1, 2, 1, 2, 0])
WS = [0.0, 0.5, 1.0, 1.05, 2.0, 7.5, -0.5]


def exact(p):
    """The mixture as a ``PerClassScore`` of its components with the mixture weights."""
    srcs = [GaussianScore.from_covariance(p, m, c) for m, c in zip(MEANS, COVS, strict=True)]
    return PerClassScore.create(srcs, prior=WEIGHTS)


def closed_form(p, x, t, means=MEANS):
    """``(s_k [K, b, d], s_mix [b, d], D_k [K, b, d], D_mix [b, d])`` in float64 at a scalar or
    ``[b]`` time (section 4; the denoiser by Tweedie, ``(x + sigma^2 s) / alpha``) for the
    classes of ``means`` with ``COVS`` and ``WEIGHTS``."""
    b, d = x.shape
    a, s = (np.broadcast_to(v, (b,)) for v in cf.alpha_sigma(p, t))
    sk, logj = np.zeros((3, b, d)), np.zeros((3, b))
    for k in range(3):
        for i in range(b):
            c = a[i] ** 2 * COVS[k] + s[i] ** 2 * np.eye(d)
            sk[k, i] = -np.linalg.solve(c, x[i] - a[i] * means[k])
            logj[k, i] = np.log(WEIGHTS[k]) + stats.multivariate_normal(a[i] * means[k], c).logpdf(
                x[i]
            )
    r = np.exp(logj - logj.max(0))
    r /= r.sum(0)
    smix = np.einsum("kb,kbd->bd", r, sk)
    den = lambda sc: (x + s[:, None] ** 2 * sc) / a[:, None]  # noqa: E731
    return sk, smix, np.stack([den(v) for v in sk]), den(smix)


def points(p, t, seed=0):
    """Six noisy points near the classes of ``LABELS`` (float64)."""
    rng = np.random.default_rng(seed)
    a, s = (np.broadcast_to(v, (6,)) for v in cf.alpha_sigma(p, t))
    return a[:, None] * MEANS[LABELS] + (0.5 * a + s)[:, None] * rng.normal(size=(6, 2))


def assert_rows_close(got, want, rel):
    """Each example within ``rel`` of its reference's norm (plus a float32 floor)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.linalg.norm(got - want, axis=-1)
    assert np.all(err <= rel * np.linalg.norm(want, axis=-1) + 1e-5), (err, want)


def assert_same(got, want):
    """Bit for bit on XLA:CPU (two compiled programs doing the same arithmetic); within
    float32 rounding elsewhere, where another backend may fuse them differently (the lerp's
    rounding at ``w = 1``, which this guards against on CPU, is caught there by the NaN
    guide)."""
    if jax.default_backend() == "cpu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


class NaNSource(ScoreSource):
    """A guide that must never be evaluated: its denoiser is NaN."""

    def denoiser(self, x, t):
        return jnp.full(x.shape, jnp.nan, x.dtype)


scores = jax.jit(lambda src, x, t: src.score_given(x, t, jnp.asarray(LABELS)))
denoise = jax.jit(lambda src, x, t: src.denoiser_given(x, t, jnp.asarray(LABELS)))


def picked(values):
    """``values[LABELS[b], b]`` of ``[K, 6, d]`` closed forms: each example's class."""
    return values[LABELS, np.arange(6)]


# ----------------------------------------------------------------------------- closed forms
def test_cfg_and_classifier_guidance_equal_the_closed_form():
    """For each ``w`` of ``WS``: CFG with the model's own null label, and classifier guidance
    of the mixture by the exact classifier at scale ``w``, both equal ``s_mix + w (s_k -
    s_mix)`` (VP: alpha != 1); Ho and Salimans' ``(1 + w_HS) s_k - w_HS s_mix`` at ``w = 1 +
    w_HS``. The scale is a leaf: one compiled program serves the whole sweep."""
    p = VP()
    pc = exact(p)
    t = 0.3
    xn = points(p, t)
    sk, smix, _, _ = closed_form(p, xn, t)
    sk = picked(sk)
    x = jnp.asarray(xn, jnp.float32)
    cfg0 = ClassifierFreeGuidance.create(pc, scale=1.0)
    cg0 = ClassifierGuidance.create(pc, pc, scale=1.0)  # the prior at its null label
    run = jax.jit(lambda src, x, t: src.score_given(x, t, LABELS))
    for w in WS:
        for src in (cfg0.replace(scale=jnp.float32(w)), cg0.replace(scale=jnp.float32(w))):
            assert_rows_close(run(src, x, jnp.float32(t)), smix + w * (sk - smix), 2e-3)
    if hasattr(run, "_cache_size"):  # jax's count of compiled programs (a private helper)
        assert run._cache_size() == 2  # one program per kind of guidance, whatever w
    for w_hs in (0.0, 0.5, 3.0):
        w = lerp_weight_from_ho_salimans(w_hs)
        got = run(cfg0.replace(scale=jnp.float32(w)), x, jnp.float32(t))
        assert_rows_close(got, (1 + w_hs) * sk - w_hs * smix, 2e-3)
    # not the mixed form D_c + w (D_c - D_u) of copy-pasted code (at w = 3, 4 s_k - 3 s_mix)
    mixed = sk + 3.0 * (sk - smix)
    got = np.asarray(run(cfg0.replace(scale=jnp.float32(3.0)), x, jnp.float32(t)))
    assert np.all(np.linalg.norm(got - mixed, axis=1) > 0.1 * np.linalg.norm(sk - smix, axis=1))


def test_lerp_weight_from_ho_salimans():
    """``w = 1 + w_HS``: their 0 (no guidance) is our 1; their ``w_HS = 1`` our 2."""
    assert lerp_weight_from_ho_salimans(0) == 1.0
    assert lerp_weight_from_ho_salimans(1.0) == 2.0
    assert lerp_weight_from_ho_salimans(-0.25) == 0.75
    assert isinstance(lerp_weight_from_ho_salimans(np.float32(2)), float)


def test_w_1_is_the_model_itself_and_every_other_w_guides():
    """``w = 1``: bit for bit the model's own denoiser (no lerp rounding) and the guide is
    not evaluated (a NaN guide stays out), for CFG and TCFG; every ``w != 1`` (below 1, 0,
    and just above 1) evaluates the guide and moves the answer: ``scale > 1`` is not the test
    of "guidance on". ``w = 0`` is the null label. (A ``[batch]`` time: the interval test.)"""
    p = VP()
    pc = exact(p)
    xn = points(p, 0.3)
    x, t = jnp.asarray(xn, jnp.float32), jnp.float32(0.3)
    model = np.asarray(denoise(pc, x, t))
    nan_guide = NaNSource(process=p)
    cfg = ClassifierFreeGuidance.create(pc, scale=1.0)
    assert_same(denoise(cfg, x, t), model)
    for filt in ("none", "tangential"):
        guided = ClassifierFreeGuidance.create(pc, scale=1.0, guide=nan_guide, filter=filt)
        assert_same(denoise(guided, x, t), model)
        for w in (0.0, 0.5, 0.99, 1.01, 1.05, 3.0):
            assert np.all(np.isnan(denoise(guided.replace(scale=jnp.float32(w)), x, t))), w
    _, _, dk, dmix = closed_form(p, xn, 0.3)
    for w in (0.0, 0.5, 0.99, 1.01, 1.05, 3.0):
        got = denoise(cfg.replace(scale=jnp.float32(w)), x, t)
        assert_rows_close(got, dmix + w * (picked(dk) - dmix), 1e-4)
        assert np.min(np.abs(np.asarray(got) - model).max(-1)) > 1e-4 * abs(w - 1), w


def test_a_small_w_changes_samples():
    """DPM-Solver++'s samples at ``w = 1.05`` and ``0.95`` differ from the conditional ones,
    in opposite directions (to first order, by equal amounts: the guided field is affine in
    ``w``). One compiled sampler for every scale (classifier guidance at ``s = 1.05``: the
    closed forms above)."""
    p = EDM()
    pc = exact(p)
    sampler, key, grid = get_sampler("dpmpp_2m"), jax.random.key(0), edm_grid(6, 0.01, 20.0)
    cfg = ClassifierFreeGuidance.create(pc, scale=1.0).conditioned(Labels.balanced(3))
    x = {}
    for w in (1.0, 1.05, 0.95):
        x[w] = np.asarray(sampler(cfg.replace(scale=jnp.float32(w)), key, (12, 2), grid=grid)[0])
    up, down = x[1.05] - x[1.0], x[0.95] - x[1.0]
    assert np.median(np.linalg.norm(up, axis=1)) > 1e-3, up
    assert np.median(np.linalg.norm(down, axis=1)) > 1e-3, down
    assert np.sum(up * down) < -0.8 * np.linalg.norm(up) * np.linalg.norm(down)


# ----------------------------------------------------------------------------- interval
@pytest.mark.parametrize("p", [VP(), EDM()], ids=repr)
def test_interval_edges_at_exact_grid_levels(p):
    """Guidance on ``(grid[5], grid[2]]``: at the grid's own levels (mapped to process time as
    the samplers do, ``t_of_ve_sigma``, whose VP round trip is inexact in float32) the levels
    2, 3, 4 are guided and the others are the conditional model; a NaN guide gives NaN
    exactly there, so it is not evaluated elsewhere; classifier guidance likewise (scale
    ``s`` inside, 1 outside: the conditional score). A ``[batch]`` time (each example at its
    own level) too. References: the closed forms. (Classifier guidance under VP only.)"""
    pc = exact(p)
    grid = edm_grid(10, 0.002, 80.0)
    inside = [2, 3, 4]
    xn = points(p, 0.3)
    x = jnp.asarray(xn, jnp.float32)
    cfg = ClassifierFreeGuidance.create(pc, scale=3.0, interval=(grid[5], grid[2]))
    nan = cfg.replace(guide=NaNSource(process=p))
    cg = ClassifierGuidance.create(pc, pc, scale=3.0, interval=(grid[5], grid[2]))
    ts = np.asarray(p.t_of_ve_sigma(jnp.asarray(grid[:-1], jnp.float32)))
    srcs = (cfg, nan, cg) if isinstance(p, VP) else (cfg, nan)
    run = jax.jit(lambda x, t: [s.denoiser_given(x, t, LABELS) for s in srcs])

    def refs(t):
        _, _, dk, dmix = closed_form(p, xn, t)
        return dmix + 3.0 * (picked(dk) - dmix), picked(dk)

    for i in range(len(grid) - 1):
        got, got_nan, *got_cg = map(np.asarray, run(x, jnp.float32(ts[i])))
        guided, cond = refs(float(ts[i]))
        if grid[i] > 0.05:  # the two are told apart (below, every denoiser is about x)
            assert np.abs(guided - cond).max() > 1e-3
        want = guided if i in inside else cond
        assert_rows_close(got, want, 1e-4)
        for g in got_cg:
            assert_rows_close(g, want, 1e-3)
        assert np.all(np.isnan(got_nan) if i in inside else np.isfinite(got_nan))
    # each example at its own level, in one call
    levels = np.arange(6) + 1  # grid levels 1 .. 6
    got, got_nan, *got_cg = map(np.asarray, run(x, jnp.asarray(ts[levels], jnp.float32)))
    guided, cond = refs(ts[levels])
    for b, i in enumerate(levels):
        want = guided[b] if i in inside else cond[b]
        assert_rows_close(got[b : b + 1], want[None], 1e-4)
        for g in got_cg:
            assert_rows_close(g[b : b + 1], want[None], 1e-3)
        assert np.all(np.isnan(got_nan[b]) if i in inside else np.isfinite(got_nan[b]))


def test_a_sampler_never_evaluates_the_guide_outside_the_interval():
    """Heun evaluates the denoiser at the grid's levels only: a NaN guide acting on ``(grid[3],
    grid[2]]`` spoils the samples, one acting strictly between two levels does not, and they
    are then the conditional samples bit for bit. The interval and the scale are leaves: one
    compiled sampler for all three."""
    p = VP()
    pc = exact(p)
    grid = edm_grid(6, 0.01, 40.0)
    sampler, key = get_sampler("heun"), jax.random.key(1)
    src = ClassifierFreeGuidance.create(
        pc, scale=2.0, guide=NaNSource(process=p), interval=(grid[3], grid[2])
    ).conditioned(Labels.balanced(3))
    x, _ = sampler(src, key, (6, 2), grid=grid)
    assert np.all(np.isnan(np.asarray(x)))
    between = jnp.asarray([grid[3] * 1.001, grid[2] * 0.999], jnp.float32)
    x, _ = sampler(src.replace(interval=between), key, (6, 2), grid=grid)
    # the conditional samples (w = 1: the model alone, bit for bit)
    want, _ = sampler(src.replace(scale=jnp.float32(1.0)), key, (6, 2), grid=grid)
    assert np.all(np.isfinite(np.asarray(want)))
    np.testing.assert_array_equal(x, want)


# ----------------------------------------------------------------------------- TCFG
def svd_filter(e_c, e_u):
    """Numpy's SVD of ``[e_u; e_c]`` per example: ``(e_u . v_1) v_1``, float64."""
    out = np.zeros_like(e_u, dtype=np.float64)
    for b in range(e_u.shape[0]):
        m = np.stack([e_u[b].ravel(), e_c[b].ravel()]).astype(np.float64)
        v = np.linalg.svd(m)[2][0]
        out[b] = (m[0] @ v * v).reshape(e_u.shape[1:])
    return out


def test_tangential_filter_against_numpy_svd():
    """Per example of ``[5, 2, 3, 2]`` (image-shaped) pairs, the projection of ``e_u`` on the
    top right singular vector of numpy's SVD of ``[e_u; e_c]``; the edge cases."""
    rng = np.random.default_rng(3)
    e_c = rng.normal(size=(5, 2, 3, 2))
    e_u = 0.7 * e_c + 0.5 * rng.normal(size=e_c.shape)  # correlated, as real pairs are
    e_u[4] = rng.normal(size=(2, 3, 2)) * 10.0  # one far from its pair
    got = jax.jit(tangential_filter)(jnp.asarray(e_c, jnp.float32), jnp.asarray(e_u, jnp.float32))
    assert got.shape == e_c.shape
    want = svd_filter(e_c, e_u)
    err = np.linalg.norm((np.asarray(got) - want).reshape(5, -1), axis=1)
    assert np.all(err <= 1e-5 * np.linalg.norm(e_u.reshape(5, -1), axis=1)), err
    # a zero pair gives zero; a parallel pair leaves e_u as it is (rank 1: v_1 along it)
    z = jnp.zeros((2, 4))
    np.testing.assert_array_equal(tangential_filter(z, z), 0.0)
    u = jnp.asarray(rng.normal(size=(2, 4)), jnp.float32)
    np.testing.assert_allclose(tangential_filter(2.0 * u, u), u, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tangential_filter(z, u), u, rtol=1e-5, atol=1e-6)


def test_tcfg_against_its_construction():
    """TCFG at ``w = 2.5`` under VP: with ``x_ve = x / alpha`` and ``e = x_ve - D``, the
    unconditional ``e_u`` replaced by its SVD projection, then CFG on the denoisers."""
    p = VP()
    pc = exact(p)
    t = 0.3
    xn = points(p, t, seed=4)
    _, _, dk, dmix = closed_form(p, xn, t)
    dk = picked(dk)
    a = float(cf.alpha_sigma(p, t)[0])
    x_ve = xn / a
    d_u = x_ve - svd_filter(x_ve - dk, x_ve - dmix)
    want = d_u + 2.5 * (dk - d_u)
    src = ClassifierFreeGuidance.create(pc, scale=2.5, filter="tangential")
    got = denoise(src, jnp.asarray(xn, jnp.float32), jnp.float32(t))
    assert_rows_close(got, want, 1e-4)
    plain = dmix + 2.5 * (dk - dmix)
    assert np.abs(plain - want).max() > 1e-2  # the filter acts here


# ----------------------------------------------------------------------------- guides, errors
def test_cfg_with_a_separate_guide():
    """An unconditional guide (a broad Gaussian, EDM2's weaker model): ``D_g + w (D_k - D_g)``;
    a conditional guide (another per-class source) is called with the same labels."""
    p = EDM()
    pc = exact(p)
    t = 0.8
    xn = points(p, t, seed=5)
    x = jnp.asarray(xn, jnp.float32)
    dk = picked(closed_form(p, xn, t)[2])
    broad = GaussianScore.from_covariance(p, np.zeros(2), 2.0 * np.eye(2))
    d_g = xn / (1 + t**2 / 2.0)  # the N(0, 2 I) Wiener filter
    got = denoise(ClassifierFreeGuidance.create(pc, scale=2.0, guide=broad), x, jnp.float32(t))
    assert_rows_close(got, d_g + 2.0 * (dk - d_g), 1e-5)
    shifted = PerClassScore.create(
        [GaussianScore.from_covariance(p, m + 0.5, c) for m, c in zip(MEANS, COVS, strict=True)],
        prior=WEIGHTS,
    )
    d_s = picked(closed_form(p, xn, t, MEANS + 0.5)[2])
    got = denoise(ClassifierFreeGuidance.create(pc, scale=2.0, guide=shifted), x, jnp.float32(t))
    assert_rows_close(got, d_s + 2.0 * (dk - d_s), 1e-5)


def test_guidance_of_a_conditioned_model_keeps_its_labels():
    """``ClassifierFreeGuidance.create(model.conditioned(rule))`` guides towards the rule's
    labels (it silently guided towards the null label, i.e. drew unconditional samples)."""
    p = EDM()
    pc = exact(p)
    xn = points(p, 0.8)
    x, t = jnp.asarray(xn, jnp.float32), jnp.float32(0.8)
    rule = Labels.given(LABELS, 3)
    src = ClassifierFreeGuidance.create(pc.conditioned(rule), scale=2.0).for_examples(
        jax.random.key(0), 6, 0
    )
    np.testing.assert_array_equal(src.labels, LABELS)
    _, _, dk, dmix = closed_form(p, xn, 0.8)
    got = jax.jit(lambda s: s.denoiser(x, t))(src)
    assert_rows_close(got, dmix + 2.0 * (picked(dk) - dmix), 1e-5)


def test_classifier_guidance_null_label_and_scales():
    """The null label adds nothing (the prior's score); ``s = 0`` is the prior; ``s = 1`` the
    exact conditional score (Bayes)."""
    p = VP()
    pc = exact(p)
    t = 0.3
    xn = points(p, t)
    sk, smix, _, _ = closed_form(p, xn, t)
    x = jnp.asarray(xn, jnp.float32)
    cg = ClassifierGuidance.create(pc, pc, scale=2.0)
    null = jnp.full((6,), 3)
    run = jax.jit(lambda s: (s.score_given(x, jnp.float32(t), null), scores(s, x, jnp.float32(t))))
    assert_rows_close(run(cg)[0], smix, 2e-3)
    assert_rows_close(run(cg.replace(scale=jnp.float32(0.0)))[1], smix, 2e-3)
    assert_rows_close(run(cg.replace(scale=jnp.float32(1.0)))[1], picked(sk), 2e-3)


class Unconditional(ScoreSource):
    """A source without ``log_prob``: per-class sources of it have no null label."""

    def denoiser(self, x, t):
        return jnp.zeros_like(x)


class NoClassifier:
    """A density, not a noise-conditional classifier (no ``class_log_prob``)."""

    num_classes = 3

    def log_prob(self, x, t):  # a density, not a classifier
        return jnp.zeros(x.shape[0])


def test_bad_guidance_is_refused():
    """Each bad input is one ``ValueError`` naming its ``sampler.guidance.*`` field (or
    ``sampler.labels``)."""
    p = EDM()
    pc = exact(p)
    gauss = GaussianScore.from_covariance(p, np.zeros(2), np.eye(2))
    no_null = PerClassScore.create([Unconditional(process=p)] * 3)
    cases = [
        (lambda: ClassifierFreeGuidance.create(gauss, scale=2.0), "sampler.guidance"),
        (lambda: ClassifierFreeGuidance.create(no_null, scale=2.0), "sampler.guidance.guide"),
        (
            lambda: ClassifierFreeGuidance.create(pc, scale=2.0, guide="model"),
            "sampler.guidance.guide",
        ),
        (
            lambda: ClassifierFreeGuidance.create(
                pc, scale=2.0, guide=GaussianScore.from_covariance(VP(), np.zeros(2), np.eye(2))
            ),
            "sampler.guidance.guide",
        ),
        (lambda: ClassifierFreeGuidance.create(pc, scale=np.nan), "sampler.guidance.scale"),
        (lambda: ClassifierFreeGuidance.create(pc, scale="2"), "sampler.guidance.scale"),
        (lambda: ClassifierFreeGuidance.create(pc, scale=np.inf), "sampler.guidance.scale"),
        (
            lambda: ClassifierFreeGuidance.create(pc, scale=2.0, filter="svd"),
            "sampler.guidance.filter",
        ),
        (lambda: ClassifierGuidance.create("prior", pc, scale=1.0), "sampler.guidance"),
        (
            lambda: ClassifierGuidance.create(gauss, NoClassifier(), scale=1.0),
            "sampler.guidance.classifier",
        ),
        (
            lambda: ClassifierGuidance.create(gauss, exact(VP()), scale=1.0),
            "sampler.guidance.classifier",
        ),
        (lambda: ClassifierGuidance.create(gauss, pc, scale=np.nan), "sampler.guidance.scale"),
    ]
    for interval in (1.0, (1.0,), (2.0, 1.0), (1.0, 1.0), (-1.0, 1.0), (0.0, np.nan), "ab"):
        cases.append(
            (
                lambda i=interval: ClassifierFreeGuidance.create(pc, scale=2.0, interval=i),
                "sampler.guidance.interval",
            )
        )
        cases.append(
            (
                lambda i=interval: ClassifierGuidance.create(gauss, pc, scale=2.0, interval=i),
                "sampler.guidance.interval",
            )
        )
    for make, field in cases:
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            make()
    with pytest.raises(ValueError, match="sampler.labels"):
        ClassifierFreeGuidance.create(pc, scale=2.0).conditioned(3.5)
    with pytest.raises(ValueError, match="sampler.labels"):
        ClassifierGuidance.create(gauss, pc, scale=2.0).conditioned([0, 4])
