"""The asymmetry of a score's Jacobian (QCSBM): zero on gradient fields, exact on a linear
non-conservative field, Hutchinson unbiased with the closed-form variance of a quadratic form
falling as 1 / probes, gradients equal to those of the closed form 2(|J|^2 - tr J^2)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from vector_fields import GradientNet, LinearField, random_matrix, tiny_net

from scorelib.processes import EDM, VP
from scorelib.scores import GaussianScore
from scorelib.scores.jacobian import example_probes, jacobian_asymmetry

D = 5
Z = 4.5  # standard errors allowed
_asym = jax.jit(jacobian_asymmetry, static_argnames="form")  # one compile, not op by op


def test_exact_on_a_linear_field_equals_the_closed_form():
    a = random_matrix(1, D)
    src = LinearField(process=EDM(), A=jnp.asarray(a, jnp.float32))
    x = jnp.asarray(np.random.default_rng(2).normal(size=(3, D)), jnp.float32)
    asym, frob = _asym(src, x, 0.7)
    # |A - A^T|_F^2 = 2 (|A|_F^2 - tr(A^2)), two ways in numpy float64
    assert np.allclose(asym, np.sum((a - a.T) ** 2), rtol=1e-5)
    assert np.allclose(asym, 2 * (np.sum(a**2) - np.trace(a @ a)), rtol=1e-5)
    assert np.allclose(frob, np.sum(a**2), rtol=1e-5)


def test_zero_on_gradient_fields_and_positive_on_a_rotational_one():
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(4, 2, 3)), jnp.float32)  # data_shape (2, 3): d = 6
    t = jnp.asarray([0.1, 0.5, 1.0, 2.0], jnp.float32)
    grad_net = GradientNet(
        process=EDM(),
        W=jnp.asarray(rng.normal(size=(8, 6)), jnp.float32),
        v=jnp.asarray(rng.normal(size=8), jnp.float32),
    )
    cov = np.cov(rng.normal(size=(6, 40)))
    gauss = GaussianScore.from_covariance(VP(), np.zeros(6), cov, data_shape=(2, 3))
    for src in (grad_net, gauss):
        asym, frob = _asym(src, x, t)
        assert np.all(np.asarray(asym) <= 1e-10 * np.asarray(frob)), (type(src).__name__, asym)
        eps = example_probes(jax.random.key(0), 4, 3, 6)
        for form in ("skew", "paper"):
            est, _ = _asym(src, x, t, eps=eps, form=form)
            assert np.all(np.abs(np.asarray(est)) <= 1e-5 * np.asarray(frob)), (form, est)
    net = tiny_net(4, d=6)  # known-bad: a non-gradient field is far from 0
    asym, frob = _asym(net, x, t)
    assert np.all(np.asarray(asym) > 0.05 * np.asarray(frob))


def _quadratic_form_matrix(a, form):
    """The symmetric ``M`` with ``estimate = v^T M v`` for one probe ``v``."""
    if form == "skew":
        k = a - a.T
        return k.T @ k
    m = 2 * a @ a.T - 2 * a @ a
    return (m + m.T) / 2


def _variance(m, noise):
    """Var(v^T M v): Rademacher 2 sum_{i != j} M_ij^2, Gaussian 2 |M|_F^2."""
    off = m - np.diag(np.diag(m))
    return 2 * np.sum(off**2) if noise == "rademacher" else 2 * np.sum(m**2)


@pytest.mark.parametrize("noise", ["rademacher", "gaussian"])
@pytest.mark.parametrize("form", ["skew", "paper"])
def test_hutchinson_is_unbiased_with_the_closed_form_variance_falling_as_one_over_probes(
    form, noise
):
    a = random_matrix(5, D, k_scale=0.3)
    src = LinearField(process=EDM(), A=jnp.asarray(a, jnp.float32))
    exact = np.sum((a - a.T) ** 2)
    var1 = _variance(_quadratic_form_matrix(a, form), noise)
    n = 20_000
    x = jnp.zeros((n, D), jnp.float32)
    for probes in (1, 4):
        eps = example_probes(jax.random.key(probes), n, probes, D, noise)
        est = np.asarray(_asym(src, x, 0.3, eps=eps, form=form)[0], np.float64)
        se = est.std(ddof=1) / math.sqrt(n)
        assert abs(est.mean() - exact) < Z * se, (probes, est.mean(), exact, se)
        # the sample variance of n draws is within ~6% (4 sd at these kurtoses) of var1 / probes
        assert est.var(ddof=1) == pytest.approx(var1 / probes, rel=0.12), probes


def test_skew_form_has_the_smaller_variance_near_a_gradient_field():
    """J = S + K with small K: Var(skew) = O(|K|^4) but Var(paper) = O(|K|^2 |S|^2)."""
    for k_scale in (0.3, 0.03):
        a = random_matrix(6, D, k_scale=k_scale)
        v_skew = _variance(_quadratic_form_matrix(a, "skew"), "rademacher")
        v_paper = _variance(_quadratic_form_matrix(a, "paper"), "rademacher")
        assert v_skew < v_paper
    assert v_paper / v_skew > 100  # at k_scale = 0.03


def _closed_form_penalty(net, x, t):
    """mean_b 2 (|J_b|_F^2 - tr(J_b^2)), J_b by jax.jacfwd of the example's own field."""

    def one(xb, tb):
        jac = jax.jacfwd(lambda z: net.score(z[None], tb[None])[0])(xb)
        return 2.0 * (jnp.sum(jac**2) - jnp.trace(jac @ jac))

    return jnp.mean(jax.vmap(one)(x, t))


def test_gradients_through_the_penalty_equal_those_of_the_closed_form():
    net = tiny_net(7)
    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.normal(size=(3, D)), jnp.float32)
    t = jnp.asarray([0.2, 0.9, 1.7], jnp.float32)
    # probes sqrt(d) e_i, i = 1..d: the Hutchinson mean is then the exact trace (both forms)
    basis = jnp.broadcast_to(math.sqrt(D) * jnp.eye(D, dtype=jnp.float32), (3, D, D))
    want = jax.jit(jax.grad(lambda n: _closed_form_penalty(n, x, t)))(net)
    for eps, form in ((None, "skew"), (basis, "skew"), (basis, "paper")):
        got = jax.jit(
            jax.grad(
                lambda n, e=eps, f=form: jnp.mean(jacobian_asymmetry(n, x, t, eps=e, form=f)[0])
            )
        )(net)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert np.allclose(g, w, rtol=2e-4, atol=1e-5 * np.abs(w).max()), form
        assert any(np.abs(w).max() > 1e-2 for w in jax.tree.leaves(want))  # not vacuous


def test_an_example_does_not_depend_on_its_batch():
    net = tiny_net(9)
    rng = np.random.default_rng(10)
    x = jnp.asarray(rng.normal(size=(7, D)), jnp.float32)
    t = jnp.asarray(rng.uniform(0.1, 2.0, size=7), jnp.float32)
    eps = example_probes(jax.random.key(3), 7, 2, D)
    whole = _asym(net, x, t, eps=eps)[0]
    tail = example_probes(jax.random.key(3), 5, 2, D, first_index=2)
    assert np.array_equal(np.asarray(tail), np.asarray(eps[2:]))
    part = _asym(net, x[2:], t[2:], eps=tail)[0]
    assert np.allclose(whole[2:], part, rtol=1e-6)
    single = _asym(net, x[4:5], t[4], eps=eps[4:5])[0]
    assert np.allclose(whole[4], single[0], rtol=1e-6)


def test_bad_inputs_name_the_argument():
    net = tiny_net(0)
    x = jnp.zeros((2, D))
    with pytest.raises(ValueError, match="^t must"):
        jacobian_asymmetry(net, x, jnp.zeros(3))
    with pytest.raises(ValueError, match="^eps must"):
        jacobian_asymmetry(net, x, 0.5, eps=jnp.zeros((2, 1, D + 1)))
    with pytest.raises(ValueError, match="^form must"):
        jacobian_asymmetry(net, x, 0.5, form="sym")
    with pytest.raises(ValueError, match="^probes must"):
        example_probes(jax.random.key(0), 2, 0, D)
    with pytest.raises(ValueError, match="^noise must"):
        example_probes(jax.random.key(0), 2, 1, D, "uniform")
