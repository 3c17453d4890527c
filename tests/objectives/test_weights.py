"""Loss weights (scorelib/objectives/weights.py) against closed forms written from the papers
(``tests/closed_forms.py`` for the processes), and their use by the objectives."""

import closed_forms
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.data.targets import gmm_1d
from scorelib.objectives import DSM, MixedScoreMatching, weights
from scorelib.processes import EDM, VE, VP, SubVP

PROCS = [VE(), VP(), SubVP(beta_min=0.2, beta_max=5.0), EDM()]


def _t(p, n=6):
    return np.linspace(p.t_min, p.t_max, n)


@pytest.mark.parametrize("p", PROCS, ids=repr)
def test_process_weights_match_closed_forms(p):
    t = _t(p)
    tj = jnp.asarray(t, jnp.float32)
    a, s = closed_forms.alpha_sigma(p, t)
    _, g2 = closed_forms.f_g2(p, t)
    np.testing.assert_allclose(weights.sigma2_weight(process=p, t=tj), s**2, rtol=2e-4)
    np.testing.assert_allclose(weights.likelihood_weight(process=p, t=tj), g2, rtol=5e-4)
    np.testing.assert_array_equal(weights.unit_weight(t=tj), np.ones(t.size))
    np.testing.assert_allclose(weights.alpha2_weight(process=p, t=tj), a**2, rtol=2e-5)
    # relative: 1 / (sigma_d^2 E[s_i^2]) with E[s_i^2] = 1 / (alpha^2 sd^2 + sigma^2), the
    # per-coordinate mean squared score of N(0, sd^2 I) data noised to t.
    sd = 0.7
    mean_sq_score = 1.0 / (a**2 * sd**2 + s**2)
    np.testing.assert_allclose(
        weights.relative_weight(process=p, t=tj, sigma_d=sd),
        1.0 / (sd**2 * mean_sq_score),
        rtol=5e-4,
    )
    k = np.linspace(0.0, 1.0, t.size)
    np.testing.assert_allclose(
        weights.kappa_weight(process=p, t=tj, kappa=jnp.asarray(k, jnp.float32)),
        k * a**2 + (1 - k) * s**2,
        rtol=5e-4,
    )
    for name, ref in (("sigma2", s**2), ("likelihood", g2), ("none", np.ones(t.size))):
        np.testing.assert_allclose(weights.dsm_weight(name, process=p, t=tj), ref, rtol=5e-4)
    # fisher: alpha^2 / c_out_score^2 with c_out_score written from its definition
    # (EDM's c_out / v^2 times v / sqrt(v^2 + sf^2), v = sigma / alpha)
    sf = 0.3
    v = s / a
    c_out_score = (v * sd / np.sqrt(v**2 + sd**2)) / v**2 * v / np.sqrt(v**2 + sf**2)
    np.testing.assert_allclose(
        weights.fisher_weight(process=p, t=tj, sigma_data=sd, sigma_fisher=sf),
        a**2 / c_out_score**2,
        rtol=5e-4,
    )


@pytest.mark.parametrize("sigma_data", [0.5, 1.3])
def test_edm_weight_makes_lambda_c_out_squared_one(sigma_data):
    """Karras et al. 2022, Table 1: c_out = sigma sigma_data / sqrt(sigma^2 + sigma_data^2)
    and lambda = 1 / c_out^2."""
    s = np.geomspace(0.002, 80.0, 9)
    c_out = s * sigma_data / np.sqrt(s**2 + sigma_data**2)
    got = weights.edm_weight(ve_sigma=jnp.asarray(s), sigma_data=sigma_data)
    np.testing.assert_allclose(got, 1.0 / c_out**2, rtol=1e-5)


def test_weights_are_keyword_only_and_names_are_checked():
    with pytest.raises(TypeError):
        weights.sigma2_weight(VP(), jnp.ones(2))  # positional: refused
    with pytest.raises(TypeError):
        weights.edm_weight(jnp.ones(2), 0.5)
    with pytest.raises(ValueError, match=r"objective\.weighting must be one of"):
        weights.dsm_weight("alpha2", process=VP(), t=jnp.ones(2))


@pytest.mark.parametrize("p", PROCS, ids=repr)
def test_objectives_use_these_weights(p):
    t = jnp.asarray(_t(p), jnp.float32)
    for w in ("sigma2", "likelihood", "none"):
        np.testing.assert_array_equal(
            DSM(p, weighting=w).weight(t), weights.dsm_weight(w, process=p, t=t)
        )
        np.testing.assert_array_equal(
            MixedScoreMatching(p, gmm_1d(), weighting=w).weight(t),
            weights.dsm_weight(w, process=p, t=t),
        )
