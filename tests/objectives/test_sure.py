"""SURE-Score (scorelib/objectives/sure.py) against closed forms and a float64 per-example loop.

* Stein's unbiased risk estimate equals the true denoising MSE in expectation: on Gaussian
  data ``x ~ N(0, s^2 I)``, ``y = x + sigma_n n``, a linear denoiser ``h(y) = a y`` has
  ``E|h(y) - x|^2 = d ((1 - a)^2 s^2 + a^2 sigma_n^2)`` (written here, not by the library),
  which is smallest at the optimal (Tweedie) denoiser ``a* = s^2 / (s^2 + sigma_n^2)``; for a
  non-linear denoiser SURE minus the true squared error (which uses the clean ``x`` SURE never
  sees) has mean zero.
* The objective's per-example losses equal a NumPy float64 loop written from the module
  docstring with the toy denoiser's Jacobian in closed form, for batch sizes 1, 2 and 7.
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

from experiments import build
from scorelib.data import load_digits
from scorelib.divergence import probe_vectors
from scorelib.objectives import SURE, denoiser_sure, example_draws, sure_risk
from scorelib.processes import EDM, VP, broadcast_to_data
from scorelib.scores import ScoreSource

# --- SURE in expectation: closed forms on a Gaussian ----------------------------------

S, SIGMA_N, D_G, N = 0.8, 0.5, 16, 20_000
A_STAR = S**2 / (S**2 + SIGMA_N**2)


def linear_mse(a):
    """``E|a y - x|^2`` for ``x ~ N(0, s^2 I_d)``, ``y = x + sigma_n n``."""
    return D_G * ((1 - a) ** 2 * S**2 + a**2 * SIGMA_N**2)


@functools.lru_cache(maxsize=1)
def gaussian_pairs():
    kx, kn = jax.random.split(jax.random.key(0))
    x = S * jax.random.normal(kx, (N, D_G))
    return x, x + SIGMA_N * jax.random.normal(kn, (N, D_G))


@functools.partial(jax.jit, static_argnames=("denoise", "divergence", "probe", "eps"))
def _risk(y, key, denoise, divergence, probe, eps):
    probes = jax.vmap(lambda k: probe_vectors(k, 2, D_G, probe))(jax.random.split(key, N))
    return sure_risk(denoise, y, probes, sigma_n=SIGMA_N, divergence=divergence, eps=eps)


@functools.partial(jax.jit, static_argnames=("divergence", "probe", "eps"))
def _linear_risk(y, key, a, divergence, probe, eps):
    """:func:`_risk` of the linear denoiser ``h(y) = a y``, ``a`` traced (one compilation
    for every ``a``)."""
    return _risk.__wrapped__(y, key, lambda v: a * v, divergence, probe, eps)


DIVS = [("jvp", "gaussian", None), ("fd", "rademacher", 1e-2)]


@pytest.mark.parametrize("divergence,probe,eps", DIVS)
def test_sure_is_the_linear_denoisers_mse_in_expectation(divergence, probe, eps):
    """For ``a`` below, at and above ``a*``: the sample mean of SURE (which sees only ``y``)
    is the closed-form MSE within 4 standard errors, and SURE is smallest at ``a*``, the
    optimal denoiser, whose MSE is ``d s^2 sigma_n^2 / (s^2 + sigma_n^2)``."""
    x, y = gaussian_pairs()
    means = {}
    for a in (0.3, A_STAR, 1.1):
        h, risk = _linear_risk(y, jax.random.key(1), jnp.float32(a), divergence, probe, eps)
        np.testing.assert_allclose(np.asarray(h), a * np.asarray(y), rtol=1e-6, atol=1e-7)
        risk = np.asarray(risk, np.float64)
        se = risk.std() / math.sqrt(N)
        assert abs(risk.mean() - linear_mse(a)) < 4 * se, (a, risk.mean(), linear_mse(a), se)
        # the closed form itself, against the true error that uses the clean x
        err = np.sum((a * np.asarray(y, np.float64) - np.asarray(x, np.float64)) ** 2, -1)
        assert abs(err.mean() - linear_mse(a)) < 4 * err.std() / math.sqrt(N)
        means[a] = risk.mean()
    assert linear_mse(A_STAR) == pytest.approx(D_G * S**2 * SIGMA_N**2 / (S**2 + SIGMA_N**2))
    assert means[A_STAR] < min(means[0.3], means[1.1])


def nonlinear(v):
    """A non-linear denoiser with a non-diagonal Jacobian (one example ``[d]``)."""
    return 0.6 * v + 0.3 * jnp.tanh(2.0 * v) + 0.1 * jnp.sin(jnp.sum(v)) - 0.05


@pytest.mark.parametrize("divergence,probe,eps", DIVS)
def test_sure_minus_the_true_error_has_mean_zero_for_a_nonlinear_denoiser(divergence, probe, eps):
    x, y = gaussian_pairs()
    h, risk = _risk(y, jax.random.key(2), nonlinear, divergence, probe, eps)
    err = np.sum((np.asarray(h, np.float64) - np.asarray(x, np.float64)) ** 2, -1)
    diff = np.asarray(risk, np.float64) - err
    assert abs(diff.mean()) < 4 * diff.std() / math.sqrt(N), (diff.mean(), diff.std())
    assert err.mean() > 1.0  # not a vacuous comparison


# --- the objective against a float64 per-example loop --------------------------------


class ToySource(ScoreSource):
    """``D(x, t) = x / (1 + t) + 0.3 w sin(x) + 0.2 tanh(mean(x))`` per example: non-linear,
    time-dependent, with a non-diagonal Jacobian."""

    w: float = 0.7

    def denoiser(self, x, t):
        tb = broadcast_to_data(t, x)
        m = jnp.mean(x, axis=tuple(range(1, x.ndim)), keepdims=True)
        return x / (1.0 + tb) + 0.3 * self.w * jnp.sin(x) + 0.2 * jnp.tanh(m)


def np_denoiser(x, t, w=0.7):
    return x / (1.0 + t) + 0.3 * w * np.sin(x) + 0.2 * np.tanh(np.mean(x))


def np_btjb(x, t, b, w=0.7):
    """``b^T J b`` of :func:`np_denoiser` at ``x``, from its Jacobian in closed form:
    ``diag(1 / (1 + t) + 0.3 w cos x) + 0.2 sech^2(mean x) / d * ones``."""
    diag = 1.0 / (1.0 + t) + 0.3 * w * np.cos(x)
    return np.sum(b**2 * diag) + 0.2 / np.cosh(np.mean(x)) ** 2 / x.size * np.sum(b) ** 2


EDM_HP = dict(P_mean=-0.8, P_std=0.6, sigma_data=0.7)  # not the defaults


def _objectives(proc, sigma_n):
    return (
        SURE(proc, sigma_n=sigma_n, **EDM_HP),
        SURE(
            proc,
            sigma_n=sigma_n,
            sure_weight=0.3,
            probes=3,
            probe="gaussian",
            divergence="fd",
            eps=1e-2,
            reduce="sum",
            **EDM_HP,
        ),
    )


CASES = ((EDM(), 0.5), (VP(), 0.2))  # a process with alpha = 1 and one without
BATCHES = (1, 2, 7)


@functools.cache
def _run(key_seed=3):
    """Both processes' objectives on batches of 1, 2 and 7 examples (the smaller batches the
    first examples of the largest), in one compiled call: ``{(case, batch): [((per, aux),
    (loss, metrics), draws) per objective]}`` on the host, ``draws`` the documented key
    streams :func:`reference` reads: the DSM term's ``(z, n)`` (``example_draws`` of
    ``fold_in(key, 0)``) and each example's probes (``probe_vectors`` of
    ``fold_in(fold_in(key, 1), b)``)."""
    # threefry: an rbg key's draws under vmap differ from the same key's draws outside it
    key = jax.random.key(key_seed)
    y7 = np.asarray(jax.random.normal(jax.random.key(7), (7, 2, 3), jnp.float32) * 0.9 + 0.1)
    ys = {b: y7[:b] for b in BATCHES}

    def draws(obj, y):
        d = math.prod(y.shape[1:])
        z, n = example_draws(jax.random.fold_in(key, 0), jnp.zeros(y.shape), "normal")
        k_probe = jax.random.fold_in(key, 1)
        probes = jax.vmap(
            lambda i: probe_vectors(jax.random.fold_in(k_probe, i), obj.probes, d, obj.probe)
        )(jnp.arange(y.shape[0]))
        return z, n, probes

    objs = [_objectives(proc, sigma_n) for proc, sigma_n in CASES]  # built outside the trace

    @jax.jit
    def run(ys):
        out = {}
        for c, (proc, _) in enumerate(CASES):
            src = ToySource(process=proc)
            for b, y in ys.items():
                out[c, b] = [(*losses_and_call(o, src, y, key), draws(o, y)) for o in objs[c]]
        return out

    return ys, jax.device_get(run(ys))


def reference(obj, proc, y, draws):
    """Per example, in float64, from the module docstring and the documented key streams."""
    y = np.asarray(y, np.float64)
    b_count, shape = y.shape[0], y.shape[1:]
    d = math.prod(shape)
    sn = obj.sigma_n
    t_n = float(closed_forms.t_of_ve_sigma(proc, sn))
    a_n = float(closed_forms.alpha_sigma(proc, t_n)[0])
    z, n, all_probes = (np.asarray(v, np.float64) for v in draws)
    sd = obj.sigma_data
    out = {"loss": [], "sure": [], "dsm": [], "sigma": []}
    for i in range(b_count):
        probes = all_probes[i]
        yi = y[i].ravel()
        h = np_denoiser(a_n * yi, t_n)
        if obj.divergence == "jvp":  # d h / d y = alpha_n J(alpha_n y)
            div = np.mean([a_n * np_btjb(a_n * yi, t_n, bp) for bp in probes])
        else:
            div = np.mean(
                [bp @ (np_denoiser(a_n * (yi + obj.eps * bp), t_n) - h) / obj.eps for bp in probes]
            )
        sure = np.sum((yi - h) ** 2) + 2 * sn**2 * div - d * sn**2
        sure = sure / d if obj.reduce == "mean" else sure
        s = math.exp(obj.P_mean + obj.P_std * z[i])
        t = float(closed_forms.t_of_ve_sigma(proc, s))
        a = float(closed_forms.alpha_sigma(proc, t)[0])
        xt = a * (h + s * n[i].ravel())
        sq = (np_denoiser(xt, t) - h) ** 2
        dsm = (s**2 + sd**2) / (s * sd) ** 2 * (sq.mean() if obj.reduce == "mean" else sq.sum())
        lam_n = (sn**2 + sd**2) / (sn * sd) ** 2
        out["loss"].append(obj.sure_weight * lam_n * sure + dsm)
        out["sure"].append(sure)
        out["dsm"].append(dsm)
        out["sigma"].append(s)
    return {k: np.array(v) for k, v in out.items()}


@pytest.mark.parametrize("case", [0, 1], ids=["EDM", "VP"])
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_losses_match_a_float64_per_example_loop(case):
    """Both divergence estimators, both reductions, P > 1 probes, for B = 1, 2, 7 (a process
    with alpha = 1 and one without), and the batch mean from ``__call__``."""
    proc, sigma_n = CASES[case]
    objs = _objectives(proc, sigma_n)
    ys, out = _run()
    for b in BATCHES:
        for obj, ((per, aux), (loss, metrics), draws) in zip(objs, out[case, b], strict=True):
            ref = reference(obj, proc, ys[b], draws)
            assert per.shape == (b,)
            tol = dict(rtol=1e-3, atol=1e-5)
            np.testing.assert_allclose(per, ref["loss"], **tol, err_msg=f"{obj} B={b}")
            for k in ("sure", "dsm", "sigma"):
                np.testing.assert_allclose(aux[k], ref[k], **tol, err_msg=f"{k} B={b}")
            np.testing.assert_allclose(float(loss), ref["loss"].mean(), **tol)
            np.testing.assert_allclose(float(metrics["sure"]), ref["sure"].mean(), **tol)


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_an_examples_loss_does_not_depend_on_its_batch():
    """The first 1 and 2 examples of a batch of 7 get the losses of a batch of those alone
    (both objectives and processes of test_losses_match_a_float64_per_example_loop)."""
    _, out = _run()
    for case in range(len(CASES)):
        big = out[case, 7]
        for b in BATCHES[:-1]:
            for small, whole in zip(out[case, b], big, strict=True):
                np.testing.assert_allclose(small[0][0], whole[0][0][:b], rtol=1e-6)


class Scaled(ScoreSource):
    """The linear denoiser ``D = c x`` (its divergence is ``c d``)."""

    c: jax.Array = 0.7

    def denoiser(self, x, t):
        return self.c * x


@pytest.mark.parametrize("into", [True, False], ids=["into_denoiser", "stop_gradient"])
def test_the_dsm_gradient_reaches_the_denoiser_only_when_asked(into):
    """With ``D = c x``: the gradient in ``c`` is the SURE term's plus the DSM term's, the
    latter through ``x_hat = c y`` (the authors' loss, ``dsm_into_denoiser=True``) or at
    fixed ``x_hat`` (``False``), each computed here with the other term held fixed."""
    obj = SURE(EDM(), sigma_n=0.4, dsm_into_denoiser=into)
    y = jax.random.normal(jax.random.key(0), (5, 3))
    key = jax.random.key(1)
    lam = (0.16 + 0.25) / (0.4 * 0.5) ** 2

    @jax.jit
    def grads(c0):  # the three gradients in one compiled call
        g = jax.grad(lambda c: obj(Scaled(process=EDM(), c=c), y, key)[0])(c0)
        # SURE of h = c y in closed form: |y - c y|^2 + 2 sigma^2 c d - d sigma^2 (mean over d)
        g_sure = jax.grad(lambda c: lam * jnp.mean((1 - c) ** 2 * jnp.mean(y**2, -1) + 0.32 * c))(
            c0
        )

        def dsm(c, x_hat):
            return obj.dsm(Scaled(process=EDM(), c=c), x_hat, jax.random.fold_in(key, 0))[0]

        g_dsm = jax.grad(lambda c: dsm(c, c * y if into else c0 * y))(c0)
        return g, g_sure, g_dsm

    g, g_sure, g_dsm = grads(jnp.float32(0.7))
    assert float(g) == pytest.approx(float(g_sure + g_dsm), rel=1e-4)


def test_dsm_weight_ramp_and_the_logged_parts_of_sure():
    """loss = lambda(sigma_n) SURE + min(step / R, 1) w DSM, SURE = residual + divergence
    term - sigma_n^2 per coordinate (D = c x: divergence c d), and the guard clips a
    negative divergence at 0."""
    y = jax.random.normal(jax.random.key(0), (4, 3))
    key = jax.random.key(2)
    lam = (0.16 + 0.25) / (0.4 * 0.5) ** 2
    obj = SURE(EDM(), sigma_n=0.4, dsm_weight=3.0, dsm_ramp_steps=10)
    assert obj.uses_step and not SURE(EDM(), sigma_n=0.4).uses_step
    for c, clip in ((0.7, False), (-0.5, False), (-0.5, True)):
        o = obj.replace(nonnegative_divergence=clip)
        src = Scaled(process=EDM(), c=jnp.float32(c))
        for step, r in ((0, 0.0), (4, 0.4), (25, 1.0)):
            per, aux = o.example_losses(src, y, key, step=jnp.int32(step))
            want = lam * aux["sure"] + r * 3.0 * aux["dsm"]
            np.testing.assert_allclose(per, want, rtol=1e-5)
        res = np.mean(np.asarray((1 - c) ** 2 * y**2), axis=-1)
        np.testing.assert_allclose(aux["sure_residual"], res, rtol=1e-5)
        div = 2 * 0.16 * (max(c, 0.0) if clip else c)  # 2 sigma_n^2 c d / d
        np.testing.assert_allclose(aux["sure_divergence"], div, rtol=1e-5)
        np.testing.assert_allclose(aux["sure"], res + div - 0.16, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="^objective.dsm_ramp_steps must be 0 where"):
        obj.example_losses(src, y, key)


def test_denoiser_sure_of_a_linear_denoiser_matches_its_closed_form_error():
    """D = c y on x ~ N(0, s^2 I): the true error per coordinate is (c - 1)^2 s^2 + c^2
    sigma_n^2; SURE estimates it within 4 standard errors, its divergence term is exactly
    2 sigma_n^2 c and its residual has mean (1 - c)^2 (s^2 + sigma_n^2)."""
    s, sn, c, n = 0.8, 0.5, 0.6, 4000
    kx, kn = jax.random.split(jax.random.key(0))
    x = s * jax.random.normal(kx, (n, 4, 2))
    y = x + sn * jax.random.normal(kn, x.shape)
    got = denoiser_sure(
        Scaled(process=EDM(), c=jnp.float32(c)), y, sigma_n=sn, key=jax.random.key(1), clean=x
    )
    want = (c - 1) ** 2 * s**2 + c**2 * sn**2
    assert abs(got["sure"] - want) < 4 * got["se"], (got, want)
    assert got["divergence"] == pytest.approx(2 * sn**2 * c, rel=1e-5)
    assert got["residual"] == pytest.approx((1 - c) ** 2 * (s**2 + sn**2), rel=0.05)
    assert got["sure"] == pytest.approx(got["residual"] + got["divergence"] - sn**2, rel=1e-5)
    assert got["mse"] == pytest.approx(want, rel=0.05)
    with pytest.raises(ValueError, match="^clean must be the shape of y"):
        denoiser_sure(Scaled(process=EDM()), y, sigma_n=sn, key=jax.random.key(1), clean=x[:2])


# --- bad inputs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"sigma_n": 0.0}, "objective.sigma_n"),
        ({"sigma_n": -0.2}, "objective.sigma_n"),
        ({"sigma_n": float("nan")}, "objective.sigma_n"),
        ({"sigma_n": 100.0}, "objective.sigma_n"),  # beyond EDM's sigma_max = 80
        ({"sigma_n": 0.2, "sure_weight": 0.0}, "objective.sure_weight"),
        ({"sigma_n": 0.2, "probes": 0}, "objective.probes"),
        ({"sigma_n": 0.2, "probes": 1.5}, "objective.probes"),
        ({"sigma_n": 0.2, "probe": "uniform"}, "objective.probe"),
        ({"sigma_n": 0.2, "divergence": "exact"}, "objective.divergence"),
        ({"sigma_n": 0.2, "eps": 1e-3}, "objective.eps"),  # the jvp takes no step
        ({"sigma_n": 0.2, "divergence": "fd", "eps": 0.0}, "objective.eps"),
        ({"sigma_n": 0.2, "P_std": 0.0}, "objective.P_std"),
        ({"sigma_n": 0.2, "reduce": "max"}, "objective.reduce"),
        ({"sigma_n": 0.2, "dsm_weight": 0.0}, "objective.dsm_weight"),
        ({"sigma_n": 0.2, "dsm_ramp_steps": -1}, "objective.dsm_ramp_steps"),
        ({"sigma_n": 0.2, "dsm_into_denoiser": 1}, "objective.dsm_into_denoiser"),
        ({"sigma_n": 0.2, "nonnegative_divergence": "yes"}, "objective.nonnegative_divergence"),
    ],
)
def test_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")) as e:
        SURE(EDM(), **kwargs)
    assert "\n" not in str(e.value)


def test_sure_risk_refuses_bad_probes_and_sigma():
    y = jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"^probes must be \[batch, P, \*data_shape\]"):
        sure_risk(lambda v: v, y, jnp.ones((2, 3)), sigma_n=0.1)
    with pytest.raises(ValueError, match=r"^sigma_n must be a number in \(0.0, inf\)"):
        sure_risk(lambda v: v, y, jnp.ones((2, 1, 3)), sigma_n=0.0)


# --- through the config ------------------------------------------------------------------


def test_objective_sure_takes_its_noise_level_from_the_data():
    noisy = ["data=digits", "data.dequantise=false", "data.noise_sigma=0.2"]
    cfg = compose_train([*noisy, "objective=sure"])
    data = build.build_data(cfg)
    obj = build.build_objective(cfg, build.build_process(cfg), data)
    assert isinstance(obj, SURE) and obj.sigma_n == 0.2 and obj.divergence == "jvp"
    clean = load_digits()
    assert data.images.noise_sigma == 0.2
    np.testing.assert_array_equal(data.images.test, clean.test)  # the reference stays clean
    noise = (data.images.train - clean.train) / 0.2
    assert abs(noise.std() - 1.0) < 0.02 and abs(noise.mean()) < 0.02


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["data=digits", "objective=sure"], r"objective\.sigma_n: .* data\.noise_sigma=None"),
        (["experiment=toy_dsm", "objective=sure"], r"objective\.sigma_n: .* data=toy"),
        (["data.dequantise=false", "data.noise_sigma=0"], r"data\.noise_sigma must be a number"),
        (["data.dequantise=false", "data.noise_sigma=-0.5"], r"data\.noise_sigma must be a"),
        (  # the default preset (digits_edm) trains on dequantised digits
            ["data=digits", "data.noise_sigma=0.2"],
            r"data\.dequantise must be false with data\.noise_sigma",
        ),
        (
            [
                "data.dequantise=false",
                "data.noise_sigma=0.2",
                "objective=sure",
                "objective.eps=0.01",
            ],
            r"objective\.eps must be null with objective\.divergence=jvp",
        ),
    ],
)
def test_bad_configs_are_refused_naming_the_field(overrides, match):
    cfg = compose_train(overrides)
    with pytest.raises(ValueError, match=match) as e:
        data = build.build_data(cfg)
        build.build_objective(cfg, build.build_process(cfg), data)
    assert "\n" not in str(e.value)
