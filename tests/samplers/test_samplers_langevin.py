"""The Langevin corrector (PC's and annealed Langevin's) against exact Gaussian scores.

Stationary law: with a fixed step ``eps`` the corrector is ULA, whose stationary law for
``N(m, v)`` is ``N(m, v / (1 - eps / (2 v)))`` (the AR(1) recursion
``x' = (1 - eps / v) x + sqrt(2 eps) z``), so the measured variance is compared with that
closed form, and with the issue's runs (score 0 at the start; N(0, 9 I) in d = 3 and 1).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.processes import EDM, VP
from scorelib.samplers import (
    corrector_step_size,
    edm_grid,
    euler_maruyama,
    langevin_corrector,
    pc,
)
from scorelib.scores import GaussianScore


def gaussian(process, d, var):
    return GaussianScore.from_covariance(process, np.zeros(d), var * np.eye(d))


def test_start_where_the_score_is_zero_is_finite():
    """The issue's case: x_T at the mean of a Gaussian (score exactly 0) gave [[nan, nan]]."""
    src = GaussianScore.from_covariance(EDM(), mean=[0.3, -0.2], cov=[[1, 0.6], [0.6, 0.5]])
    x_T = np.array([[0.3, -0.2]])
    x, _ = pc(src, jax.random.key(0), (1, 2), grid=edm_grid(5), x_T=x_T)
    em, _ = euler_maruyama(src, jax.random.key(0), (1, 2), grid=edm_grid(5), x_T=x_T)
    assert np.all(np.isfinite(np.asarray(x))) and np.all(np.isfinite(np.asarray(em)))
    # and the corrector alone at the mean moves by the noise only
    y = langevin_corrector(src, jax.random.key(1), x_T, 1.0, step_size=0.01, n_steps=1)
    assert np.all(np.isfinite(np.asarray(y)))


@pytest.mark.parametrize("d", [3, 1])
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_pc_keeps_the_issue_gaussian_invariant(d):
    """The issue's run: 2,000 chains of N(0, 9 I) (EDM, t = 1.5, data variance 6.75),
    started at exact draws, 50 calls of pc with snr = 0.0236 and 100 corrector steps on
    a grid [1.5, 1.5 (1 - 1e-6)]. The old per-chain step ended at std 3.89 (d = 3) and ran
    away in 1-D; the expected std is sqrt(9 / (1 - eps / 18)) = 3.0002 (eps = 0.0025).
    Tolerance 0.12: four standard errors of the std of 2,000 d values
    (3 / sqrt(2 * 2000 d) <= 0.047) plus the bias."""
    g = gaussian(EDM(), d, 6.75)
    x = 3.0 * np.asarray(jax.random.normal(jax.random.key(1), (2000, d)))
    grid = np.array([1.5, 1.5 * (1 - 1e-6)])
    for c in range(50):
        x, info = pc(
            g, jax.random.key(100 + c), (2000, d), grid=grid, x_T=x, snr=0.0236, n_corrector=100
        )
    x = np.asarray(x, np.float64)
    eps = 2 * (0.0236 * 1.5) ** 2
    want = np.sqrt(9.0 / (1 - eps / 18.0))
    assert info["nfe"] == 101
    assert abs(x.std() - want) < 4 * 3 / np.sqrt(2 * 2000 * d) + 1e-3, x.std()


@pytest.mark.parametrize(
    "process,t,data_var,snr",
    [(EDM(), 1.0, 0.5, 0.55), (VP(), 0.3, 0.8, 0.5)],
    ids=["edm", "vp"],
)
def test_corrector_alone_has_the_exact_ula_stationary_variance(process, t, data_var, snr):
    """1-D, process frame: p_t = N(0, v) with v = alpha^2 data_var + sigma^2. A large
    step (eps / v ~ 0.2-0.4) makes ULA's bias v / (1 - eps / (2 v)) many standard errors
    away from v, so this checks the step size and the update, not only "close to v"."""
    a = float(process.alpha(jnp.float32(t)))
    s = float(process.sigma(jnp.float32(t)))
    v = a**2 * data_var + s**2
    eps = float(corrector_step_size(process, t, snr=snr))
    assert eps == pytest.approx(2 * (snr * s) ** 2, rel=1e-6)
    want = v / (1 - eps / (2 * v))
    assert want / v - 1 > 0.1  # the bias is visible
    n = 20000
    x0 = np.sqrt(v) * np.asarray(jax.random.normal(jax.random.key(3), (n, 1)))
    x = langevin_corrector(
        gaussian(process, 1, data_var), jax.random.key(4), x0, t, step_size=eps, n_steps=300
    )
    var = float(np.var(np.asarray(x, np.float64)))
    se = want * np.sqrt(2 / n)
    assert abs(var - want) < 5 * se, (var, want, v)


def test_corrector_alone_matches_a_float64_loop_with_the_documented_keys():
    """Example b, step j: x <- x + eps s(x) + sqrt(2 eps) normal(fold_in(fold_in(key,
    first_index + b), j)); s from the covariance directly (EDM, t = 0.7, 2-D)."""
    cov = np.array([[1.0, 0.3], [0.3, 0.4]])
    mean = np.array([0.2, -0.5])
    t, eps, n_steps, first = 0.7, 0.05, 4, 3
    with jax.enable_x64(True):
        src = GaussianScore.from_covariance(EDM(), mean, cov)
    x0 = np.random.default_rng(0).normal(size=(2, 2))
    key = jax.random.key(9)
    got = langevin_corrector(
        src, key, x0, t, step_size=eps, n_steps=n_steps, first_index=first, float64=True
    )
    c = cov + t**2 * np.eye(2)
    for b in range(2):
        x = x0[b]
        for j in range(n_steps):
            with jax.enable_x64(True):
                k = jax.random.fold_in(jax.random.fold_in(key, first + b), j)
                z = np.asarray(jax.random.normal(k, (2,), jnp.float64))
            x = x - eps * np.linalg.solve(c, x - mean) + np.sqrt(2 * eps) * z
        np.testing.assert_allclose(np.asarray(got)[b], x, rtol=1e-10, atol=1e-12)


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_a_chain_does_not_depend_on_its_batch():
    g = gaussian(EDM(), 3, 2.0)
    x0 = np.asarray(jax.random.normal(jax.random.key(0), (6, 3))) * 2.0
    key = jax.random.key(5)
    whole = langevin_corrector(g, key, x0, 1.2, step_size=0.1, n_steps=20)
    half = langevin_corrector(g, key, x0[3:], 1.2, step_size=0.1, n_steps=20, first_index=3)
    np.testing.assert_allclose(np.asarray(half), np.asarray(whole)[3:], rtol=1e-6, atol=1e-6)
    # other chains far out (large scores) change nothing for chain 0
    other = x0.copy()
    other[1:] *= 100.0
    moved = langevin_corrector(g, key, other, 1.2, step_size=0.1, n_steps=20)
    np.testing.assert_allclose(np.asarray(moved)[0], np.asarray(whole)[0], rtol=1e-6, atol=1e-6)
    # and through pc: a sample does not depend on the batch it was drawn in
    grid = edm_grid(6)
    a, _ = pc(g, key, (6, 3), grid=grid, n_corrector=3)
    b, _ = pc(g, key, (2, 3), grid=grid, n_corrector=3, first_index=4)
    np.testing.assert_allclose(np.asarray(b), np.asarray(a)[4:], rtol=1e-5, atol=1e-5)


def _n_eqns(jaxpr) -> int:
    """Equations of a jaxpr, counting those of every nested jaxpr (scan bodies, jit calls)."""
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    total += _n_eqns(inner)
    return total


def test_program_size_does_not_grow_with_the_corrector_count():
    """n_corrector is a lax.scan length, not a Python loop: the traced program for 200
    corrector steps is as large as for 2 (so it compiles as fast)."""
    g = gaussian(VP(), 3, 1.0)
    key = jax.random.key(0)

    def size(fn):
        return _n_eqns(jax.make_jaxpr(fn)().jaxpr)

    pcs = [
        size(functools.partial(lambda k: pc(g, key, (4, 3), grid=edm_grid(5), n_corrector=k)[0], k))
        for k in (2, 200)
    ]
    alone = [
        size(
            functools.partial(
                lambda k: langevin_corrector(
                    g, key, np.zeros((4, 3)), 0.5, step_size=0.01, n_steps=k
                ),
                k,
            )
        )
        for k in (2, 200)
    ]
    assert pcs[0] == pcs[1] and alone[0] == alone[1], (pcs, alone)
    assert pcs[0] > 20  # a real program was counted


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(step_size=0.0), "step_size"),
        (dict(step_size=np.inf), "step_size"),
        (dict(step_size=-1.0), "step_size"),
        (dict(n_steps=-1), "n_steps"),
        (dict(n_steps=2.0), "n_steps"),
        (dict(t=5.0), "t"),
        (dict(t="1"), "t"),
        (dict(x=np.zeros((2, 4))), "x"),
        (dict(first_index=-1), "first_index"),
    ],
)
def test_corrector_rejects_bad_input(kw, field):
    args = dict(x=np.zeros((2, 3)), t=0.5, step_size=0.01, n_steps=2)
    args.update(kw)
    g = gaussian(VP(), 3, 1.0)
    with pytest.raises(ValueError, match=f"^{field} must"):
        langevin_corrector(g, jax.random.key(0), args.pop("x"), args.pop("t"), **args)
