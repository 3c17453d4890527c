"""Cas-DM's loss against closed forms: with the exact Tweedie pair on Gaussian data its two
terms are EDM's Bayes risk (an integral over the log-normal noise draw, by scipy), an offset
on module 2 adds ``lambda(sigma) b^2``, the metric enters with its weight; the metric never
reaches module 1's gradient; bad settings and non-cascade sources are refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cascade_nets import ExactPair, random_cascade
from flax import nnx
from scipy import integrate, stats

from scorelib.objectives import CascadeLoss, cascade_denoisers
from scorelib.processes import EDM
from scorelib.scores import NetworkScore

S, SD, D = 0.8, 0.5, 4  # data N(0, S^2 I_D); the loss's sigma_data
PM, PS = -1.2, 1.2


def exact_pair(b=0.0):
    return ExactPair(S, b)


def expected(fn):
    """E over ln sigma ~ N(PM, PS^2) of fn(sigma), by quadrature."""
    f = lambda z: fn(np.exp(PM + PS * z)) * stats.norm.pdf(z)  # noqa: E731
    return integrate.quad(f, -12, 12, limit=200)[0]


def lam(sigma):
    return (sigma**2 + SD**2) / (sigma * SD) ** 2


def within(values, target, k=4.0):
    v = np.asarray(values, np.float64)
    se = v.std(ddof=1) / np.sqrt(v.size)
    assert abs(v.mean() - target) < k * se, (v.mean(), target, se)


def test_exact_pair_gives_the_bayes_risk_and_an_offset_adds_lambda_b2():
    n, b = 200_000, 0.1
    x0 = S * jax.random.normal(jax.random.key(0), (n, D))
    metric = lambda x, y: jnp.mean((x - y) ** 2, axis=-1)  # noqa: E731
    obj = CascadeLoss(
        process=EDM(), metric=metric, metric_weight=3.0, P_mean=PM, P_std=PS, sigma_data=SD
    )
    losses, aux = obj.example_losses(exact_pair(b=b), x0, jax.random.key(1))
    bayes = lambda s: S**2 * s**2 / (S**2 + s**2)  # noqa: E731  per-dimension posterior var
    within(aux["first"], expected(lambda s: lam(s) * bayes(s)))
    within(aux["second"], expected(lambda s: lam(s) * (bayes(s) + b**2)))
    within(aux["metric"], expected(lambda s: bayes(s) + b**2))
    np.testing.assert_allclose(
        losses, aux["first"] + aux["second"] + 3.0 * aux["metric"], rtol=1e-6
    )
    # with the data's own std as sigma_data the weight makes each term exactly 1 per sigma
    unit = CascadeLoss(process=EDM(), metric=None, metric_weight=0.0, sigma_data=S)
    _, aux = unit.example_losses(exact_pair(), x0, jax.random.key(2))
    within(aux["first"], 1.0)


def small_cascade():
    return random_cascade(SD, scale=0.2)


def test_the_metric_never_reaches_module_one():
    g, p = small_cascade()
    x0 = jnp.tanh(jax.random.normal(jax.random.key(4), (16, 4, 4, 1)))
    metric = lambda x, y: jnp.sum(jnp.abs(x - y) ** 1.5, axis=(1, 2, 3))  # noqa: E731

    def grads(weight):
        obj = CascadeLoss(
            process=EDM(), metric=metric if weight else None, metric_weight=weight, sigma_data=SD
        )
        f = lambda q: obj(
            NetworkScore(process=EDM(), graphdef=g, params=q, sigma_data=SD),  # noqa: E731
            x0,
            jax.random.key(5),
        )[0]
        return jax.grad(f)(p)

    a, b = grads(0.0), grads(5.0)
    same = jax.tree.map(lambda u, v: bool(jnp.array_equal(u, v)), a["first"], b["first"])
    assert all(jax.tree.leaves(same))
    moved = jax.tree.map(lambda u, v: float(jnp.max(jnp.abs(u - v))), a["second"], b["second"])
    assert max(jax.tree.leaves(moved)) > 1e-4


def test_cascade_denoisers_reads_the_network():
    g, p = small_cascade()
    src = NetworkScore(process=EDM(), graphdef=g, params=p, sigma_data=SD)
    x = jax.random.normal(jax.random.key(6), (2, 4, 4, 1))
    t = jnp.asarray([0.2, 1.5])
    d1, d2 = cascade_denoisers(src, x, t)
    net = nnx.merge(g, p)
    c_in = 1 / jnp.sqrt(t**2 + SD**2)
    e1, e2 = net.denoisers(x * c_in[:, None, None, None], jnp.log(t) / 4)
    np.testing.assert_allclose(d1, e1, rtol=1e-6)
    np.testing.assert_allclose(d2, e2, rtol=1e-6)


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(metric=None, metric_weight=1.0), "objective.metric_weight must be 0 with objective"),
        (
            dict(metric=lambda x, y: x, metric_weight=0.0),
            r"objective.metric_weight must be > 0 with a metric \(for the cascade without one, "
            "objective.metric=none",
        ),
        (dict(metric=None, metric_weight=-1.0), "objective.metric_weight must be a number"),
        (dict(metric=None, metric_weight=0.0, P_std=0.0), "objective.P_std"),
        (dict(metric=None, metric_weight=0.0, reduce="max"), "objective.reduce"),
    ],
)
def test_bad_settings_are_refused(kw, needle):
    with pytest.raises(ValueError, match=needle):
        CascadeLoss(process=EDM(), **kw)


def test_sources_that_are_not_this_cascade_are_refused():
    obj = CascadeLoss(process=EDM(), metric=None, metric_weight=0.0, sigma_data=SD)
    x0 = jnp.zeros((2, 4, 4, 1))
    g, p = small_cascade()
    other = NetworkScore(process=EDM(), graphdef=g, params=p, sigma_data=0.7)
    with pytest.raises(ValueError, match="model.sigma_data must be the preconditioning's"):
        obj(other, x0, jax.random.key(0))
    with pytest.raises(ValueError, match=r"model must be a scorelib.nets.Cascade"):
        obj(object.__new__(type("Plain", (), {})), x0, jax.random.key(0))
