"""The divergence estimators (scorelib/divergence.py) against the exact trace of the Jacobian.

The reference is ``jax.jacfwd`` of a small random tanh network at one point: the estimators'
mean is its trace within Monte-Carlo error, and their variance is the closed-form variance
of one probe's ``b^T J b`` divided by the number of probes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.divergence import exact_divergence, probe_vectors, value_and_divergence

D = 5


def small_net(seed=0):
    """``f(x) = W2 tanh(W1 x + c) + 0.5 x``: a non-linear, non-symmetric field on R^5."""
    rng = np.random.default_rng(seed)
    w1 = jnp.asarray(rng.normal(size=(8, D)) / math.sqrt(D), jnp.float32)
    c = jnp.asarray(rng.normal(size=8), jnp.float32)
    w2 = jnp.asarray(rng.normal(size=(D, 8)) / math.sqrt(8), jnp.float32)
    return lambda x: w2 @ jnp.tanh(w1 @ x + c) + 0.5 * x


def one_probe_variance(j, noise):
    """Variance of ``b^T J b`` for one probe: Rademacher ``sum_{i<j} (J_ij + J_ji)^2``,
    Gaussian ``|J + J^T|_F^2 / 2`` (written from the definitions, not the library)."""
    s = j + j.T
    if noise == "rademacher":
        return float(sum(s[i, k] ** 2 for i in range(D) for k in range(i + 1, D)))
    return float(0.5 * np.sum(s**2))


@pytest.mark.parametrize("estimator,step", [("jvp", None), ("fd", 1e-3)])
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_unbiased_and_variance_falls_with_probes(estimator, step):
    fn = small_net()
    x = jnp.asarray([0.3, -0.8, 1.1, 0.0, -0.2], jnp.float32)
    jac = np.asarray(jax.jacfwd(fn)(x), np.float64)
    trace = float(np.trace(jac))
    assert float(exact_divergence(fn, x)) == pytest.approx(trace, rel=1e-6)
    n = 4000
    keys = jax.random.split(jax.random.key(0), n)
    for noise in ("rademacher", "gaussian"):
        for probes in (1, 8):

            def est(k, p=probes, nz=noise):
                return value_and_divergence(
                    fn, x, probe_vectors(k, p, D, nz), estimator=estimator, step=step
                )

            out, div = jax.vmap(est)(keys)
            div = np.asarray(div, np.float64)
            np.testing.assert_allclose(np.asarray(out[0]), np.asarray(fn(x)), rtol=1e-6)
            se = div.std() / math.sqrt(n)
            assert abs(div.mean() - trace) < 4 * se + 2e-3, (noise, probes, div.mean(), trace)
            # the probes are averaged, not summed: one probe's variance over P
            var = one_probe_variance(jac, noise) / probes
            assert div.var() == pytest.approx(var, rel=0.15), (noise, probes)


def test_finite_difference_bias_is_of_order_step():
    """One Rademacher probe: the finite difference tends to the exact ``b^T J b`` as the step
    shrinks (bias ~ step times the curvature), in float64."""
    with jax.enable_x64(True):
        fn = small_net()
        x = jnp.asarray([0.3, -0.8, 1.1, 0.0, -0.2], jnp.float64)
        b = jnp.asarray([[1.0, -1.0, -1.0, 1.0, 1.0]], jnp.float64)
        exact = float(value_and_divergence(fn, x, b)[1])
        errs = [
            abs(float(value_and_divergence(fn, x, b, estimator="fd", step=h)[1]) - exact)
            for h in (1e-2, 1e-3, 1e-4)
        ]
    assert errs[0] > 5 * errs[1] > 25 * errs[2] > 0, errs  # first order: ~10x per decade


def test_any_shape_and_each_probe_is_exact_for_a_linear_field():
    """A point and probes of shape ``[2, 3]`` and ``fn = A x`` per row: each probe's term is
    ``sum_r b_r^T A b_r`` (numpy); for a diagonal field every Rademacher probe gives the
    trace exactly."""
    a = np.random.default_rng(1).normal(size=(3, 3))
    fn = lambda x: x @ jnp.asarray(a.T, jnp.float32)  # noqa: E731  (each row x_r -> A x_r)
    x = jnp.ones((2, 3))
    b = jax.random.rademacher(jax.random.key(2), (4, 2, 3), jnp.float32)
    out, div = value_and_divergence(fn, x, b)
    np.testing.assert_allclose(np.asarray(out), np.asarray(fn(x)))
    bn = np.asarray(b, np.float64)
    ref = np.mean([sum(bp[r] @ a @ bp[r] for r in range(2)) for bp in bn])
    assert float(div) == pytest.approx(ref, rel=1e-5)
    c = jnp.asarray([[0.5, -1.0, 2.0], [1.5, 0.25, -0.5]], jnp.float32)
    assert float(value_and_divergence(lambda x: c * x, x, b)[1]) == pytest.approx(2.75, rel=1e-6)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"estimator": "exact"}, r"estimator must be one of \['jvp', 'fd'\]; got 'exact'"),
        ({"estimator": "jvp", "step": 1e-3}, r"step is an option of estimator='fd' only"),
        ({"estimator": "fd"}, r"step must be a number in \(0.0, inf\); got None"),
        ({"estimator": "fd", "step": 0.0}, r"step must be a number in \(0.0, inf\); got 0.0"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        value_and_divergence(lambda x: x, jnp.ones(2), jnp.ones((1, 2)), **kwargs)
