"""Objectives against independent per-example loops and a closed-form minimiser.

The per-example reference below recomputes every term in NumPy float64 from
closed-form process coefficients (``tests/closed_forms.py``, not the library's), from
the same random draws (the objectives' documented per-example keys), one example at a
time, so a ``[B, 1] x [B]`` broadcast of a per-example weight against a per-example
error, or a reduction over the wrong axes, cannot cancel out.
"""

from __future__ import annotations

import functools
import math

import closed_forms
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compose_train import compose_train
from objective_calls import losses_and_call

from scorelib.objectives import DSM, EDMLoss, example_draws
from scorelib.processes import EDM, VE, VP, SubVP, broadcast_to_data
from scorelib.scores import ScoreSource

jax.config.update("jax_enable_x64", False)


class ToySource(ScoreSource):
    """Non-linear, time-dependent score and (separately) denoiser."""

    w: float = 0.7

    def score(self, x, t):
        tb = broadcast_to_data(t, x)
        return -x * (1.0 + self.w * tb) + jnp.tanh(x)

    def denoiser(self, x, t):
        tb = broadcast_to_data(t, x)
        return x / (1.0 + tb) + 0.3 * jnp.sin(x) * self.w


def np_score(x, t, w=0.7):
    return -x * (1.0 + w * t) + np.tanh(x)


def np_denoiser(x, t, w=0.7):
    return x / (1.0 + t) + 0.3 * np.sin(x) * w


# --- closed-form coefficients (Song et al. 2021, App. B; Karras et al. 2022, Table 1) ---
def np_coeffs(proc, t):
    """(alpha, sigma, g^2) at scalar t, from tests/closed_forms.py."""
    a, s = closed_forms.alpha_sigma(proc, t)
    return float(a), float(s), float(closed_forms.f_g2(proc, t)[1])


def np_t_of_ve_sigma(proc, s):
    """Invert sigma/alpha = s in closed form (tests/closed_forms.py)."""
    return float(closed_forms.t_of_ve_sigma(proc, s))


PROCS = [EDM(), VE(), VP(), SubVP()]
SHAPES = [(3,), (4, 4, 2)]
BATCHES = [1, 2, 7]


DSM_COMBOS = (("sigma2", "mean"), ("likelihood", "mean"), ("none", "mean"), ("sigma2", "sum"))
EDM_HP = dict(P_mean=-0.8, P_std=0.6, sigma_data=0.7)  # not the defaults: a hard-coded one shows


def _objectives(proc):
    objs = [DSM(process=proc, weighting=w, reduce=r) for w, r in DSM_COMBOS]
    objs += [EDMLoss(process=proc, reduce=r, **EDM_HP) for r in ("mean", "sum")]
    return tuple(objs)


FLOOR = dict(P_mean=-1.2, P_std=1.2, p_uniform=0.25, sigma_range=(0.002, 80.0))
FLOOR_OBJ = EDMLoss(process=VP(), sigma_data=0.7, **FLOOR)  # checked on its own below


@functools.partial(jax.jit, static_argnums=0)
def _evaluate(cases, xs, key):
    """Every process's objectives, ``(example_losses, __call__)`` on every batch of ``xs``,
    and each batch's per-example draws (``example_draws``, 'uniform' and 'normal'), in one
    compiled call.

    (Eager ops and per-case jits each compile separately, which is slow on CPU; the draws of
    one batch shape are compiled once for all processes and objectives.)
    """

    def both(o, source, x):  # example_losses traced once for both entry points
        return losses_and_call(o, source, x, key)

    out = [[[both(o, ToySource(process=p), x) for o in objs] for x in xs] for p, objs in cases]
    draws = [(example_draws(key, x, "uniform"), example_draws(key, x, "normal")) for x in xs]
    return out, draws


@functools.cache
def _run(shape):
    """The objectives of every process (and the floor's under VP) on batches of 1, 2 and 7
    examples, the smaller batches the first examples of the largest (one compile per data
    shape): ``(xs, cases, outputs, draws)`` on the host."""
    key = jax.random.key(3)
    x7 = np.asarray(_data(max(BATCHES), shape))
    xs = tuple(x7[:b] for b in BATCHES)
    cases = tuple((p, _objectives(p) + ((FLOOR_OBJ,) if p == VP() else ())) for p in PROCS)
    out, draws = jax.device_get(_evaluate(cases, xs, key))
    return xs, cases, out, draws


def _data(b, shape, seed=0):
    return jax.random.normal(jax.random.key(seed), (b, *shape), jnp.float32) * 1.3 + 0.2


def _ref_dsm(proc, weighting, reduce, x0, draws):
    """Per-example loop for DSM in float64 from the objective's per-example draws."""
    b = x0.shape[0]
    u, eps = (np.asarray(v, np.float64) for v in draws)
    t = proc.t_min + (proc.t_max - proc.t_min) * u
    x0n = np.asarray(x0, np.float64)
    ref = []
    for i in range(b):
        a, s, g2 = np_coeffs(proc, float(t[i]))
        xt = a * x0n[i] + s * eps[i]
        sq = (np_score(xt, t[i]) + eps[i] / s) ** 2
        e = sq.mean() if reduce == "mean" else sq.sum()
        lam = {"sigma2": s**2, "likelihood": g2, "none": 1.0}[weighting]
        ref.append(lam * e)
    return np.array(ref), t


def _ref_edm(proc, reduce, x0, draws, P_mean, P_std, sigma_data):
    """Per-example loop for the EDM loss from the objective's per-example draws."""
    b = x0.shape[0]
    z, n = (np.asarray(v, np.float64) for v in draws)
    x0n = np.asarray(x0, np.float64)
    ref, sig = [], []
    for i in range(b):
        s = math.exp(P_mean + P_std * z[i])
        t = np_t_of_ve_sigma(proc, s)
        a, _, _ = np_coeffs(proc, t)
        xt = a * (x0n[i] + s * n[i])
        sq = (np_denoiser(xt, t) - x0n[i]) ** 2
        e = sq.mean() if reduce == "mean" else sq.sum()
        ref.append((s**2 + sigma_data**2) / (s * sigma_data) ** 2 * e)
        sig.append(s)
    return np.array(ref), np.array(sig)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_losses_match_per_example_loop(shape):
    """DSM (3 weightings, 2 reductions) and EDM (2 reductions) for B = 1, 2, 7, under EDM, VE,
    VP and sub-VP (one compiled program for all of them)."""
    xs, cases, out, draws = _run(shape)
    for (proc, objs), per_batch in zip(cases, out, strict=True):
        for x0, (uniform, normal), res in zip(xs, draws, per_batch, strict=True):
            b = x0.shape[0]
            for obj, ((per, aux), (loss, metrics)) in zip(objs, res, strict=True):
                if obj is FLOOR_OBJ:
                    continue  # test_edm_floor_loss_matches_per_example_loop
                msg = f"{obj} B={b}"
                assert per.shape == (b,)
                if isinstance(obj, DSM):
                    ref, t = _ref_dsm(proc, obj.weighting, obj.reduce, x0, uniform)
                    np.testing.assert_allclose(aux["t"], t, rtol=1e-6, err_msg=msg)
                    tol = dict(rtol=2e-4, atol=1e-5)
                else:
                    ref, sig = _ref_edm(proc, obj.reduce, x0, normal, **EDM_HP)
                    np.testing.assert_allclose(aux["sigma"], sig, rtol=1e-5, err_msg=msg)
                    tol = dict(rtol=1e-3, atol=1e-5)
                np.testing.assert_allclose(per, ref, **tol, err_msg=msg)
                np.testing.assert_allclose(float(loss), ref.mean(), **tol, err_msg=msg)
                np.testing.assert_allclose(float(metrics["loss"]), ref.mean(), **tol, err_msg=msg)


# --- closed-form minimiser --------------------------------------------------------


class LinearScore(ScoreSource):
    """``s_a(x) = -a x``: the one-parameter model."""

    a: jax.Array = 0.0

    def score(self, x, t):
        return -self.a * x


DSM_FITS = (  # (process, t, weighting); the slow-marked cases below cost nothing extra
    (EDM(), 0.5, "sigma2"),
    (EDM(), 2.0, "likelihood"),
    (VE(), 0.3, "sigma2"),
    (VP(), 0.4, "likelihood"),
    (SubVP(), 0.1, "sigma2"),
    (SubVP(), 0.5, "likelihood"),
)
EDM_FITS = (0.5, 1.5)  # sigma


def _fit_objectives():
    dsm = [DSM(process=p, weighting=w, t_range=(t, t)) for p, t, w in DSM_FITS]
    edm = [EDMLoss(process=EDM(), P_mean=math.log(s), P_std=1e-7) for s in EDM_FITS]
    return tuple(dsm + edm)


@functools.cache
def _fitted(n=8192, d=8):
    """``{objective: a_hat}``: the minimiser over ``a`` of each of :func:`_fit_objectives` on
    ``n`` N(0, I) examples of dimension ``d`` with one fixed key.

    With the key fixed, each objective is a quadratic in ``a`` (the model's score, and so
    its denoiser, is linear in ``a``), so one Newton step from any ``a`` lands on its
    minimiser: ``a_hat = a - L'(a) / L''(a)``. The objectives are summed, each depending on
    its own ``a``: the Hessian of the sum is diagonal, and one compiled call gives every
    ``L'`` and ``L''``.
    """
    objs = _fit_objectives()
    x0 = jax.random.normal(jax.random.key(11), (n, d), jnp.float32)  # N(0, I) data
    key = jax.random.key(12, impl="rbg")  # fixed key: a deterministic quadratic in a

    def total(a):
        return sum(
            o(LinearScore(process=o.process, a=a[i]), x0, key)[0] for i, o in enumerate(objs)
        )

    @jax.jit
    def newton(a):
        g, h = jax.jvp(jax.grad(total), (a,), (jnp.ones_like(a),))  # h = diag of the Hessian
        return a - g / h, h

    a_hat, curvature = newton(jnp.full((len(objs),), 0.1, jnp.float32))
    again, _ = newton(a_hat)  # a stationary point: a second step stays (the same executable)
    a_hat, again = np.asarray(a_hat), np.asarray(again)
    assert np.all(np.asarray(curvature) > 0), curvature  # a minimum
    np.testing.assert_allclose(again, a_hat, rtol=1e-4)
    return dict(zip(objs, a_hat.tolist(), strict=True))


@pytest.mark.parametrize(
    "proc,t,weighting",
    [
        DSM_FITS[0],
        pytest.param(*DSM_FITS[1], marks=pytest.mark.slow),
        pytest.param(*DSM_FITS[2], marks=pytest.mark.slow),
        DSM_FITS[3],
        pytest.param(*DSM_FITS[4], marks=pytest.mark.slow),
        DSM_FITS[5],
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, (float, str)) else str(v),
)
def test_dsm_minimiser_is_closed_form(proc, t, weighting):
    """x0 ~ N(0, 1) => p_t = N(0, alpha^2 + sigma^2) => a* = 1 / (alpha^2 + sigma^2)."""
    a_hat = _fitted()[DSM(process=proc, weighting=weighting, t_range=(t, t))]
    alpha, sigma, _ = np_coeffs(proc, t)
    a_star = 1.0 / (alpha**2 + sigma**2)
    # Sampling error of the empirical minimiser with 65k scalar draws is ~1%.
    assert abs(a_hat - a_star) < 0.03 * a_star, (a_hat, a_star)


@pytest.mark.parametrize("sigma", [EDM_FITS[0], pytest.param(EDM_FITS[1], marks=pytest.mark.slow)])
def test_edm_loss_minimiser_at_fixed_sigma(sigma):
    """With P_std -> 0 the EDM loss fixes sigma = exp(P_mean); minimiser 1/(1 + sigma^2)."""
    a_hat = _fitted()[EDMLoss(process=EDM(), P_mean=math.log(sigma), P_std=1e-7)]
    a_star = 1.0 / (1.0 + sigma**2)
    assert abs(a_hat - a_star) < 0.03 * a_star, (a_hat, a_star)


# --- validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"weighting": "lambda"}, "objective.weighting"),
        ({"reduce": "max"}, "objective.reduce"),
        ({"t_range": (0.5, 0.1)}, "objective.t_range"),
        ({"t_range": (0.0, 0.5)}, "objective.t_range"),  # below VP t_min = 1e-3
        ({"t_range": (0.1, 2.0)}, "objective.t_range"),
        ({"t_range": (0.1,)}, "objective.t_range"),
    ],
)
def test_dsm_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        DSM(process=VP(), **kwargs)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"P_std": 0.0}, "objective.P_std"),
        ({"P_std": -1.0}, "objective.P_std"),
        ({"P_std": float("nan")}, "objective.P_std"),
        ({"sigma_data": 0.0}, "objective.sigma_data"),
        ({"reduce": "none"}, "objective.reduce"),
        ({"P_mean": float("nan")}, "objective.P_mean"),
    ],
)
def test_edm_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        EDMLoss(process=EDM(), **kwargs)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"p_uniform": -0.1}, "objective.p_uniform"),
        ({"p_uniform": 1.0}, "objective.p_uniform"),
        ({"p_uniform": 0.1}, "objective.sigma_range"),  # needed by the log-uniform part
        ({"p_uniform": 0.1, "sigma_range": (80.0, 0.002)}, "objective.sigma_range"),
        ({"p_uniform": 0.1, "sigma_range": (0.0, 80.0)}, "objective.sigma_range"),
        ({"p_uniform": 0.1, "sigma_range": (0.002,)}, "objective.sigma_range"),
        ({"p_uniform": 0.1, "sigma_range": (0.002, float("inf"))}, "objective.sigma_range"),
        ({"sigma_range": (0.002, 80.0)}, "objective.sigma_range"),  # unused at p_uniform 0
    ],
)
def test_edm_floor_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        EDMLoss(process=EDM(), **kwargs)


def _mixture_cdf(sigma, P_mean, P_std, p_uniform, sigma_range):
    """CDF of (1 - p) LogNormal + p LogUniform(lo, hi), written with scipy (float64)."""
    scipy_stats = pytest.importorskip("scipy.stats")
    lo, hi = sigma_range
    ls = np.log(sigma)
    uni = np.clip((ls - np.log(lo)) / (np.log(hi) - np.log(lo)), 0.0, 1.0)
    return (1 - p_uniform) * scipy_stats.norm.cdf(ls, P_mean, P_std) + p_uniform * uni


def test_edm_floor_sigma_distribution():
    """KS test of the floor's noise levels against the mixture CDF (scipy); the share of
    draws above sigma = 20 matches the mixture's, where the log-normal alone has 2e-4."""
    scipy_stats = pytest.importorskip("scipy.stats")
    from scorelib.objectives.dsm import edm_sigma

    @jax.jit
    def levels(edge):  # one compiled call (eager ops compile one by one)
        u = jax.random.uniform(jax.random.key(0), (40_000,))
        return (
            edm_sigma(u, **FLOOR),
            edm_sigma(u, P_mean=-1.2, P_std=1.2),
            edm_sigma(edge, **FLOOR),
        )

    sigma, s0, edge = (
        np.asarray(v, np.float64)
        for v in levels(jnp.asarray([0.0, 0.24999, 0.25, 1 - 2**-24], jnp.float32))
    )
    assert np.all(np.isfinite(sigma)) and np.all(sigma > 0)
    res = scipy_stats.kstest(sigma, lambda s: _mixture_cdf(s, **FLOOR))
    assert res.pvalue > 1e-3, res
    tail = 1.0 - _mixture_cdf(20.0, **FLOOR)  # 0.25 * ln 4 / ln 40000 + 0.75 * 2.4e-4
    se = np.sqrt(tail * (1 - tail) / sigma.size)
    assert abs(np.mean(sigma > 20.0) - tail) < 4 * se
    # p_uniform = 0 is the log-normal itself, by the same inverse CDF
    assert scipy_stats.kstest(np.log(s0), "norm", args=(-1.2, 1.2)).pvalue > 1e-3
    # the edges: u = 0 and the largest float32 below 1 give finite, positive levels
    np.testing.assert_allclose(edge[0], 0.002, rtol=1e-5)
    assert np.all(np.isfinite(edge)) and np.all(edge > 0)


@pytest.mark.parametrize("b", BATCHES)
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_edm_floor_loss_matches_per_example_loop(b):
    """The floor changes only sigma: per example, sigma is the mixture's inverse CDF of the
    example's uniform (recomputed here in float64 with scipy's ndtri), the loss EDM's
    (VP, both data shapes)."""
    special = pytest.importorskip("scipy.special")
    proc = VP()
    p, (lo, hi) = FLOOR["p_uniform"], FLOOR["sigma_range"]
    for shape in SHAPES:
        xs, cases, out, draws = _run(shape)
        i_proc = [c[0] for c in cases].index(proc)
        i_batch = BATCHES.index(b)
        (per, aux), _ = out[i_proc][i_batch][cases[i_proc][1].index(FLOOR_OBJ)]
        u, n = (np.asarray(v, np.float64) for v in draws[i_batch][0])
        x0n = np.asarray(xs[i_batch], np.float64)
        ref, sig = [], []
        for i in range(b):
            if u[i] < p:
                s = math.exp(math.log(lo) + u[i] / p * (math.log(hi) - math.log(lo)))
            else:
                z = special.ndtri((u[i] - p) / (1 - p))
                s = math.exp(FLOOR["P_mean"] + FLOOR["P_std"] * z)
            t = np_t_of_ve_sigma(proc, s)
            a, _, _ = np_coeffs(proc, t)
            xt = a * (x0n[i] + s * n[i])
            e = ((np_denoiser(xt, t) - x0n[i]) ** 2).mean()
            ref.append((s**2 + 0.49) / (s * 0.7) ** 2 * e)
            sig.append(s)
        np.testing.assert_allclose(aux["sigma"], sig, rtol=1e-4, err_msg=str(shape))
        np.testing.assert_allclose(per, ref, rtol=2e-3, atol=1e-5, err_msg=str(shape))


def test_edm_without_floor_is_unchanged():
    """p_uniform = 0 keeps EDM's own draws (z ~ N(0, 1) from the example's key), so runs
    trained before the floor existed train on the same noise levels (to float32 rounding
    of exp inside and outside jit)."""
    obj = EDMLoss(process=EDM(), **EDM_HP)
    for shape in SHAPES:
        xs, cases, out, draws = _run(shape)
        i_proc = [c[0] for c in cases].index(EDM())
        (per, aux), _ = out[i_proc][-1][cases[i_proc][1].index(obj)]
        z = np.asarray(draws[-1][1][0], np.float64)
        np.testing.assert_allclose(
            aux["sigma"], np.exp(EDM_HP["P_mean"] + EDM_HP["P_std"] * z), rtol=1e-6
        )


# --- per-example randomness ------------------------------------------------------


def test_an_examples_noise_does_not_depend_on_the_batch():
    """Per-example keys. The first 2 examples of a batch of 7 get the same noise level,
    noise and loss as a batch of those 2 alone (a sharded or resized batch trains on the
    same noise), for every objective and process of test_losses_match_per_example_loop.
    (A batch of 1 gets the same draws; XLA may round its loss differently in the last bit.)
    """
    i2, i7 = BATCHES.index(2), BATCHES.index(7)
    for shape in SHAPES:
        xs, cases, out, draws = _run(shape)
        for (_, objs), per_batch in zip(cases, out, strict=True):
            for obj, ((per_s, aux_s), _), ((per_b, aux_b), _) in zip(
                objs, per_batch[i2], per_batch[i7], strict=True
            ):
                msg = f"{obj} {shape}"
                np.testing.assert_array_equal(per_s, per_b[:2], err_msg=msg)
                assert set(aux_s) == set(aux_b)
                for k in aux_s:
                    np.testing.assert_array_equal(aux_s[k], aux_b[k][:2], err_msg=msg)
        for b, d in zip(BATCHES, draws, strict=True):
            for (s_b, e_b), (s_7, e_7) in zip(d, draws[i7], strict=True):  # uniform, normal
                np.testing.assert_array_equal(s_b, s_7[:b])
                np.testing.assert_array_equal(e_b, e_7[:b])
    with pytest.raises(ValueError, match=r"scalar must be one of \['uniform', 'normal'\]"):
        example_draws(jax.random.key(5), xs[0], "beta")


def test_example_draws_distribution():
    """KS tests against U[0, 1) and N(0, 1) (scipy), and no correlation between the
    scalar draw and the noise or between neighbouring examples."""
    scipy_stats = pytest.importorskip("scipy.stats")
    x0 = jnp.zeros((20_000, 3))
    u, eps = example_draws(jax.random.key(0), x0, "uniform")
    z, _ = example_draws(jax.random.key(1), x0, "normal")
    u, eps, z = (np.asarray(v, np.float64) for v in (u, eps, z))
    assert scipy_stats.kstest(u, "uniform").pvalue > 1e-3
    assert scipy_stats.kstest(z, "norm").pvalue > 1e-3
    assert scipy_stats.kstest(eps.ravel(), "norm").pvalue > 1e-3
    for a, b in (
        (u, eps[:, 0]),
        (u[1:], u[:-1]),
        (eps[1:, 0], eps[:-1, 0]),
        (eps[:, 0], eps[:, 1]),
    ):
        assert abs(np.corrcoef(a, b)[0, 1]) < 4 / np.sqrt(len(a))


def test_floor_through_the_config_and_the_mnist_preset():
    """objective.p_uniform / objective.sigma_range reach EDMLoss; the MNIST MLP preset's
    floor covers the process's [sigma_min, sigma_max]; bad values are refused naming the
    field, before anything is compiled."""
    from experiments import build

    cfg = compose_train(["experiment=mnist_mlp_edm"])
    obj = build.build_objective(cfg, build.build_process(cfg))
    assert isinstance(obj, EDMLoss) and obj.p_uniform == 0.1
    assert obj.sigma_range == (cfg.process.sigma_min, cfg.process.sigma_max) == (0.002, 80.0)
    plain = build.build_objective(compose_train(["objective=edm"]), EDM())
    assert plain.p_uniform == 0.0 and plain.sigma_range is None  # EDM's loss unchanged
    for over, field in [
        (["objective=edm", "objective.sigma_range=[0.002,80]"], "objective.sigma_range"),
        (["objective=edm", "objective.p_uniform=0.2"], "objective.sigma_range"),
        (["objective=edm", "objective.p_uniform=1.5"], "objective.p_uniform"),
    ]:
        cfg = compose_train(over)
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            build.build_objective(cfg, build.build_process(cfg))


def test_train_refuses_the_fisher_weighting():
    """weighting=fisher is the unit weight of the Fisher-scaled network, which
    experiments.train does not build: refused, naming the field, not trained wrongly."""
    from experiments import build

    cfg = compose_train(
        [
            "experiment=tsm_gmm",
            "objective.kappa=switch",
            "objective.sigma_switch=0.3",
            "objective.weighting=fisher",
        ]
    )
    with pytest.raises(ValueError, match=r"objective\.weighting: 'fisher'"):
        build.build_objective(cfg, build.build_process(cfg))
