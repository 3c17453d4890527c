"""The reverse-diffusion Monte Carlo score against closed forms, a float64 loop with the
documented draws, exact noisy scores of a mixture and a many-well, and counted evaluations."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from closed_forms import alpha_sigma
from jax.experimental import io_callback

from scorelib._pytree import static_pytree
from scorelib.data.targets import (
    GaussianMixtureTarget,
    ManyWellTarget,
    Target,
)
from scorelib.processes import VP, ornstein_uhlenbeck
from scorelib.samplers import SAMPLERS, draw_samples, get_sampler, make_grid
from scorelib.scores import MixtureScore, ReverseDiffusionScore
from scorelib.scores.smoothed import time_bits

M0 = np.array([1.0, -0.5])
S0 = 0.7
GAUSS = GaussianMixtureTarget.create([1.0], [M0], stds=[S0], name="gauss")
OU = ornstein_uhlenbeck(2.0)


def exact_gaussian(x, t):
    """Score of p_t and the posterior variance of x_0 for N(M0, S0^2 I) under OU(2), float64."""
    a, s = alpha_sigma(OU, t)
    score = -(x - a * M0) / (a**2 * S0**2 + s**2)
    vq = 1.0 / (1.0 / S0**2 + a**2 / s**2)
    return score, float(a), float(s), vq


def source(target=GAUSS, process=OU, key=0, batch=1, first_index=0, **kw):
    opts = dict(n_samples=16, n_steps=40, step_size=0.5, curvature=1 / S0**2)
    opts.update(kw)
    src = ReverseDiffusionScore.create(target, process=process, **opts)
    return src.for_examples(jax.random.key(key), batch, first_index)


@jax.jit
def _score(src, x, t):
    return src.score(x, t)


@jax.jit
def _posterior(src, x, t):
    return src.posterior_samples(x, t)


# ---------------------------------------------------------------------- Gaussian closed form
@pytest.mark.parametrize("estimator", ["dsi", "tsi"])
@pytest.mark.parametrize("t", [0.05, 0.4])
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_gaussian_score_within_mc_error_that_falls_as_one_over_sqrt_n(estimator, t):
    """MALA chains (exact invariant law, run to equilibrium) on N(M0, S0^2 I): the error of
    the estimate, standardised by its Monte-Carlo std from the closed-form posterior
    variance (DSI: a/s^2 sqrt(vq/n); TSI: sqrt(vq/n) / (S0^2 a)), has mean square 1, and its
    RMS at n = 16 is twice that at n = 64 (two independent key sets)."""
    b = 300
    x = np.random.default_rng(0).normal(size=(b, 2))
    exact, a, s, vq = exact_gaussian(x, t)
    rms = {}
    for n, key in ((16, 1), (64, 2)):
        src = source(key=key, batch=b, n_samples=n, estimator=estimator, method="mala")
        err = np.asarray(_score(src, jnp.asarray(x, jnp.float32), t), np.float64) - exact
        std = a / s**2 * np.sqrt(vq / n) if estimator == "dsi" else np.sqrt(vq / n) / (S0**2 * a)
        z2 = np.mean((err / std) ** 2)  # chi^2 with 600 dof / 600: std 0.058
        assert 0.77 < z2 < 1.25, (n, z2)
        rms[n] = np.sqrt(np.mean(err**2))
    assert 1.75 < rms[16] / rms[64] < 2.3, rms


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_ula_variance_bias_and_mala_acceptance_on_a_gaussian_posterior():
    """The posterior q_t is N(mq, vq I); with curvature = 1/S0^2 the inner step is
    h = step_size vq. ULA's stationary variance is vq / (1 - step_size / 2) (Roberts &
    Tweedie 1996): 2 vq at step_size 1; MALA's is vq, and its acceptance equals
    E[min(1, r)] under stationarity, computed here by numpy Monte Carlo from the formula."""
    t, step, n = 0.3, 1.0, 2000
    x = jnp.asarray([[0.4, -0.2]], jnp.float32)
    _, a, s, vq = exact_gaussian(np.asarray(x), t)
    mq = vq * (M0 / S0**2 + a * np.asarray(x[0]) / s**2)
    out = {}
    for method in ("ula", "mala"):
        src = source(n_samples=n, n_steps=150, step_size=step, method=method)
        out[method] = jax.tree.map(np.asarray, _posterior(src, x, t))
    ula, mala = out["ula"]["x0"][0], out["mala"]["x0"][0]
    assert np.allclose(ula.mean(0), mq, atol=5 * np.sqrt(2 * vq / n))
    assert np.allclose(mala.mean(0), mq, atol=5 * np.sqrt(vq / n))
    assert abs(ula.var(0).mean() / vq - 1 / (1 - step / 2)) < 0.15  # 2.0, rel. std ~2%
    assert abs(mala.var(0).mean() / vq - 1.0) < 0.08
    assert np.all(out["ula"]["accept"] == 1.0)
    # Independent stationary acceptance of MALA on N(0, vq I_2) with h = step vq.
    rng = np.random.default_rng(0)
    h = step * vq
    xs = rng.normal(size=(1_000_000, 2)) * np.sqrt(vq)
    ys = xs - h * xs / vq + np.sqrt(2 * h) * rng.normal(size=xs.shape)
    log_r = (
        -(ys**2).sum(1) / (2 * vq)
        + (xs**2).sum(1) / (2 * vq)
        - ((xs - ys + h * ys / vq) ** 2).sum(1) / (4 * h)
        + ((ys - xs + h * xs / vq) ** 2).sum(1) / (4 * h)
    )
    expected = np.mean(np.minimum(1.0, np.exp(log_r)))
    assert abs(out["mala"]["accept"].mean() - expected) < 0.02, expected
    small = jax.tree.map(np.asarray, _posterior(source(n_samples=200, step_size=0.01), x, t))
    assert small["accept"].mean() > 0.99 > out["mala"]["accept"].mean()


# ---------------------------------------------------------------------- the documented draws
def _np_chains(x, t, key, n, k, step, curvature, method, b_index):
    """float64 loop of the module docstring's draws and the kernels' formulas (Gaussian p)."""
    a, s = (float(v) for v in alpha_sigma(OU, t))
    y, v = x / a, (s / a) ** 2
    logp = lambda u: -np.sum((u - M0) ** 2) / (2 * S0**2)  # noqa: E731
    grad = lambda u: -(u - M0) / S0**2  # noqa: E731
    log_q = lambda u: logp(u) - np.sum((y - u) ** 2) / (2 * v)  # noqa: E731
    grad_q = lambda u: grad(u) + (y - u) / v  # noqa: E731
    h = step * v / (1 + curvature * v)
    kb = jax.random.fold_in(jax.random.fold_in(key, b_index), 2**32 - 1)
    kb = jax.random.fold_in(kb, int(np.float32(t).view(np.uint32)))
    out = []
    for c in range(n):
        kc = jax.random.fold_in(jax.random.fold_in(kb, 1 + c), 1)
        u = y.copy()
        for j in range(k):
            kj = jax.random.fold_in(kc, j)
            z = np.asarray(jax.random.normal(jax.random.fold_in(kj, 0), (2,)), np.float64)
            prop = u + h * grad_q(u) + np.sqrt(2 * h) * z
            if method == "ula":
                u = prop
                continue
            uu = float(jax.random.uniform(jax.random.fold_in(kj, 1), ()))
            lq = lambda b_, a_: -np.sum((b_ - a_ - h * grad_q(a_)) ** 2) / (4 * h)  # noqa: E731
            log_r = log_q(prop) - log_q(u) + lq(u, prop) - lq(prop, u)
            if np.log(uu) < log_r:
                u = prop
        out.append(u)
    return np.array(out)


@pytest.mark.parametrize("method", ["ula", "mala"])
def test_chains_match_a_float64_loop_with_the_documented_draws(method):
    key = jax.random.key(3)
    x = np.array([[0.3, -0.8], [1.5, 0.2]])
    t = 0.25
    src = ReverseDiffusionScore.create(
        GAUSS, process=OU, n_samples=3, n_steps=4, step_size=1.2, curvature=0.5, method=method
    ).for_examples(key, 2, first_index=7)
    got = np.asarray(_posterior(src, jnp.asarray(x, jnp.float32), t)["x0"], np.float64)
    for b in range(2):
        want = _np_chains(x[b], t, key, 3, 4, 1.2, 0.5, method, 7 + b)
        np.testing.assert_allclose(got[b], want, rtol=2e-4, atol=2e-4)


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_draws_are_per_example_and_per_time():
    x = jnp.asarray(np.random.default_rng(1).normal(size=(6, 2)), jnp.float32)
    kw = dict(n_samples=4, n_steps=3, init="importance", n_proposals=8)
    whole = _score(source(batch=6, key=4, **kw), x, 0.3)
    part = _score(source(batch=2, key=4, first_index=4, **kw), x[4:], 0.3)
    np.testing.assert_allclose(np.asarray(whole[4:]), np.asarray(part), rtol=1e-5, atol=1e-5)
    other_t = _score(source(batch=6, key=4, **kw), x, 0.3000001)
    assert not np.allclose(np.asarray(whole), np.asarray(other_t), atol=1e-3)
    assert int(time_bits(0.3, 1)[0]) != int(time_bits(0.3000001, 1)[0])


# ---------------------------------------------------------------------- non-Gaussian targets
def _standardised_error(src, exact_denoiser, x, t):
    """(D_est - D_exact) / (chains' std / sqrt(n)): ~N(0, 1) for i.i.d. exact posterior draws."""
    x0 = np.asarray(_posterior(src, jnp.asarray(x, jnp.float32), t)["x0"], np.float64)
    n = x0.shape[1]
    se = x0.std(1, ddof=1) / np.sqrt(n)
    return (x0.mean(1) - exact_denoiser) / se


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_mixture_posterior_mean_matches_the_exact_mixture_score():
    """A bimodal 1-D mixture whose posterior is bimodal at t = 0.5: importance start (the
    posterior's mode weights) and MALA; the denoiser of the exact MixtureScore."""
    tg = GaussianMixtureTarget.create([0.3, 0.7], [[-1.0], [1.2]], stds=[0.4, 0.5], name="m")
    exact = MixtureScore.create(OU, tg.weights, tg.means, tg.covs)
    x = np.linspace(-1.0, 1.0, 100)[:, None]
    t = 0.5
    d_exact = np.asarray(exact.denoiser(jnp.asarray(x, jnp.float32), t), np.float64)
    src = source(
        target=tg,
        batch=100,
        n_samples=128,
        n_steps=30,
        curvature=1 / 0.4**2,
        init="importance",
        n_proposals=2048,
    )
    z = _standardised_error(src, d_exact, x, t)
    assert abs(np.mean(z)) < 0.35 and 0.6 < np.mean(z**2) < 1.6, (np.mean(z), np.mean(z**2))


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_manywell_posterior_mean_matches_the_quadrature_score():
    tg = ManyWellTarget.create(2)
    exact = tg.noisy_score(OU)
    x = np.random.default_rng(2).normal(size=(150, 2)) * 0.5
    t = 0.01  # OU time 0.02, v = 0.041: 1/v = 24.5 > 12 = -min E'', so q_t is log-concave
    d_exact = np.asarray(exact.denoiser(jnp.asarray(x, jnp.float32), t), np.float64)
    src = source(target=tg, batch=150, n_samples=128, n_steps=60, curvature=24.0)
    z = _standardised_error(src, d_exact, x, t)
    assert abs(np.mean(z)) < 0.25 and 0.7 < np.mean(z**2) < 1.4, (np.mean(z), np.mean(z**2))


# ---------------------------------------------------------------------- samplers and counts
@pytest.mark.slow  # the batches of 3: one compile for all samplers; of 1: one per sampler
def test_every_registered_sampler_runs_on_it_jitted():
    """3 steps of each sampler (the driver binds the draws): finite, batch-size independent (one
    batch of 3, all samplers in one ``jax.jit``, against ``draw_samples`` in batches of 1)."""
    p = VP(beta_min=2.0, beta_max=2.0, eps=0.05)
    tg = GaussianMixtureTarget.create([0.5, 0.5], [[-1.0, 0.0], [1.0, 0.0]], stds=[0.5, 0.5])
    src = ReverseDiffusionScore.create(tg, process=p, n_samples=2, n_steps=2, curvature=4.0)
    grid = make_grid("uniform_t", 3, p)
    opts = {name: dict(grid=grid) for name in SAMPLERS}
    opts["annealed_langevin"]["n_steps_each"] = 2

    @jax.jit
    def batches_of_3(src, key):
        return {k: get_sampler(k)(src, key, (3, 2), **opts[k])[0] for k in SAMPLERS}

    key = jax.random.key(0)
    whole = batches_of_3(src, key)
    for name in sorted(SAMPLERS):
        sampler = get_sampler(name)
        b, info = draw_samples(sampler, src, key, (2,), num_samples=3, batch_size=1, **opts[name])
        a = np.asarray(whole[name])
        assert np.all(np.isfinite(a)) and info["num_nonfinite"] == 0, name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=name)
    with pytest.raises(ValueError, match="for_examples"):  # unbound, called directly
        src.score(jax.numpy.zeros((3, 2)), 0.5)


@static_pytree
@dataclasses.dataclass(frozen=True, eq=False)
class CountingGauss(Target):
    """N(0, I_2) whose log_prob and score count the rows they see (host callbacks)."""

    dim: int = 2
    name: str = "counting"
    counts: dict = None

    def _count(self, which, x):
        def add(n):
            self.counts[which] += int(n)

        io_callback(add, None, jnp.int32(x.shape[0]))

    def log_prob(self, x):
        self._count("density", x)
        return -0.5 * jnp.sum(x**2, -1)

    def score(self, x):
        self._count("grad", x)
        return -x


def test_snis_is_the_weighted_mean_of_the_documented_proposals_and_converges():
    """estimator=snis: the weighted mean of the proposals drawn from fold_in(k_bt, 0), by a
    float64 numpy loop; on the bimodal mixture its error against the exact denoiser,
    standardised by the delta-method standard error of a self-normalised mean, is N(0, 1)."""
    tg = GaussianMixtureTarget.create([0.3, 0.7], [[-1.0], [1.2]], stds=[0.4, 0.5], name="m")
    t, b, m = 0.5, 200, 4096
    src = source(
        target=tg,
        batch=b,
        init="importance",
        n_proposals=m,
        n_steps=0,
        n_samples=1,
        estimator="snis",
        curvature=1 / 0.4**2,
    )
    x = np.linspace(-1.0, 1.0, b)[:, None]
    got = np.asarray(jax.jit(lambda s_, x_: s_.denoiser(x_, t))(src, jnp.asarray(x, jnp.float32)))
    a, s = alpha_sigma(OU, t)
    v = (s / a) ** 2
    want, se = np.zeros(b), np.zeros(b)
    for i in range(b):  # the module docstring's draws, by hand
        kb = jax.random.fold_in(jax.random.fold_in(src.keys[i], 2**32 - 1), time_bits(t, 1)[0])
        eps = np.asarray(jax.random.normal(jax.random.fold_in(kb, 0), (m, 1)), np.float64)
        z = x[i, 0] / a + np.sqrt(v) * eps[:, 0]
        logp = np.log(
            sum(
                w * np.exp(-0.5 * ((z - mu) / sd) ** 2) / sd
                for w, mu, sd in ((0.3, -1.0, 0.4), (0.7, 1.2, 0.5))
            )
        )
        w = np.exp(logp - logp.max())
        w /= w.sum()
        want[i] = np.sum(w * z)
        se[i] = np.sqrt(np.sum(w**2 * (z - want[i]) ** 2))  # delta method (Owen 2013, 9.12)
    np.testing.assert_allclose(got[:, 0], want, rtol=2e-4, atol=2e-4)
    exact = MixtureScore.create(OU, tg.weights, tg.means, tg.covs)
    d_exact = np.asarray(exact.denoiser(jnp.asarray(x, jnp.float32), t), np.float64)[:, 0]
    zs = (want - d_exact) / se
    assert abs(np.mean(zs)) < 0.3 and 0.6 < np.mean(zs**2) < 1.5, (np.mean(zs), np.mean(zs**2))
    assert src.evaluations_per_query() == {"grad": 0, "density": m}


def test_snis_refuses_the_options_it_does_not_use():
    kw = dict(process=OU, estimator="snis")
    for opts, field in (
        (dict(n_steps=3, n_samples=1), "score.init must be importance with score.estimator=snis"),
        (dict(init="importance", n_steps=3, n_samples=1), "score.n_steps must be 0 with"),
        (dict(init="importance", n_steps=0, n_samples=8), "score.n_samples must be 1 with"),
    ):
        with pytest.raises(ValueError, match=field):
            ReverseDiffusionScore.create(GAUSS, **kw, **opts)


@pytest.mark.parametrize(
    "opts",
    [
        dict(method="mala", init="importance", n_proposals=5),
        dict(method="ula", estimator="tsi"),
        dict(method="mala", estimator="tsi", n_steps=0, init="importance", n_proposals=3),
        dict(estimator="snis", n_steps=0, n_samples=1, init="importance", n_proposals=7),
    ],
    ids=["mala-importance", "ula-tsi", "is-only-tsi", "snis"],
)
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_target_evaluations_are_counted_exactly(opts):
    counts = {"grad": 0, "density": 0}
    tg = CountingGauss(counts=counts)
    kw = dict(n_samples=3, n_steps=4, curvature=1.0)
    kw.update(opts)
    src = ReverseDiffusionScore.create(tg, process=OU, **kw)
    grid = make_grid("uniform_t", 5, OU)
    b = 4
    _, info = get_sampler("euler_maruyama")(src, jax.random.key(0), (b, 2), grid=grid)
    jax.effects_barrier()
    want = src.target_evaluations(info["nfe"])
    assert counts == {"grad": b * want["grad"], "density": b * want["density"]}, (counts, want)


# ---------------------------------------------------------------------- bad input
def test_bad_inputs_give_one_line_errors_naming_the_field():
    def one_line(match, fn, *a, **k):
        with pytest.raises(ValueError, match=match) as e:
            fn(*a, **k)
        assert "\n" not in str(e.value)

    create = ReverseDiffusionScore.create
    one_line("^data.target must be a target with a log-density", create, Target(), process=OU)
    exact = GAUSS.noisy_score(OU)
    one_line("^data.target must be a target with a log-density", create, exact, process=OU)
    one_line("^data.target must be", create, np.zeros((10, 2)), process=OU)
    one_line("^process must be", create, GAUSS, process="ou")
    for field, value in [
        ("n_samples", 0),
        ("n_steps", 0),
        ("n_steps", 1.5),
        ("step_size", 2.0),
        ("step_size", 0.0),
        ("curvature", 0.0),
        ("method", "hmc"),
        ("init", "prior"),
        ("estimator", "both"),
    ]:
        one_line(f"^score.{field} must be", create, GAUSS, process=OU, **{field: value})
    one_line("^score.n_proposals must be null", create, GAUSS, process=OU, n_proposals=8)
    one_line(
        "^score.n_proposals must be", create, GAUSS, process=OU, init="importance", n_proposals=0
    )
    src = create(GAUSS, process=ornstein_uhlenbeck(1.0, eps=0.0))
    x = jnp.zeros((2, 2))
    one_line("ReverseDiffusionScore.keys must be .* for_examples", src.score, x, 0.5)
    keyed = src.for_examples(jax.random.key(0), 2)
    for t in (0.0, -0.1):
        one_line(r"^t must be a time with a noise level ve_sigma\(t\) > 0", keyed.score, x, t)
    one_line(
        r"^x must have shape \[batch, 2\] \(the data_shape of the Reverse",
        keyed.score,
        jnp.zeros((2, 3)),
        0.5,
    )
    one_line("^process.horizon must be", ornstein_uhlenbeck, 0.0)
