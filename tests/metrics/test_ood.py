"""MSMA (multiscale score norms, a Gaussian mixture, NLL as OOD score, AUROC) on an analytic
Gaussian source: the norms against a brute-force loop and the closed form, the same norms
under two processes, a known-good separation (shifted and scaled data: AUROC near 1) and a
known-bad one (held-out in-distribution data: AUROC near 0.5), one-line errors."""

from __future__ import annotations

import closed_forms
import numpy as np
import pytest

from scorelib.metrics import (
    auroc,
    fit_norm_density,
    msma,
    ood_scores,
    score_norms,
    select_components,
)
from scorelib.processes import EDM, VP
from scorelib.scores import GaussianScore

D = 6
SIGMAS = [0.05, 0.2, 0.8, 3.0]


@pytest.fixture(scope="module")
def gaussian():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(D, D)) * 0.5
    cov = a @ a.T + 0.1 * np.eye(D)
    mu = rng.normal(size=D) * 0.3
    return mu, cov, rng


def _closed_form_norms(x, mu, cov, sigmas):
    """``|| (cov + s^2 I)^{-1} (x - mu) ||`` per example and level (the VE-frame score)."""
    out = np.empty((len(x), len(sigmas)))
    for j, s in enumerate(sigmas):
        out[:, j] = np.linalg.norm(np.linalg.solve(cov + s**2 * np.eye(D), (x - mu).T), axis=0)
    return out


@pytest.mark.parametrize("process", [EDM(), VP()], ids=lambda p: type(p).__name__)
def test_norms_equal_a_brute_force_loop_and_the_closed_form(gaussian, process):
    mu, cov, rng = gaussian
    src = GaussianScore.from_covariance(process, mu, cov, data_shape=(2, 3))
    x = rng.multivariate_normal(mu, cov, 5).astype(np.float32)
    got = score_norms(src, x.reshape(5, 2, 3), SIGMAS, batch_size=2)
    loop = np.empty((5, len(SIGMAS)))
    for i in range(5):
        for j, s in enumerate(SIGMAS):
            t = float(closed_forms.t_of_ve_sigma(process, s))
            a = float(closed_forms.alpha_at_ve_sigma(process, s))
            score = np.asarray(src.score(a * x[i].reshape(1, 2, 3), np.float32(t)), np.float64)
            loop[i, j] = a * np.sqrt(np.sum(score**2))
    np.testing.assert_allclose(got, loop, rtol=2e-4)
    np.testing.assert_allclose(got, _closed_form_norms(x, mu, cov, SIGMAS), rtol=2e-4)


def test_known_good_and_known_bad_separations(gaussian):
    mu, cov, rng = gaussian
    src = GaussianScore.from_covariance(EDM(), mu, cov)

    def draw(n):
        return rng.multivariate_normal(mu, cov, n).astype(np.float32)

    x_fit, x_in = draw(1000), draw(1000)
    sd = np.sqrt(np.diag(cov))
    out = msma(
        src,
        x_fit,
        x_in,
        {
            "shifted": draw(1000) + 1.5 * sd,
            "scaled": mu + 3.0 * (draw(1000) - mu),
            "in": draw(1000),
        },
        SIGMAS,
        n_components=2,
    )
    assert out["auroc"]["shifted"] > 0.95, out["auroc"]
    assert out["auroc"]["scaled"] > 0.95, out["auroc"]
    # under the null the AUROC of 1000 vs 1000 has sd sqrt(2001 / (12e6)) = 0.013
    assert abs(out["auroc"]["in"] - 0.5) < 0.06, out["auroc"]
    assert out["nll_in"].shape == (1000,)


def test_nll_is_that_of_the_unstandardised_vectors():
    """One component, full covariance: the NLL is the Gaussian fit's, written in numpy."""
    rng = np.random.default_rng(3)
    f = rng.normal(size=(500, 3)) @ np.array([[1.0, 0.0, 0.0], [0.5, 2.0, 0.0], [0.1, 0.3, 50.0]])
    dens = fit_norm_density(f, n_components=1)
    m, c = f.mean(axis=0), np.cov(f.T, bias=True)
    r = f[:7] - m
    want = 0.5 * (np.einsum("bi,ij,bj->b", r, np.linalg.inv(c), r) + np.linalg.slogdet(c)[1])
    want += 1.5 * np.log(2 * np.pi)
    np.testing.assert_allclose(ood_scores(dens, f[:7]), want, rtol=1e-4)


def test_auroc_is_the_probability_that_an_ood_input_scores_higher():
    s_in = np.array([0.1, 0.4, 0.4, 0.9])
    s_out = np.array([0.4, 1.0, 0.05])
    pairs = [(o > i) + 0.5 * (o == i) for o in s_out for i in s_in]  # Mann-Whitney, ties 1/2
    assert auroc(s_in, s_out) == pytest.approx(np.mean(pairs))
    assert auroc(s_in, s_in + 10) == 1.0 and auroc(s_in + 10, s_in) == 0.0


def _mixture(n_per, centres, seed):
    rng = np.random.default_rng(seed)
    return np.concatenate([c + rng.normal(size=(n_per, len(c))) for c in centres])


def test_cross_validation_finds_the_number_of_well_separated_components():
    """Three unit clusters 12 apart are chosen as 3 among 1..6; one Gaussian as 1 (the
    selection can fail both ways: a larger mixture always fits its training folds better)."""
    three = _mixture(150, [(0.0, 0.0), (12.0, 0.0), (0.0, 12.0)], 0)
    assert select_components(three, range(1, 7), folds=5)["n_components"] == 3
    one = _mixture(450, [(0.0, 0.0)], 1) @ np.array([[1.0, 0.4], [0.0, 3.0]])
    assert select_components(one, range(1, 7), folds=5)["n_components"] == 1


def test_cross_validation_scores_equal_a_brute_force_loop_over_the_folds():
    """GridSearchCV's mean held-out log-likelihood, recomputed with a loop over the folds."""
    from sklearn.mixture import GaussianMixture
    from sklearn.model_selection import KFold

    f = _mixture(60, [(0.0, 0.0, 0.0), (4.0, 1.0, -2.0)], 2) * np.array([1.0, 30.0, 0.1])
    got = select_components(f, [1, 2, 3], folds=4, seed=5)
    z = (f - f.mean(axis=0)) / f.std(axis=0)
    want = {}
    for k in (1, 2, 3):
        folds = KFold(4, shuffle=True, random_state=5).split(z)
        ll = [GaussianMixture(k, random_state=5).fit(z[tr]).score(z[te]) for tr, te in folds]
        want[k] = float(np.mean(ll))
    assert got["cv_loglik"].keys() == want.keys()
    np.testing.assert_allclose(list(got["cv_loglik"].values()), list(want.values()), rtol=1e-10)
    assert got["n_components"] == max(want, key=want.get)


def _one_line_error(match, fn, *args, **kw):
    with pytest.raises(ValueError, match=match) as e:
        fn(*args, **kw)
    assert "\n" not in str(e.value)


def test_bad_inputs_give_one_line_errors_naming_the_argument(gaussian):
    mu, cov, _ = gaussian
    src = GaussianScore.from_covariance(EDM(), mu, cov)
    x = np.zeros((4, D), np.float32)
    _one_line_error("^sigmas must be at least 2", score_norms, src, x, [0.5])
    _one_line_error("^sigmas must be > 0", score_norms, src, x, [0.0, 1.0])
    _one_line_error("^sigmas must be > 0", score_norms, src, x, [-0.5, 1.0])
    _one_line_error("^sigmas must be distinct", score_norms, src, x, [0.5, 0.5])
    _one_line_error("^sigmas must be inside", score_norms, src, x, [0.5, 200.0])
    _one_line_error("^sigmas must be a 1-D", score_norms, src, x, "0.5")
    _one_line_error("^x must", score_norms, src, np.zeros(D), SIGMAS)
    _one_line_error("^batch_size must", score_norms, src, x, SIGMAS, batch_size=0)
    _one_line_error("^x_in must", msma, src, x, np.zeros((4, D + 1)), {"a": x}, SIGMAS)
    _one_line_error(r"^x_out\['a'\] must", msma, src, x, x, {"a": np.zeros((4, 2, 3))}, SIGMAS)
    _one_line_error("^x_out must", msma, src, x, x, {}, SIGMAS)
    f = np.random.default_rng(0).normal(size=(10, 3))
    _one_line_error("^norms must", fit_norm_density, f[:, :1])
    _one_line_error("^n_components must", fit_norm_density, f, n_components=11)
    _one_line_error("^covariance_type must", fit_norm_density, f, covariance_type="banded")
    _one_line_error("^norms must", ood_scores, fit_norm_density(f, n_components=1), f[:, :2])
    _one_line_error("^candidates must", select_components, f, [2, 10], folds=2)  # 5 per fold
    _one_line_error("^folds must", select_components, f, [1, 2], folds=1)
    _one_line_error("^scores_in must", auroc, [], [1.0])
    _one_line_error("^scores_out must", auroc, [1.0], [np.nan])
