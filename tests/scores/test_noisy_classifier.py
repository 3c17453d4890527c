"""NoisyClassifier: normalised class probabilities, its input gradient against float64 finite
differences, EDM's input coefficients in the VE frame (one classifier for every process),
its errors naming the field, classifier guidance with it, and the guidance-gradient
estimator separating the exact classifier from a useless one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scorelib.metrics import classifier_gradient_error, noisy_classifier_accuracy
from scorelib.nets import ClassifierMLP, edm_precond
from scorelib.processes import EDM, VP
from scorelib.scores import MixtureScore, NoisyClassifier, PerClassScore
from scorelib.scores.guidance import ClassifierGuidance

jax.config.update("jax_enable_x64", False)

K = 4
SIGMA_DATA = 0.7


def _classifier(process, data_shape=(3,), seed=0) -> NoisyClassifier:
    """A classifier whose zero-initialised output layer is replaced by a random one (a fresh
    one gives uniform probabilities, which would hide a missing normalisation)."""
    net = ClassifierMLP(data_shape, K, width=16, depth=2, emb_dim=8, rngs=nnx.Rngs(seed))
    net.out.kernel[...] = jax.random.normal(jax.random.key(seed + 1), net.out.kernel.shape)
    return NoisyClassifier.create(process, net, sigma_data=SIGMA_DATA)


def _x(shape, n=5, seed=2):
    return jax.random.normal(jax.random.key(seed), (n, *shape)) * 1.2


@pytest.mark.parametrize("shape", [(3,), (2, 2, 1)], ids=str)
def test_class_probabilities_are_normalised_and_pick_each_label(shape):
    clf = _classifier(VP(), shape)
    x, t = _x(shape), jnp.array([0.05, 0.2, 0.5, 0.8, 1.0])
    lp = clf.log_probs(x, t)
    assert lp.shape == (5, K) and clf.num_classes == K
    np.testing.assert_allclose(jax.nn.logsumexp(lp, axis=1), 0.0, atol=1e-6)
    for k in range(K):
        got = clf.class_log_prob(x, t, jnp.full((5,), k))
        np.testing.assert_allclose(got, lp[:, k], rtol=1e-6)
    assert np.all(np.asarray(lp) < 0)


def test_logits_are_the_network_at_edm_inputs_in_the_ve_frame():
    """``logits(x, t) = F(c_in(sigma) x / alpha; ln(sigma) / 4)`` with ``sigma = ve_sigma(t)``,
    so a VP classifier at ``(x, t)`` equals the same network under EDM at ``(x / alpha,
    sigma)`` (``p_t(c | x) = p_ve(c | x / alpha)``)."""
    vp = _classifier(VP())
    x, t = _x((3,)), jnp.array([0.1, 0.3, 0.5, 0.7, 0.9])
    alpha, sigma = VP().alpha(t)[:, None], VP().ve_sigma(t)
    c = edm_precond(sigma, SIGMA_DATA)
    net = nnx.merge(vp.graphdef, vp.params)
    by_hand = net(c.c_in[:, None] * x / alpha, jnp.log(sigma) / 4)
    np.testing.assert_allclose(vp.logits(x, t), by_hand, rtol=1e-5, atol=1e-6)
    edm = vp.with_process(EDM())
    np.testing.assert_allclose(vp.logits(x, t), edm.logits(x / alpha, sigma), rtol=1e-4, atol=1e-5)
    # a scalar time is every example's
    np.testing.assert_allclose(vp.logits(x, 0.3), vp.logits(x, jnp.full((5,), 0.3)), rtol=1e-6)


def test_input_gradient_matches_float64_finite_differences():
    """``grad_x log p_t(c | x)`` (autodiff of the batch sum, the guidance term) against central
    differences of the classifier in float64, coordinate by coordinate."""
    clf = _classifier(VP())
    x, t = _x((3,), n=3), jnp.array([0.15, 0.4, 0.9])
    labels = jnp.array([0, 2, 3])
    grad = jax.grad(lambda y: jnp.sum(clf.class_log_prob(y, t, labels)))(x)
    with jax.enable_x64(True):
        clf64 = clf.replace(params=jax.tree.map(lambda p: jnp.asarray(p, jnp.float64), clf.params))
        x64, t64 = jnp.asarray(x, jnp.float64), jnp.asarray(t, jnp.float64)
        h = 1e-5
        fd = np.zeros(x.shape)
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                e = jnp.zeros_like(x64).at[i, j].set(h)
                up = clf64.class_log_prob(x64 + e, t64, labels)[i]
                down = clf64.class_log_prob(x64 - e, t64, labels)[i]
                fd[i, j] = float(up - down) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-3, atol=1e-5)


def test_bad_input_is_refused_naming_the_field():
    clf = _classifier(EDM())
    with pytest.raises(ValueError, match="x must have shape"):
        clf.logits(jnp.zeros((2, 4)), 0.5)
    with pytest.raises(ValueError, match="t"):
        clf.logits(jnp.zeros((2, 3)), jnp.ones(3))
    for kwargs, field in [
        ({"width": 0}, "classifier.width"),
        ({"depth": 0}, "classifier.depth"),
        ({"emb_dim": 7}, "classifier.emb_dim"),
        ({"embedding": "sine"}, "classifier.embedding"),
        ({"emb_scale": -1.0}, "classifier.emb_scale"),
        ({"norm": "batch"}, "classifier.norm"),
    ]:
        with pytest.raises(ValueError, match=field):
            ClassifierMLP((3,), K, **kwargs, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="classifier.num_classes"):
        ClassifierMLP((3,), 1, rngs=nnx.Rngs(0))


def test_a_fresh_classifier_is_uniform_with_zero_gradient():
    clf = NoisyClassifier.create(EDM(), ClassifierMLP((3,), K, rngs=nnx.Rngs(0)), SIGMA_DATA)
    x = _x((3,))
    np.testing.assert_allclose(clf.log_probs(x, 0.5), -np.log(K), rtol=1e-6)
    grad = jax.grad(lambda y: jnp.sum(clf.class_log_prob(y, 0.5, jnp.zeros(5, jnp.int32))))(x)
    assert np.all(np.asarray(grad) == 0)


def test_classifier_guidance_adds_the_scaled_input_gradient_to_the_prior():
    """``ClassifierGuidance`` (scorelib/scores/guidance.py) takes a NoisyClassifier: the guided
    score is the prior's plus ``s`` times the classifier's input gradient."""
    proc = VP()
    clf = _classifier(proc)
    prior = MixtureScore.create(proc, [1.0], np.zeros((1, 3)), np.eye(3)[None])
    guided = ClassifierGuidance.create(prior, clf, scale=2.5)
    labels = jnp.array([0, 1, 2, 3, 1])
    x, t = _x((3,)), 0.4
    got = guided.with_labels(labels).score(x, t)
    grad = jax.grad(lambda y: jnp.sum(clf.class_log_prob(y, t, labels)))(x)
    np.testing.assert_allclose(got, prior.score(x, t) + 2.5 * grad, rtol=1e-5, atol=1e-6)
    assert guided.num_classes == K


def _mixture(proc):
    means = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    covs = np.array([0.36 * np.eye(2)] * 3)
    comps = [MixtureScore.create(proc, [1.0], means[k : k + 1], covs[k : k + 1]) for k in range(3)]
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 2000).astype(np.int32)
    x = (means[labels] + 0.6 * rng.standard_normal((2000, 2))).astype(np.float32)
    return PerClassScore.create(comps), x, labels


def test_gradient_error_separates_the_exact_classifier_from_useless_ones():
    """The exact classifier scores 0 at every level; a fresh one (zero input gradient) exactly
    1; a randomly initialised network with a random head, far from the exact gradient, about
    1 or more; each with a standard error that is small against the gap."""
    proc = EDM()
    exact, x, labels = _mixture(proc)
    sigmas = [0.05, 0.5, 2.0]
    key = jax.random.key(0)
    good = classifier_gradient_error(exact, exact, x, labels, sigmas, key)
    assert np.all(good["error"] == 0) and good["sigma"].tolist() == sigmas
    assert np.all(good["exact_mean_square"] > 0)
    fresh = NoisyClassifier.create(proc, ClassifierMLP((2,), 3, rngs=nnx.Rngs(1)), 1.0)
    flat = classifier_gradient_error(fresh, exact, x, labels, sigmas, key)
    np.testing.assert_allclose(flat["error"], 1.0)
    net = ClassifierMLP((2,), 3, width=32, depth=2, rngs=nnx.Rngs(1))
    net.out.kernel[...] = jax.random.normal(jax.random.key(2), net.out.kernel.shape)
    bad = classifier_gradient_error(
        NoisyClassifier.create(proc, net, 1.0), exact, x, labels, sigmas, key
    )
    assert np.all(bad["error"] > 0.5), bad
    assert np.all(bad["stderr"] < 0.1 * bad["error"]), bad
    # the accuracy of the exact (Bayes) classifier falls with the noise, a fresh one is at chance
    acc = noisy_classifier_accuracy(exact, x, labels, sigmas, key)["accuracy"]
    assert acc[0] > 0.8 and acc[0] > acc[1] > acc[2] > 1 / 3
    with pytest.raises(ValueError, match="classifier.process"):
        classifier_gradient_error(fresh.replace(process=VP()), exact, x, labels, sigmas, key)
    with pytest.raises(ValueError, match="labels"):
        classifier_gradient_error(fresh, exact, x, labels[:-1], sigmas, key)
    with pytest.raises(ValueError, match="sigmas"):
        classifier_gradient_error(fresh, exact, x, labels, [0.0], key)
