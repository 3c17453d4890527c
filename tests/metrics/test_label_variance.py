"""Monte-Carlo label variances against their closed forms for Gaussian data.

For ``x_0 ~ N(mu, C)``, ``A = alpha^2 C + sigma^2 I`` and a label
``u = kappa u_tsm + (1 - kappa) u_dsm`` (``u_tsm = -C^-1 (x_0 - mu) / alpha``,
``u_dsm = -eps / sigma``, independent), ``E[u | x_t] = s_t`` gives
``V = E||u||^2 - E||s_t||^2 = kappa^2 tr C^-1 / alpha^2 + (1 - kappa)^2 d / sigma^2 - tr A^-1``.
"""

import jax
import numpy as np
import pytest

from scorelib.data.targets import GaussianMixtureTarget
from scorelib.metrics import label_variance
from scorelib.objectives import MixedScoreMatching
from scorelib.processes import EDM, VP

MU = np.array([0.5, -1.0, 0.2, 0.0])
COV = np.diag([1.0, 0.5, 0.2, 2.0]) + 0.1
D = MU.size
N = 20_000


def target(cov=COV):
    return GaussianMixtureTarget.create([1.0], [MU], [cov], name="gauss4d")


TARGET = target()  # one object: targets are static (hashed by identity), compiled once


def closed_form(process, ve_sigma, kappa, cov=COV):
    t = process.t_of_ve_sigma(ve_sigma)
    a, s = float(process.alpha(t)), float(process.sigma(t))
    a_inv = np.linalg.inv(a**2 * cov + s**2 * np.eye(D))
    e_u2 = kappa**2 * np.trace(np.linalg.inv(cov)) / a**2 + (1 - kappa) ** 2 * D / s**2
    return e_u2 - np.trace(a_inv)


def run(process, tgt, ve_sigma, objectives, seed=0):
    x0 = tgt.sample(jax.random.key(100 + seed), N)
    return label_variance(
        objectives,
        tgt.noisy_score(process),
        x0,
        process.t_of_ve_sigma(ve_sigma),
        jax.random.key(seed),
    )


@pytest.mark.parametrize("process", [EDM(), VP()], ids=["EDM", "VP"])
@pytest.mark.parametrize("ve_sigma", [0.05, 0.5, 3.0])
def test_dsm_tsm_and_mixed_labels_match_the_closed_forms(process, ve_sigma):
    tgt = TARGET
    objs = {
        "dsm": MixedScoreMatching(process, tgt, kappa="dsm"),
        "tsm": MixedScoreMatching(process, tgt, kappa="tsm"),
        "mix": MixedScoreMatching(process, tgt, kappa="log_linear", sigma_lo=0.01, sigma_hi=10),
    }
    per, pure = run(process, tgt, ve_sigma, objs)
    kappa = float(objs["mix"].kappa_of(ve_sigma))
    assert 0.1 < kappa < 0.9
    for got, k in [
        (per["dsm"], 0.0),
        (per["tsm"], 1.0),
        (per["mix"], kappa),
        (pure["u_dsm"], 0.0),
        (pure["u_tsm"], 1.0),
    ]:
        exact = closed_form(process, ve_sigma, k)
        assert abs(got["mean"] - exact) < 5 * got["se"], (k, got, exact)
        assert got["se"] < 0.05 * exact  # the check above is not vacuous
    assert per["dsm"] == pure["u_dsm"] and per["tsm"] == pure["u_tsm"]


def test_tsm_label_variance_vanishes_and_dsm_grows_like_d_over_sigma2():
    process, tgt = EDM(), TARGET
    objs = {"tsm": MixedScoreMatching(process, tgt, kappa="tsm")}
    sigmas = (1e-3, 1e-2, 1e-1)
    tsm, dsm = [], []
    for ve_sigma in sigmas:
        _, pure = run(process, tgt, ve_sigma, objs)
        tsm.append(pure["u_tsm"]["mean"])
        dsm.append(pure["u_dsm"]["mean"] * ve_sigma**2 / D)
        exact = closed_form(process, ve_sigma, 1.0)
        assert abs(pure["u_tsm"]["mean"] - exact) < 5 * pure["u_tsm"]["se"]
    # V_tsm ~ sigma^2 tr C^-2 -> 0; V_dsm sigma^2 / d -> 1
    assert tsm[0] / tsm[1] == pytest.approx(1e-2, rel=0.05)
    assert tsm[0] == pytest.approx(
        1e-6 * np.trace(np.linalg.inv(COV) @ np.linalg.inv(COV)), rel=0.05
    )
    np.testing.assert_allclose(dsm, 1.0, rtol=0.05)


def test_gaussian_optimal_label_is_exact_for_isotropic_data():
    process, tgt = EDM(), target(cov=0.7 * np.eye(D))
    objs = {"opt": MixedScoreMatching(process, tgt, kappa="gaussian_optimal")}
    per, pure = run(process, tgt, 0.4, objs)
    assert per["opt"]["mean"] < 1e-9 * pure["u_dsm"]["mean"]


def test_common_points_for_every_objective_set_and_errors():
    process, tgt = EDM(), TARGET
    a = {"tsm": MixedScoreMatching(process, tgt, kappa="tsm")}
    b = {"dsm": MixedScoreMatching(process, tgt, kappa="dsm"), **a}
    assert run(process, tgt, 0.2, a)[1] == run(process, tgt, 0.2, b)[1]
    assert run(process, tgt, 0.2, a)[1] != run(process, tgt, 0.2, a, seed=1)[1]
    other = {"x": MixedScoreMatching(process, target(), kappa="tsm"), **a}
    with pytest.raises(ValueError, match=r"objectives\['tsm'\] must be an objective with the same"):
        run(process, tgt, 0.2, other)
    x0 = tgt.sample(jax.random.key(0), 8)
    with pytest.raises(ValueError, match=r"t must be a scalar or have shape \[batch=8\]"):
        label_variance(a, tgt.noisy_score(process), x0, np.ones(3), jax.random.key(0))
    with pytest.raises(ValueError, match="objectives must be a non-empty mapping"):
        label_variance({}, tgt.noisy_score(process), x0, 0.1, jax.random.key(0))
