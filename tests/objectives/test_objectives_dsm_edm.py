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
import optax
import pytest
from compose_train import compose_train

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


@functools.partial(jax.jit, static_argnums=0)
def _evaluate(objs, source, x0, key):
    """Every objective's ``(example_losses, __call__)`` in one compiled call.

    (Eager ops and per-objective jits each compile separately, which is slow on CPU.)
    """
    return [(o.example_losses(source, x0, key), o(source, x0, key)) for o in objs]


def _data(b, shape, seed=0):
    return jax.random.normal(jax.random.key(seed), (b, *shape), jnp.float32) * 1.3 + 0.2


def _ref_dsm(proc, weighting, reduce, x0, key):
    """Per-example loop for DSM in float64 from the objective's per-example draws."""
    b = x0.shape[0]
    u, eps = (np.asarray(v, np.float64) for v in example_draws(key, x0, "uniform"))
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


def _ref_edm(proc, reduce, x0, key, P_mean, P_std, sigma_data):
    """Per-example loop for the EDM loss from the objective's per-example draws."""
    b = x0.shape[0]
    z, n = (np.asarray(v, np.float64) for v in example_draws(key, x0, "normal"))
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


@pytest.mark.parametrize("proc", PROCS, ids=lambda p: type(p).__name__)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_losses_match_per_example_loop(proc, shape):
    """DSM (3 weightings, 2 reductions) and EDM (2 reductions) for B = 1, 2, 7."""
    # An RBG key: same semantics, much faster XLA:CPU compiles than threefry.
    key = jax.random.key(3, impl="rbg")
    objs = _objectives(proc)
    for b in BATCHES:
        x0 = _data(b, shape, seed=b)
        out = _evaluate(objs, ToySource(process=proc), x0, key)
        for obj, ((per, aux), (loss, metrics)) in zip(objs, out, strict=True):
            assert per.shape == (b,)
            if isinstance(obj, DSM):
                ref, t = _ref_dsm(proc, obj.weighting, obj.reduce, x0, key)
                np.testing.assert_allclose(np.asarray(aux["t"]), t, rtol=1e-6)
                tol = dict(rtol=2e-4, atol=1e-5)
            else:
                ref, sig = _ref_edm(proc, obj.reduce, x0, key, **EDM_HP)
                np.testing.assert_allclose(np.asarray(aux["sigma"]), sig, rtol=1e-5)
                tol = dict(rtol=1e-3, atol=1e-5)
            np.testing.assert_allclose(np.asarray(per), ref, **tol, err_msg=str(obj))
            np.testing.assert_allclose(float(loss), ref.mean(), **tol, err_msg=str(obj))
            np.testing.assert_allclose(float(metrics["loss"]), ref.mean(), **tol)


# --- closed-form minimiser --------------------------------------------------------


class LinearScore(ScoreSource):
    """``s_a(x) = -a x``: the one-parameter model."""

    a: jax.Array = 0.0

    def score(self, x, t):
        return -self.a * x


def _fit_a(obj, proc, n=8192, d=8, steps=300):
    x0 = jax.random.normal(jax.random.key(11), (n, d), jnp.float32)  # N(0, I) data
    key = jax.random.key(12, impl="rbg")  # fixed key: a deterministic quadratic in a
    opt = optax.adam(optax.cosine_decay_schedule(0.05, steps))
    a = jnp.asarray(0.1, jnp.float32)
    st = opt.init(a)

    def step(a, st):
        g = jax.grad(lambda a: obj(LinearScore(process=proc, a=a), x0, key)[0])(a)
        u, st = opt.update(g, st, a)
        return optax.apply_updates(a, u), st

    run = jax.jit(lambda a, st: jax.lax.fori_loop(0, steps, lambda i, c: step(*c), (a, st)))
    return float(run(a, st)[0])


@pytest.mark.parametrize(
    "proc,t,weighting",
    [
        (EDM(), 0.5, "sigma2"),
        pytest.param(EDM(), 2.0, "likelihood", marks=pytest.mark.slow),
        pytest.param(VE(), 0.3, "sigma2", marks=pytest.mark.slow),
        (VP(), 0.4, "likelihood"),
        pytest.param(SubVP(), 0.1, "sigma2", marks=pytest.mark.slow),
        (SubVP(), 0.5, "likelihood"),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, (float, str)) else str(v),
)
def test_dsm_minimiser_is_closed_form(proc, t, weighting):
    """x0 ~ N(0, 1) => p_t = N(0, alpha^2 + sigma^2) => a* = 1 / (alpha^2 + sigma^2)."""
    obj = DSM(process=proc, weighting=weighting, t_range=(t, t))
    a_hat = _fit_a(obj, proc)
    alpha, sigma, _ = np_coeffs(proc, t)
    a_star = 1.0 / (alpha**2 + sigma**2)
    # Sampling error of the empirical minimiser with 65k scalar draws is ~1%.
    assert abs(a_hat - a_star) < 0.03 * a_star, (a_hat, a_star)


@pytest.mark.parametrize("sigma", [0.5, pytest.param(1.5, marks=pytest.mark.slow)])
def test_edm_loss_minimiser_at_fixed_sigma(sigma):
    """With P_std -> 0 the EDM loss fixes sigma = exp(P_mean); minimiser 1/(1 + sigma^2)."""
    obj = EDMLoss(process=EDM(), P_mean=math.log(sigma), P_std=1e-7)
    a_hat = _fit_a(obj, EDM())
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


FLOOR = dict(P_mean=-1.2, P_std=1.2, p_uniform=0.25, sigma_range=(0.002, 80.0))


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

    u = jax.random.uniform(jax.random.key(0), (40_000,))
    sigma = np.asarray(edm_sigma(u, **FLOOR), np.float64)
    assert np.all(np.isfinite(sigma)) and np.all(sigma > 0)
    res = scipy_stats.kstest(sigma, lambda s: _mixture_cdf(s, **FLOOR))
    assert res.pvalue > 1e-3, res
    tail = 1.0 - _mixture_cdf(20.0, **FLOOR)  # 0.25 * ln 4 / ln 40000 + 0.75 * 2.4e-4
    se = np.sqrt(tail * (1 - tail) / sigma.size)
    assert abs(np.mean(sigma > 20.0) - tail) < 4 * se
    # p_uniform = 0 is the log-normal itself, by the same inverse CDF
    s0 = np.asarray(edm_sigma(u, P_mean=-1.2, P_std=1.2), np.float64)
    assert scipy_stats.kstest(np.log(s0), "norm", args=(-1.2, 1.2)).pvalue > 1e-3
    # the edges: u = 0 and the largest float32 below 1 give finite, positive levels
    edge = np.asarray(edm_sigma(jnp.asarray([0.0, 0.24999, 0.25, 1 - 2**-24]), **FLOOR))
    np.testing.assert_allclose(edge[0], 0.002, rtol=1e-5)
    assert np.all(np.isfinite(edge)) and np.all(edge > 0)


@pytest.mark.parametrize("b", BATCHES)
def test_edm_floor_loss_matches_per_example_loop(b):
    """The floor changes only sigma: per example, sigma is the mixture's inverse CDF of the
    example's uniform (recomputed here in float64 with scipy's ndtri), the loss EDM's."""
    special = pytest.importorskip("scipy.special")
    proc, shape = VP(), (4,)
    obj = EDMLoss(process=proc, sigma_data=0.7, **FLOOR)
    key = jax.random.key(4, impl="rbg")
    x0 = _data(b, shape, seed=b)
    (per, aux), _ = _evaluate((obj,), ToySource(process=proc), x0, key)[0]
    u, n = (np.asarray(v, np.float64) for v in example_draws(key, x0, "uniform"))
    p, (lo, hi) = FLOOR["p_uniform"], FLOOR["sigma_range"]
    x0n = np.asarray(x0, np.float64)
    ref, sig = [], []
    for i in range(b):
        if u[i] < p:
            s = math.exp(math.log(lo) + u[i] / p * (math.log(hi) - math.log(lo)))
        else:
            s = math.exp(FLOOR["P_mean"] + FLOOR["P_std"] * special.ndtri((u[i] - p) / (1 - p)))
        t = np_t_of_ve_sigma(proc, s)
        a, _, _ = np_coeffs(proc, t)
        xt = a * (x0n[i] + s * n[i])
        e = ((np_denoiser(xt, t) - x0n[i]) ** 2).mean()
        ref.append((s**2 + 0.49) / (s * 0.7) ** 2 * e)
        sig.append(s)
    np.testing.assert_allclose(np.asarray(aux["sigma"]), sig, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(per), ref, rtol=2e-3, atol=1e-5)


def test_edm_without_floor_is_unchanged():
    """p_uniform = 0 keeps EDM's own draws (z ~ N(0, 1) from the example's key), so runs
    trained before the floor existed train on the same noise levels (to float32 rounding
    of exp inside and outside jit)."""
    key = jax.random.key(6)
    x0 = _data(5, (3,))
    obj = EDMLoss(process=EDM(), **EDM_HP)
    (per, aux), _ = _evaluate((obj,), ToySource(process=EDM()), x0, key)[0]
    z, _ = example_draws(key, x0, "normal")
    np.testing.assert_allclose(
        np.asarray(aux["sigma"]),
        np.exp(EDM_HP["P_mean"] + EDM_HP["P_std"] * np.asarray(z, np.float64)),
        rtol=1e-6,
    )


# --- per-example randomness ------------------------------------------------------


def test_an_examples_noise_does_not_depend_on_the_batch():
    """Per-example keys. The first 3 examples of a batch of 7 get the same noise
    level, noise and loss as a batch of those 3 alone (a sharded or resized batch trains
    on the same noise)."""
    key = jax.random.key(5)
    x0 = _data(7, (4,))
    objs = (DSM(VP(), weighting="sigma2"), EDMLoss(VP(), **EDM_HP))
    small = _evaluate(objs, ToySource(process=VP()), x0[:3], key)
    big = _evaluate(objs, ToySource(process=VP()), x0, key)
    for (per_s, aux_s), (per_b, aux_b) in ((s[0], b[0]) for s, b in zip(small, big, strict=True)):
        np.testing.assert_array_equal(per_s, per_b[:3])
        for k in aux_s:
            np.testing.assert_array_equal(aux_s[k], aux_b[k][:3])
    for scalar in ("uniform", "normal"):
        s3, e3 = example_draws(key, x0[:3], scalar)
        s7, e7 = example_draws(key, x0, scalar)
        np.testing.assert_array_equal(s3, s7[:3])
        np.testing.assert_array_equal(e3, e7[:3])
    with pytest.raises(ValueError, match=r"scalar must be one of \['uniform', 'normal'\]"):
        example_draws(key, x0, "beta")


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
