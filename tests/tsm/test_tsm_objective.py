"""TSM and DSM/TSM mixtures: the identities behind them, checked by Monte Carlo with
tolerances from the Monte-Carlo standard error, and the objective's bookkeeping.

De Bortoli et al., "Target score matching", arXiv 2402.08667 (2024), Sec. 2.
"""

import math

import closed_forms
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.data.targets import GaussianMixtureTarget, gmm_1d, random_gaussian_mixture
from scorelib.objectives import DSM, TSM, MixedScoreMatching, example_draws, kappa_schedule
from scorelib.processes import EDM, VE, VP
from scorelib.scores import MixtureScore, ScoreSource

Z = 4.5  # tolerance in standard errors (two-sided p ~ 7e-6 per comparison)


class LinearScore(ScoreSource):
    """``s(x, t) = x A^T + b + t c``: a linear score model (parameters are pytree leaves)."""

    A: jax.Array = None
    b: jax.Array = None
    c: jax.Array = None

    def score(self, x, t):
        t = jnp.broadcast_to(jnp.asarray(t), (x.shape[0],))
        return x @ self.A.T + self.b + t[:, None] * self.c


# ------------------------------------------------------------ the target score identity


@pytest.mark.parametrize("process", [EDM(sigma_min=1e-3), VP()], ids=["edm", "vp"])
@pytest.mark.parametrize("ve_sigma", [0.3, 1.0])
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_target_score_identity_by_importance_weights_on_1d_mixture(process, ve_sigma):
    """E[grad log p0(x0) / alpha | x_t = y] (self-normalised IS from exact prior samples)
    equals the closed-form noisy mixture score; so does the DSI estimate."""
    target = gmm_1d()
    t = float(closed_forms.t_of_ve_sigma(process, ve_sigma))
    a, sig = (float(v) for v in closed_forms.alpha_sigma(process, t))
    n = 400_000
    x0 = np.asarray(target.sample(jax.random.key(1), n), np.float64)[:, 0]
    g = np.asarray(target.score(jnp.asarray(x0[:, None], jnp.float32)), np.float64)[:, 0]
    ys = a * np.array([-2.1, -0.7, 0.1, 1.2, 2.8])
    exact = np.asarray(
        MixtureScore.create(process, target.weights, target.means, target.covs).score(
            jnp.asarray(ys[:, None], jnp.float32), jnp.full((5,), t, jnp.float32)
        ),
        np.float64,
    )[:, 0]
    for y, s_true in zip(ys, exact, strict=True):
        logw = -0.5 * ((y - a * x0) / sig) ** 2
        w = np.exp(logw - logw.max())
        w /= w.sum()
        for label in (g / a, (a * x0 - y) / sig**2):  # TSI, DSI
            est = np.sum(w * label)
            se = math.sqrt(np.sum(w**2 * (label - est) ** 2))  # delta-method SE of the ratio
            assert abs(est - s_true) < Z * se + 1e-4 * abs(s_true), (y, est, s_true, se)


# ------------------------------------------------- gradients agree in expectation


def _per_example_grads(obj, src, x0, key):
    """``[n, n_params]`` gradients of the per-example losses of ``obj`` (labels from the
    objective itself, with its own split of ``key`` into times and noise)."""
    u, eps = example_draws(key, x0, "uniform")
    t = obj.times(u)
    lab = obj.labels(x0, t, eps)
    w = obj.weight(t)

    def one(s, xt, ti, u, wi):
        return wi * jnp.sum((s.score(xt[None], ti[None])[0] - u) ** 2)

    g = jax.jit(jax.vmap(jax.grad(one), in_axes=(None, 0, 0, 0, 0)))(src, lab["xt"], t, lab["u"], w)
    return np.concatenate(
        [np.asarray(l, np.float64).reshape(x0.shape[0], -1) for l in jax.tree.leaves(g)], axis=1
    )


@pytest.mark.parametrize(
    "process,t_range", [(EDM(sigma_min=1e-3), (0.05, 2.0)), (VP(), (0.02, 0.6))], ids=["edm", "vp"]
)
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_dsm_and_tsm_gradients_agree_in_expectation_on_a_linear_model(process, t_range):
    target = random_gaussian_mixture(2, 3, seed=4, mean_scale=1.0, var_range=(0.2, 1.0))
    src = LinearScore(
        process=process,
        A=jnp.asarray([[-0.7, 0.2], [0.1, -1.3]]),
        b=jnp.asarray([0.3, -0.2]),
        c=jnp.asarray([0.1, 0.05]),
    )
    n = 60_000
    x0 = target.sample(jax.random.key(7), n)
    key = jax.random.key(8)  # the same (t, eps) for both objectives: paired differences
    objs = {
        k: MixedScoreMatching(process, target, kappa=k, t_range=t_range, sigma_switch=0.5)
        for k in ("dsm", "tsm", "switch", "gaussian_optimal")
    }
    grads = {k: _per_example_grads(o, src, x0, key) for k, o in objs.items()}
    for k in ("tsm", "switch", "gaussian_optimal"):
        diff = grads[k] - grads["dsm"]
        se = diff.std(0) / math.sqrt(n)
        assert np.all(np.abs(diff.mean(0)) < Z * se), (k, diff.mean(0), se)
        assert np.all(se > 0)

    # power: a TSM label built from a *wrong* target score (every component's
    # covariance inflated by 30%) gives a gradient the same test detects.
    wrong = GaussianMixtureTarget.create(target.weights, target.means, 1.3 * target.covs)
    bad = _per_example_grads(
        MixedScoreMatching(process, wrong, kappa="tsm", t_range=t_range), src, x0, key
    )
    diff = bad - grads["dsm"]
    se = diff.std(0) / math.sqrt(n)
    assert np.max(np.abs(diff.mean(0)) / se) > 2 * Z


# ---------------------------------------------- label variances, measured by Monte Carlo


def _label_residuals(process, target, kappa, sigmas, n, seed, **kw):
    """``||label - s_t(x_t)||^2`` for ``n`` examples at each VE-frame noise level.

    Returns ``{name: [len(sigmas), n] float64}`` for ``name`` in ``u`` (the objective's
    label), ``u_dsm`` and ``u_tsm`` (all from one call of ``labels``), with the exact
    noisy score of the target as ``s_t``.
    """
    obj = MixedScoreMatching(process, target, kappa=kappa, **kw)
    ts = process.t_of_ve_sigma(jnp.asarray(sigmas, jnp.float32))
    t = jnp.repeat(ts, n)
    kx, ke = jax.random.split(jax.random.key(seed))
    x0 = target.sample(kx, n * len(sigmas))
    eps = jax.random.normal(ke, x0.shape)
    lab = obj.labels(x0, t, eps)
    s_true = np.asarray(target.noisy_score(process).score(lab["xt"], t), np.float64)
    return {
        k: np.sum((np.asarray(lab[k], np.float64) - s_true) ** 2, -1).reshape(len(sigmas), n)
        for k in ("u", "u_dsm", "u_tsm")
    }


SIGMAS_OPT = [0.01, 0.3, 3.0]


@pytest.mark.parametrize(
    "process",
    [VE(sigma_min=1e-4), pytest.param(EDM(sigma_min=1e-4), marks=pytest.mark.slow), VP()],
    ids=["ve", "edm", "vp"],
)
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_gaussian_optimal_label_has_zero_variance_for_gaussian_data(process):
    sd = 0.7
    target = GaussianMixtureTarget.create([1.0], [[0.5, -1.0, 2.0]], stds=[sd])
    n = 2000
    r = _label_residuals(process, target, "gaussian_optimal", SIGMAS_OPT, n, 0)
    r_wrong = _label_residuals(
        process, target, "gaussian_optimal", SIGMAS_OPT, n, 0, sigma_d=1.4 * sd
    )
    aniso = GaussianMixtureTarget.create([1.0], [[0.0, 0.0]], [np.diag([0.2, 1.5])])
    r_aniso = _label_residuals(process, aniso, "gaussian_optimal", SIGMAS_OPT, n, 0)
    for i, ve_sigma in enumerate(SIGMAS_OPT):
        # the pure labels have a conditional variance (DSM's ~ d / sigma^2 at low noise,
        # TSM's ~ d sigma^2 / sd^4); the Gaussian-optimal label is exact up to float32 rounding
        floor = min(r["u_dsm"][i].mean(), r["u_tsm"][i].mean())
        assert floor > 1e-4
        assert r["u"][i].mean() < 1e-5 * floor, (ve_sigma, r["u"][i].mean(), floor)
        # ... and only for an isotropic Gaussian with the right sigma_d: a wrong sigma_d or
        # an anisotropic covariance leaves a variance the same check sees
        assert r_wrong["u"][i].mean() > 1e-2 * floor, ve_sigma
        floor_aniso = min(r_aniso["u_dsm"][i].mean(), r_aniso["u_tsm"][i].mean())
        assert r_aniso["u"][i].mean() > 1e-2 * floor_aniso, ve_sigma


def _mean_and_se(r):
    return r.mean(), r.std() / math.sqrt(r.size)


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_dsm_label_variance_scales_like_d_over_sigma2_and_tsm_does_not():
    """Measured: V(sigma) = E||u - s_t(x_t)||^2 by Monte Carlo with the exact noisy score."""
    process = EDM(sigma_min=1e-4)
    sigmas = [1e-3, 1e-2, 1e-1]
    n = 4000
    v = {}
    for d in (2, 8):
        target = random_gaussian_mixture(d, 3, seed=d, var_range=(0.1, 1.0))
        r = _label_residuals(process, target, "tsm", sigmas, n, 1)
        for j, s in enumerate(sigmas):
            v[d, "dsm", s] = _mean_and_se(r["u_dsm"][j])
            v[d, "tsm", s] = _mean_and_se(r["u_tsm"][j])
    for d in (2, 8):
        for s in sigmas[:2]:
            m, se = v[d, "dsm", s]
            # theory: d / sigma^2 - E||s_t||^2 = d / sigma^2 (1 - O(sigma^2 / var_min))
            assert abs(m * s**2 / d - 1.0) < Z * se * s**2 / d + 0.02, (d, s, m)
        # slope in log-log between 1e-3 and 1e-2: -2 for DSM
        (m1, se1), (m2, se2) = v[d, "dsm", 1e-3], v[d, "dsm", 1e-2]
        slope = math.log(m2 / m1) / math.log(10.0)
        slope_se = math.hypot(se1 / m1, se2 / m2) / math.log(10.0)
        assert abs(slope + 2.0) < Z * slope_se + 0.01, slope
        # TSM: the variance *falls* as sigma -> 0 and is negligible against d / sigma^2
        t1, t2, t3 = (v[d, "tsm", s][0] for s in sigmas)
        assert t1 < t2 < t3
        assert t1 < 1e-6 * d / 1e-3**2 and t2 < 1e-3 * d / 1e-2**2
    # linear in d: V_dsm(d=8) / V_dsm(d=2) = 4 at small sigma
    (m8, se8), (m2, se2) = v[8, "dsm", 1e-3], v[2, "dsm", 1e-3]
    ratio = m8 / m2
    assert abs(ratio - 4.0) < Z * ratio * math.hypot(se8 / m8, se2 / m2) + 0.01, ratio


# ------------------------------------------------------------ bookkeeping and errors


def test_dsm_kappa_is_exactly_the_library_dsm():
    p = VP()
    target = gmm_1d()
    src = LinearScore(process=p, A=jnp.eye(1) * -0.5, b=jnp.zeros(1), c=jnp.ones(1) * 0.1)
    x0 = target.sample(jax.random.key(0), 16)
    key = jax.random.key(3)
    ours, aux = MixedScoreMatching(p, target, kappa="dsm").example_losses(src, x0, key)
    ref, ref_aux = DSM(p).example_losses(src, x0, key)
    np.testing.assert_allclose(ours, ref, rtol=1e-6)
    np.testing.assert_array_equal(aux["t"], ref_aux["t"])


@pytest.mark.parametrize("b", [1, pytest.param(2, marks=pytest.mark.slow), 7])
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_per_example_loss_against_a_loop(b):
    """No [b,1] x [b] broadcasting of the weight against the error: the batch loss equals a
    per-example loop."""
    p = VP()
    target = random_gaussian_mixture(3, 2, seed=0)
    src = LinearScore(process=p, A=-jnp.eye(3), b=jnp.zeros(3), c=jnp.ones(3) * 0.2)
    obj = MixedScoreMatching(p, target, kappa="log_linear", weighting="sigma2", reduce="sum")
    x0 = target.sample(jax.random.key(2), b)
    key = jax.random.key(4)
    loss, aux = obj.example_losses(src, x0, key)
    assert loss.shape == (b,)
    u, eps = example_draws(key, x0, "uniform")
    t = obj.times(u)
    np.testing.assert_array_equal(aux["t"], t)
    # reference in float64 numpy, one example at a time (the clean target score is
    # tested on its own in test_targets.py)
    g = np.asarray(target.score(x0), np.float64)
    x64, eps, t64 = (np.asarray(v, np.float64) for v in (x0, eps, t))
    A, bb, c = (np.asarray(v, np.float64) for v in (src.A, src.b, src.c))
    for i in range(b):
        a, s = (float(v) for v in closed_forms.alpha_sigma(p, t64[i]))
        k = min(max(math.log(1.0 / (s / a)) / math.log(1.0 / 0.01), 0.0), 1.0)
        xt = a * x64[i] + s * eps[i]
        u = k * g[i] / a + (1 - k) * (-eps[i] / s)
        pred = A @ xt + bb + t64[i] * c
        np.testing.assert_allclose(loss[i], s**2 * np.sum((pred - u) ** 2), rtol=1e-4)
    scalar, metrics = obj(src, x0, key)
    np.testing.assert_allclose(scalar, loss.mean(), rtol=1e-6)
    assert set(metrics) >= {"loss", "kappa", "t", "ve_sigma"}


def test_kappa_schedules():
    s = jnp.asarray([1e-3, 0.01, 0.1, 0.099, 1.0, 10.0])
    np.testing.assert_array_equal(kappa_schedule("switch", s, sigma_switch=0.1), [1, 1, 0, 1, 0, 0])
    ll = kappa_schedule("log_linear", s, sigma_lo=0.01, sigma_hi=1.0)
    np.testing.assert_allclose(ll, [1, 1, 0.5, 0.5 + math.log10(1 / 0.99) / 2, 0, 0], atol=1e-6)
    go = kappa_schedule("gaussian_optimal", s, sigma_d=0.5)
    np.testing.assert_allclose(go, 0.25 / (0.25 + s**2), rtol=1e-6)
    # VE-frame thresholds: under VP the switch happens at sigma/alpha, not sigma
    p = VP()
    obj = MixedScoreMatching(p, gmm_1d(), kappa="switch", sigma_switch=1.0)
    t = p.t_of_ve_sigma(jnp.asarray([0.9, 1.1]))
    np.testing.assert_array_equal(obj.kappa_of(p.ve_sigma(t)), [1.0, 0.0])


def test_log_sigma_time_sampling_is_log_uniform_over_the_range():
    p = VP()
    obj = TSM(p, gmm_1d(), t_sampling="log_sigma", t_range=(0.01, 0.9))
    t = obj.times(jax.random.uniform(jax.random.key(0), (20000,)))
    assert float(t.min()) >= 0.01 and float(t.max()) <= 0.9
    ls = np.log(np.asarray(p.ve_sigma(t), np.float64))
    lo, hi = float(np.log(p.ve_sigma(0.01))), float(np.log(p.ve_sigma(0.9)))
    u = (ls - lo) / (hi - lo)
    from scipy import stats

    assert stats.kstest(u, "uniform").pvalue > 1e-3


def test_kappa_sigma_d_sets_the_gaussian_optimal_kappa_and_leaves_the_weight():
    """kappa = sd^2 / (sd^2 + sigma^2) with sd = kappa_sigma_d, written out; the fisher
    weight keeps the target's sigma_d (the network's scale)."""
    p, tg = EDM(), gmm_1d()
    s = jnp.array([1e-3, 0.1, 0.36, 3.0])
    t = p.t_of_ve_sigma(s)
    base = MixedScoreMatching(p, tg, weighting="fisher", sigma_fisher=0.3)
    modes = MixedScoreMatching(p, tg, weighting="fisher", sigma_fisher=0.3, kappa_sigma_d=0.36)
    np.testing.assert_allclose(modes.kappa_of(s), 0.36**2 / (0.36**2 + s**2), rtol=1e-6)
    sd = float(tg.sigma_data)
    np.testing.assert_allclose(base.kappa_of(s), sd**2 / (sd**2 + s**2), rtol=1e-6)
    np.testing.assert_array_equal(modes.weight(t), base.weight(t))
    with pytest.raises(ValueError, match="^objective.kappa_sigma_d must be null unless"):
        MixedScoreMatching(p, tg, kappa="switch", kappa_sigma_d=0.36)
    with pytest.raises(ValueError, match="^objective.kappa_sigma_d must be > 0"):
        MixedScoreMatching(p, tg, kappa_sigma_d=0.0)


def test_validation_errors_name_the_field():
    p, tg = EDM(), gmm_1d()
    with pytest.raises(ValueError, match="objective.kappa must be one of"):
        MixedScoreMatching(p, tg, kappa="cosine")
    with pytest.raises(ValueError, match="objective.sigma_lo must be < objective.sigma_hi"):
        MixedScoreMatching(p, tg, kappa="log_linear", sigma_lo=1.0, sigma_hi=0.1)
    with pytest.raises(ValueError, match="objective.sigma_switch"):
        MixedScoreMatching(p, tg, kappa="switch", sigma_switch=0.0)
    with pytest.raises(ValueError, match="objective.sigma_d"):
        MixedScoreMatching(p, tg, sigma_d=-1.0)
    with pytest.raises(ValueError, match="objective.t_sampling"):
        MixedScoreMatching(p, tg, t_sampling="lognormal")
    with pytest.raises(ValueError, match="objective.t_range"):
        MixedScoreMatching(p, tg, t_range=(0.0001, 1.0))
    with pytest.raises(ValueError, match="objective.weighting"):
        TSM(p, tg, weighting="edm")
    with pytest.raises(ValueError, match="kappa of TSM must be 'tsm'"):
        TSM(p, tg, kappa="dsm")
    with pytest.raises(ValueError, match="objective.sigma_fisher"):  # used by 'fisher' only
        MixedScoreMatching(p, tg, weighting="relative", sigma_fisher=0.3)
    with pytest.raises(ValueError, match="objective.sigma_fisher"):
        MixedScoreMatching(p, tg, weighting="fisher", sigma_fisher=0.0)


def test_objective_is_hashable_and_jits():
    p = EDM()
    obj = MixedScoreMatching(p, gmm_1d(), kappa="gaussian_optimal", t_range=[0.01, 5.0])
    assert obj.t_range == (0.01, 5.0) and hash(obj) == hash(obj)
    src = LinearScore(process=p, A=-jnp.eye(1), b=jnp.zeros(1), c=jnp.zeros(1))
    x0 = jnp.ones((4, 1))
    f = jax.jit(lambda o, s, x, k: o(s, x, k)[0])
    np.testing.assert_allclose(
        f(obj, src, x0, jax.random.key(0)), obj(src, x0, jax.random.key(0))[0], rtol=1e-6
    )


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_weightings():
    """lambda(t): sigma^2 and g^2 as DSM, alpha^2 (normalised TSM), and the relative weighting."""
    p = VP()
    tg = gmm_1d()
    t = jnp.asarray([0.05, 0.5, 0.95])
    a, s = closed_forms.alpha_sigma(p, np.asarray(t, np.float64))
    np.testing.assert_allclose(
        MixedScoreMatching(p, tg, weighting="sigma2").weight(t), s**2, rtol=1e-5
    )
    np.testing.assert_allclose(
        MixedScoreMatching(p, tg, weighting="likelihood").weight(t),
        closed_forms.f_g2(p, np.asarray(t, np.float64))[1],
        rtol=1e-5,
    )
    np.testing.assert_allclose(TSM(p, tg, weighting="alpha2").weight(t), a**2, rtol=1e-5)
    sd = 0.8
    rel = MixedScoreMatching(p, tg, weighting="relative", sigma_d=sd).weight(t)
    np.testing.assert_allclose(rel, a**2 * (sd**2 + (s / a) ** 2) / sd**2, rtol=1e-5)
    mix = MixedScoreMatching(
        p, tg, kappa="log_linear", sigma_lo=0.1, sigma_hi=10.0, weighting="kappa"
    )
    k = np.clip(np.log(10.0 / (s / a)) / np.log(100.0), 0, 1)
    np.testing.assert_allclose(mix.weight(t), k * a**2 + (1 - k) * s**2, rtol=1e-5)
    assert 0 < k[1] < 1  # the interpolation is exercised
    # fisher: alpha^2 (v^2 + sf^2)(v^2 + sd^2) / sd^2 with v = sigma / alpha
    fis = MixedScoreMatching(
        p, tg, kappa="switch", weighting="fisher", sigma_d=sd, sigma_fisher=0.3
    )
    v2 = (s / a) ** 2
    np.testing.assert_allclose(fis.weight(t), a**2 * (v2 + 0.09) * (v2 + sd**2) / sd**2, rtol=1e-5)
    # pure TSM with alpha2 is the normalised loss ||alpha s_theta - grad log p0(x0)||^2
    src = LinearScore(process=p, A=-jnp.eye(1), b=jnp.zeros(1), c=jnp.zeros(1))
    x0 = tg.sample(jax.random.key(0), 5)
    obj = TSM(p, tg, weighting="alpha2", reduce="sum")
    loss, aux = obj.example_losses(src, x0, jax.random.key(1))
    u, eps = example_draws(jax.random.key(1), x0, "uniform")
    tt = obj.times(u)
    xt = p.marginal_sample(x0, tt, eps)
    at = p.alpha(tt)[:, None]
    ref = jnp.sum((at * src.score(xt, tt) - tg.score(x0)) ** 2, -1)
    np.testing.assert_allclose(loss, ref, rtol=1e-4)
