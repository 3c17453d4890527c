"""The asymmetry metric (QCSBM's Asym / NAsym) of a score source on noised data: the closed
form of a linear field, ~0 for gradient fields and far from 0 for a rotational net, the
Hutchinson estimate within its standard error of the exact value, chunking invariance."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from vector_fields import GradientNet, LinearField, random_matrix, tiny_net

from scorelib.metrics import score_asymmetry
from scorelib.processes import EDM, VP
from scorelib.scores import GaussianScore

D = 4


def test_linear_field_closed_form_and_the_share_of_its_antisymmetric_part():
    a = random_matrix(0, D, k_scale=0.5)
    src = LinearField(process=VP(), A=jnp.asarray(a, jnp.float32))
    x0 = np.random.default_rng(1).normal(size=(6, D)).astype(np.float32)
    out = score_asymmetry(src, x0, 0.4, jax.random.key(0))
    k = (a - a.T) / 2
    assert out["asymmetry"] == pytest.approx(np.sum((a - a.T) ** 2), rel=1e-5)
    assert out["frobenius"] == pytest.approx(np.sum(a**2), rel=1e-5)
    assert out["relative"] == pytest.approx(np.sum(k**2) / np.sum(a**2), rel=1e-5)
    assert out["stderr"] == pytest.approx(0.0, abs=1e-5 * out["asymmetry"])  # same J everywhere
    assert out["per_example"]["asymmetry"].shape == (6,)


def test_separates_gradient_fields_from_a_rotational_net():
    rng = np.random.default_rng(2)
    x0 = rng.normal(size=(16, 2, 2)).astype(np.float32)
    cov = np.cov(rng.normal(size=(4, 30)))
    good = {
        "gaussian": GaussianScore.from_covariance(EDM(), np.zeros(4), cov, data_shape=(2, 2)),
        "grad_net": GradientNet(
            process=EDM(),
            W=jnp.asarray(rng.normal(size=(6, 4)), jnp.float32),
            v=jnp.asarray(rng.normal(size=6), jnp.float32),
        ),
    }
    for name, src in good.items():
        out = score_asymmetry(src, x0, 0.5, jax.random.key(1))
        assert out["relative"] < 1e-10, (name, out["relative"])
    bad = score_asymmetry(tiny_net(3, d=4), x0, 0.5, jax.random.key(1))
    assert bad["relative"] > 0.05


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_hutchinson_within_its_standard_error_of_the_exact_value_and_chunking_invariant():
    net = tiny_net(4, d=D)
    x0 = np.random.default_rng(5).normal(size=(400, D)).astype(np.float32)
    t = np.random.default_rng(6).uniform(0.1, 1.5, size=400).astype(np.float32)
    key = jax.random.key(7)
    exact = score_asymmetry(net, x0, t, key)
    for form in ("skew", "paper"):
        est = score_asymmetry(net, x0, t, key, method="hutchinson", probes=2, form=form)
        # paired by example: the estimate's error about each example's exact value
        err = est["per_example"]["asymmetry"] - exact["per_example"]["asymmetry"]
        se = err.std(ddof=1) / np.sqrt(err.size)
        assert abs(err.mean()) < 4.5 * se, (form, err.mean(), se)
        assert np.any(np.abs(err) > 1e-3 * exact["asymmetry"])  # it is an estimate
    chunked = score_asymmetry(net, x0, t, key, method="hutchinson", probes=2, batch_size=150)
    whole = score_asymmetry(net, x0, t, key, method="hutchinson", probes=2)
    np.testing.assert_allclose(
        chunked["per_example"]["asymmetry"], whole["per_example"]["asymmetry"], rtol=1e-5
    )


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(method="jvp"), "method"),
        (dict(probes=2), "probes"),  # a Hutchinson option with the exact method
        (dict(method="hutchinson", probes=0), "probes"),
        (dict(method="hutchinson", noise="uniform"), "noise"),
        (dict(method="hutchinson", form="sym"), "form"),
        (dict(batch_size=0), "batch_size"),
        (dict(first_index=-1), "first_index"),
    ],
)
def test_bad_options_name_the_argument(kw, field):
    with pytest.raises(ValueError, match=field):
        score_asymmetry(
            tiny_net(0, d=D), np.zeros((3, D), np.float32), 0.5, jax.random.key(0), **kw
        )


def test_bad_shapes_name_the_argument():
    net = tiny_net(0, d=D)
    with pytest.raises(ValueError, match="^x0 must"):
        score_asymmetry(net, np.zeros(D, np.float32), 0.5, jax.random.key(0))
    with pytest.raises(ValueError, match="^t must"):
        score_asymmetry(net, np.zeros((3, D), np.float32), np.ones(2), jax.random.key(0))
