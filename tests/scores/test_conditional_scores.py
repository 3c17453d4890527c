"""Class-conditional sources against independent computations (issue 36).

* ``Labels``: the label of example ``i`` by its global index, against Python loops over the
  documented rules (a table read at ``(i // repeats) % M``; a uniform class from
  ``fold_in(fold_in(key, i), LABEL_SALT)``), under ``jax.jit`` with a traced first index too.
* ``PerClassScore``: each label gives its class's source; the null label gives the pooled
  law (a ``MixtureScore`` with the class weights for Gaussian classes, one ``EmpiricalScore``
  over all points for training-set classes); the exact classifier ``log p_t(c | x)`` against
  scipy, and its input gradient against the difference of the conditional and unconditional
  scores (``notes/conditioning-anchors.md``, section 4).
* ``log_prob`` of ``GaussianScore`` (full and rank-deficient) and ``EmpiricalScore`` against
  scipy in float64 for VE, VP and EDM at a scalar and a ``[batch]`` time.
"""

from __future__ import annotations

import closed_forms as cf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from scorelib.keys import LABEL_SALT
from scorelib.processes import EDM, VE, VP
from scorelib.scores import (
    EmpiricalScore,
    GaussianScore,
    Labels,
    MixtureScore,
    PerClassScore,
    ScoreSource,
)

PROCESSES = [VE(), VP(), EDM()]
KEY = jax.random.key(7)


def times(p, b):
    """A scalar time and ``[b]`` times spread over the process's range (float64 numpy)."""
    if isinstance(p, EDM):
        return 0.7, np.geomspace(0.05, 20.0, b)
    return 0.4, np.linspace(0.1, 0.9, b)


def per_example(p, t, b):
    """``(alpha, sigma)`` as ``[b]`` float64 arrays for a scalar or ``[b]`` time."""
    a, s = cf.alpha_sigma(p, t)
    return np.broadcast_to(a, (b,)), np.broadcast_to(s, (b,))


def mixture_setup(rng, d=2, k=3):
    """``k`` Gaussian classes in ``d`` dimensions (classes 1 and 2 overlap), their weights."""
    means = rng.normal(size=(k, d)) * 1.5
    means[2] = means[1] + 0.3
    covs = []
    for _ in range(k):
        a = rng.normal(size=(d, d))
        covs.append(a @ a.T / d + 0.1 * np.eye(d))
    w = rng.uniform(0.5, 1.5, size=k)
    return means, np.stack(covs), w / w.sum()


class NoLogProb(ScoreSource):
    """A source without ``log_prob``: the standard normal's denoiser at VE level s."""

    def denoiser(self, x, t):
        a = self.process.alpha(t)
        s = self.process.ve_sigma(t)
        return x / a / (1 + s**2)


# ----------------------------------------------------------------------------- Labels
@pytest.mark.parametrize("repeats", [1, 3])
def test_table_labels_by_global_index(repeats):
    values = [2, 0, 0, 3, 1]  # with a repeat and the null label (3)
    rule = Labels.given(values, 3, repeats=repeats)

    @jax.jit  # a traced first index
    def take(first):
        return rule.take(KEY, first, 7), [rule.take(KEY, first + b, 1) for b in range(7)]

    for first in (0, 5, 13):
        want = [values[(i // repeats) % len(values)] for i in range(first, first + 7)]
        np.testing.assert_array_equal(rule.take(KEY, first, 7), want)
        together, alone = take(first)
        assert together.dtype == jnp.int32
        np.testing.assert_array_equal(together, want)
        np.testing.assert_array_equal(np.concatenate(alone), want)  # each example alone


def test_uniform_labels_are_drawn_from_each_example_key():
    k = 5
    rule = Labels.uniform(k)

    @jax.jit
    def by_hand(i):
        kb = jax.random.fold_in(jax.random.fold_in(KEY, i), LABEL_SALT)
        return jax.random.randint(kb, (), 0, k)

    @jax.jit
    def draws(first):
        return (
            rule.take(KEY, first, 7),
            rule.take(KEY, 0, 2500),
            rule.take(jax.random.key(8), 0, 2500),
        )

    for first in (0, 11):
        want = [int(by_hand(i)) for i in range(first, first + 7)]
        np.testing.assert_array_equal(draws(first)[0], want)
    _, many, other = map(np.asarray, draws(0))
    counts = np.bincount(many, minlength=k + 1)
    assert counts[k] == 0 and many.min() >= 0  # never the null label
    # uniform: chi-square with k - 1 degrees of freedom, below its 1e-4 upper quantile
    chi2 = np.sum((counts[:k] - 500.0) ** 2 / 500.0)
    assert chi2 < stats.chi2.ppf(1 - 1e-4, k - 1), counts
    assert np.mean(other == many) < 0.3  # another key draws other labels (0.2 expected)


def test_constant_and_balanced_labels():
    rule = Labels.balanced(3, repeats=2)

    @jax.jit
    def take(first):
        return (
            Labels.constant(2, 4).take(KEY, first, 5),
            Labels.constant(4, 4).take(KEY, first, 3),
            rule.take(KEY, first, 8),
        )

    for first in (0, 1, 4, 17):
        const, null, bal = map(np.asarray, take(first))
        np.testing.assert_array_equal(const, [2] * 5)
        np.testing.assert_array_equal(null, [4] * 3)  # the null label: unconditional
        want = [(i // 2) % 3 for i in range(first, first + 8)]
        np.testing.assert_array_equal(bal, want)
        # any 3 * 2 consecutive examples hold each class twice
        np.testing.assert_array_equal(np.bincount(bal[:6], minlength=3), 2)


@pytest.mark.parametrize(
    "values",
    [[0, 4], [-1], [1.5], [np.nan], [np.inf], [1e30], [], ["a"], [True, False]],
    ids=repr,
)
def test_bad_labels_are_refused(values):
    with pytest.raises(ValueError, match="sampler.labels"):
        Labels.given(values, 3)
    src = PerClassScore.create([NoLogProb(process=EDM())] * 3)
    with pytest.raises(ValueError, match="sampler.labels"):
        src.conditioned(values)


def test_bad_label_rules_are_refused():
    src = PerClassScore.create([NoLogProb(process=EDM())] * 3)
    for label in (5, -1):
        with pytest.raises(ValueError, match="sampler.labels"):
            src.conditioned(label)
    with pytest.raises(ValueError, match="sampler.labels"):
        src.conditioned(Labels.uniform(4))  # a rule of another number of classes
    with pytest.raises(ValueError, match="sampler.labels_repeats"):
        Labels.given([0, 1], 3, repeats=0)
    with pytest.raises(ValueError, match="model.num_classes"):
        Labels.balanced(0)


def test_binding_gives_each_example_its_label():
    g = GaussianScore.from_covariance(EDM(), np.zeros(2), np.eye(2))
    src = PerClassScore.create([g] * 3)
    rule = Labels.given([2, 0, 1, 3], 3)
    cond = src.conditioned(rule)
    bound = jax.jit(lambda s, first: s.for_examples(KEY, 6, first))(cond, 3)
    np.testing.assert_array_equal(bound.labels, [3, 2, 0, 1, 3, 2])  # i = 3 .. 8
    x = jnp.ones((6, 2))
    with pytest.raises(ValueError, match="bound before"):  # a rule never bound
        cond.denoiser(x, 1.0)
    with pytest.raises(ValueError, match="one label per example"):
        src.with_labels(jnp.zeros(4, jnp.int32)).denoiser(x, 1.0)
    # unbound and unconditioned: the null label
    np.testing.assert_array_equal(src.bound_labels(6), [3] * 6)


# ----------------------------------------------------------------------------- PerClassScore
def f32(values):
    """A list of arrays as float32 JAX arrays."""
    return [jnp.asarray(v, jnp.float32) for v in values]


def noisy_points(rng, p, t, centres, spread=1.0):
    """``alpha centres + (spread alpha + sigma) z`` per example, and ``(alpha, sigma)``."""
    b = centres.shape[0]
    a, s = per_example(p, t, b)
    z = rng.normal(size=centres.shape)
    return a[:, None] * centres + (spread * a + s)[:, None] * z, a, s


def test_each_label_gives_its_class_and_the_null_label_the_mixture():
    """A batch of mixed labels: class k's rows equal ``sources[k]``; null rows equal the
    ``MixtureScore`` of the classes with the class weights (a different route: responsibility
    weighted scores there, posterior-weighted denoisers here). The unbound source is the
    null label; its log-density is the mixture's. VP (alpha != 1), a scalar and a ``[batch]``
    time."""
    p = VP()
    rng = np.random.default_rng(1)
    means, covs, w = mixture_setup(rng)
    srcs = [GaussianScore.from_covariance(p, m, c) for m, c in zip(means, covs, strict=True)]
    pc = PerClassScore.create(srcs, prior=w * 10)  # unnormalised weights
    np.testing.assert_allclose(np.exp(pc.log_prior), w, rtol=1e-6)
    mix = MixtureScore.create(p, w, means, covs)
    labels = np.array([0, 1, 2, 3, 3, 2, 1, 3])
    b = labels.shape[0]

    @jax.jit
    def run(pc, srcs, mix, xs, ts):
        out = []
        for x, t in zip(xs, ts, strict=True):
            out.append(
                dict(
                    given=(pc.denoiser_given(x, t, labels), pc.score_given(x, t, labels)),
                    each=[(s.denoiser(x, t), s.score(x, t)) for s in (*srcs, mix)],
                    unbound=pc.denoiser(x, t),
                    log_prob=(pc.log_prob(x, t), mix.log_prob(x, t)),
                )
            )
        return out

    ts = times(p, b)
    xs = [noisy_points(rng, p, t, means[[0, 1, 2, 0, 1, 2, 1, 2]])[0] for t in ts]
    out = jax.tree.map(np.asarray, run(pc, srcs, mix, f32(xs), f32(ts)))
    for t, o in zip(ts, out, strict=True):
        s = per_example(p, t, b)[1]
        (got_d, got_s), each = o["given"], o["each"]
        for i, k in enumerate(labels):
            ref_d, ref_s = each[k][0][i], each[k][1][i]
            np.testing.assert_allclose(got_d[i], ref_d, rtol=1e-5, atol=1e-5 * (1 + s[i]))
            tol = 1e-4 * float(np.linalg.norm(ref_s)) + 1e-4
            np.testing.assert_allclose(got_s[i], ref_s, atol=tol)
        np.testing.assert_allclose(o["unbound"], each[3][0], rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(*o["log_prob"], rtol=1e-5, atol=1e-4)


def test_the_null_of_training_set_classes_is_the_pooled_training_set():
    """Classes of 3 and 8 points with prior = class counts: the null label is the exact
    score of all 11 points (one ``EmpiricalScore``). VP (alpha != 1), a ``[batch]`` time
    (each class's label gives its class's source: the test above)."""
    p = VP()
    rng = np.random.default_rng(2)
    parts = [rng.normal(size=(n, 3)) + 2.0 * rng.normal(size=3) for n in (3, 8)]
    pc = PerClassScore.create([EmpiricalScore.create(p, q) for q in parts], prior=[3, 8])
    pooled = EmpiricalScore.create(p, np.concatenate(parts))
    t = times(p, 6)[1]
    x = noisy_points(rng, p, t, parts[1][:6], 0.3)[0]

    @jax.jit
    def run(pc, pooled, x, t):
        return pc.denoiser_given(x, t, pc.null_labels(x.shape[0])), pooled.denoiser(x, t)

    den, ref = run(pc, pooled, *f32([x, t]))
    np.testing.assert_allclose(den, ref, rtol=1e-4, atol=1e-4)
    # the same source from the labelled points (classes weighted by their counts)
    labels = np.repeat([0, 1], [3, 8])
    fitted = PerClassScore.from_labelled(
        lambda q: EmpiricalScore.create(p, q), np.concatenate(parts), labels, 2
    )
    np.testing.assert_allclose(np.exp(fitted.log_prior), [3 / 11, 8 / 11], rtol=1e-6)
    np.testing.assert_allclose(run(fitted, pooled, *f32([x, t]))[0], ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="at least two examples of every class"):
        PerClassScore.from_labelled(
            lambda q: EmpiricalScore.create(p, q), np.concatenate(parts), labels, 3
        )


def test_exact_classifier_against_scipy_and_its_gradient():
    """``log p_t(c | x) = log pi_c + log N_c - logsumexp_j (log pi_j + log N_j)`` by scipy;
    ``grad_x log p_t(c | x) = s_c - s_null`` (closed forms, section 4). VP, a scalar and a
    ``[batch]`` time (the classes' log-densities are checked for VE, VP and EDM below)."""
    p = VP()
    rng = np.random.default_rng(3)
    means, covs, w = mixture_setup(rng)
    srcs = [GaussianScore.from_covariance(p, m, c) for m, c in zip(means, covs, strict=True)]
    pc = PerClassScore.create(srcs, prior=w)
    labels = np.array([0, 1, 2, 1, 2, 0])
    b = labels.shape[0]

    @jax.jit
    def run(pc, xs, ts):
        out = []
        for x, t in zip(xs, ts, strict=True):
            grad = jax.grad(lambda y, t=t: jnp.sum(pc.class_log_prob(y, t, labels)))(x)
            diff = pc.score_given(x, t, labels) - pc.score_given(x, t, pc.null_labels(b))
            out.append((pc.class_log_prob(x, t, labels), grad, diff))
        return out

    ts = times(p, b)
    xs = [noisy_points(rng, p, t, means[[1, 2, 1, 2, 0, 0]], 0.5)[0] for t in ts]
    for xn, t, o in zip(xs, ts, run(pc, f32(xs), f32(ts)), strict=True):
        a, s = per_example(p, t, b)
        lj = np.array(
            [
                [
                    np.log(w[k])
                    + stats.multivariate_normal(
                        a[i] * means[k], a[i] ** 2 * covs[k] + s[i] ** 2 * np.eye(2)
                    ).logpdf(xn[i])
                    for k in range(3)
                ]
                for i in range(b)
            ]
        )
        want = lj[np.arange(b), labels] - special.logsumexp(lj, axis=1)
        got, grad, diff = map(np.asarray, o)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(grad, diff, rtol=1e-3, atol=2e-3 * np.max(np.abs(diff)))


@pytest.mark.parametrize("p", PROCESSES, ids=repr)
def test_log_probs_against_scipy(p):
    """``log N(x; alpha mu, alpha^2 Sigma + sigma^2 I)`` (full covariance; rank 2 of 3 with an
    isotropic residual) and ``log (1/n) sum_i N(x; alpha x_i, sigma^2 I)``, in float64 scipy,
    at a scalar and a ``[batch]`` time."""
    rng = np.random.default_rng(4)
    d, b = 3, 5
    mean = rng.normal(size=d)
    a_ = rng.normal(size=(d, d))
    cov = a_ @ a_.T / d + 0.1 * np.eye(d)
    full = GaussianScore.from_covariance(p, mean, cov)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    lam, rv = np.array([0.5, 2.0]), 0.05
    low = GaussianScore(
        process=p,
        mean=jnp.asarray(mean, jnp.float32),
        eigvecs=jnp.asarray(q[:, :2], jnp.float32),
        eigvals=jnp.asarray(lam, jnp.float32),
        residual_var=jnp.asarray(rv, jnp.float32),
        data_shape=(d,),
    )
    cov_low = q[:, :2] @ np.diag(lam) @ q[:, :2].T + rv * (np.eye(d) - q[:, :2] @ q[:, :2].T)
    pts = rng.normal(size=(7, d))
    emp = EmpiricalScore.create(p, pts)
    ts = times(p, b)
    xs = [noisy_points(rng, p, t, np.tile(mean, (b, 1)))[0] for t in ts]
    run = jax.jit(
        lambda srcs, xs, ts: [[s.log_prob(x, t) for s in srcs] for x, t in zip(xs, ts, strict=True)]
    )
    out = run((full, low, emp), f32(xs), f32(ts))
    for xn, t, (lp_full, lp_low, lp_emp) in zip(xs, ts, out, strict=True):
        a, s = per_example(p, t, b)
        for got, c in ((lp_full, cov), (lp_low, cov_low)):
            want = [
                stats.multivariate_normal(
                    a[i] * mean, a[i] ** 2 * c + s[i] ** 2 * np.eye(d)
                ).logpdf(xn[i])
                for i in range(b)
            ]
            assert got.shape == (b,)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        want = [
            special.logsumexp(
                [
                    stats.multivariate_normal(a[i] * q_, s[i] ** 2 * np.eye(d)).logpdf(xn[i])
                    for q_ in pts
                ]
            )
            - np.log(len(pts))
            for i in range(b)
        ]
        np.testing.assert_allclose(lp_emp, want, rtol=1e-5, atol=1e-3)


def test_bad_construction_is_refused():
    g = GaussianScore.from_covariance(EDM(), np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match="sources"):
        PerClassScore.create([])
    with pytest.raises(ValueError, match="sources"):
        PerClassScore.create([g, "not a source"])
    with pytest.raises(ValueError, match="sources"):
        PerClassScore.create([g, GaussianScore.from_covariance(VP(), np.zeros(2), np.eye(2))])
    with pytest.raises(ValueError, match="sources"):
        PerClassScore.create([g, GaussianScore.from_covariance(EDM(), np.zeros(3), np.eye(3))])
    for prior in ([1.0], [1.0, -1.0], [1.0, np.nan], [0.0, 1.0]):
        with pytest.raises(ValueError, match="prior"):
            PerClassScore.create([g, g], prior=prior)
    with pytest.raises(ValueError, match="null"):
        PerClassScore.create([g, g], null="mixture")
    with pytest.raises(ValueError, match="null"):
        PerClassScore.create(
            [g, g], null=GaussianScore.from_covariance(VP(), np.zeros(2), np.eye(2))
        )
    # classes without log-densities have no null label and no exact classifier
    pc = PerClassScore.create([NoLogProb(process=EDM())] * 2)
    assert not pc.allows_null
    x = jnp.ones((2, 2))
    with pytest.raises(ValueError, match="sources"):
        pc.class_log_prob(x, 1.0, jnp.asarray([0, 1]))
    with pytest.raises(ValueError, match="labels"):
        pc.denoiser(x, 1.0)
    # ... unless the null is given
    pc = PerClassScore.create([NoLogProb(process=EDM())] * 2, null=g)
    np.testing.assert_allclose(pc.denoiser(x, 1.0), g.denoiser(x, 1.0))
