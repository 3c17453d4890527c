"""The rectified-flow convention: alpha = 1 - t, sigma = t, t = 1 - s (flow time s)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.processes.rectified import RectifiedFlow, flow_time, flow_velocity, process_time
from scorelib.scores import EmpiricalScore


def test_coefficients_and_inverses():
    p = RectifiedFlow()
    t = np.array([1e-3, 0.1, 0.5, 0.9, 0.999], np.float32).astype(np.float64)
    np.testing.assert_allclose(np.asarray(p.alpha(t)), 1 - t, atol=1e-7)  # float32 t
    np.testing.assert_allclose(np.asarray(p.sigma(t)), t, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(p.ve_sigma(t)), t / (1 - t), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(p.log_snr(t)), 2 * np.log((1 - t) / t), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(p.t_of_ve_sigma(t / (1 - t))), t, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(p.t_of_log_snr(2 * np.log((1 - t) / t))), t, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(flow_time(t)), 1 - t)
    np.testing.assert_allclose(np.asarray(process_time(flow_time(t))), t, atol=1e-7)


def test_f_and_g2_are_the_marginal_identities():
    """f = d log alpha / dt and g^2 = d sigma^2/dt - 2 f sigma^2, by autodiff of (1-t, t)."""
    p = RectifiedFlow()
    with jax.enable_x64(True):
        for t in [0.1, 0.4, 0.8]:
            f = jax.grad(lambda u: jnp.log(1.0 - u))(t)
            g2 = jax.grad(lambda u: u**2)(t) - 2 * f * t**2
            np.testing.assert_allclose(float(p.f(jnp.float64(t))), f, rtol=1e-12)
            np.testing.assert_allclose(float(p.g2(jnp.float64(t))), g2, rtol=1e-12)


def test_velocity_from_the_denoiser_is_the_score_form():
    """v = (D - x) / (1 - s) equals (x + (1 - s) score) / s (Scarvelis et al., Sec. 3)."""
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        src = EmpiricalScore.create(RectifiedFlow(), rng.normal(size=(30, 3)), chunk=8)
        s = jnp.array([0.2, 0.6, 0.95])
        x = jnp.asarray(rng.normal(size=(3, 3)))
        t = process_time(s)
        v = flow_velocity(x, s, src.denoiser(x, t))
        ref = (x + (1 - s)[:, None] * src.score(x, t)) / s[:, None]
        np.testing.assert_allclose(np.asarray(v), np.asarray(ref), rtol=1e-10)


@pytest.mark.parametrize("kw,field", [({"eps_min": 0.0}, "eps_min"), ({"eps_max": 1.0}, "eps_max")])
def test_bad_fields_name_the_field(kw, field):
    with pytest.raises(ValueError, match=f"process.{field}"):
        RectifiedFlow(**kw)
