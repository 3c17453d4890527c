"""The classifier objectives (cross-entropy on noised inputs and DLSM) against independent
per-example loops and the exact classifier of a Gaussian mixture, and short trainings on a
2-D mixture whose classes are its components.

* Per-example reference: every term recomputed in NumPy float64, one example at a time, from
  the objectives' documented per-example draws (``example_draws``: a uniform and the noise),
  with the noise levels, times and process coefficients from the closed forms of
  ``tests/closed_forms.py`` and a linear-softmax classifier whose input gradient is written
  by hand (``W^T (e_c - softmax)``), for batches of 1, 2 and 7.
* Exact classifier and exact score: DLSM is then conditional DSM of the exact class scores
  (Bayes: ``grad log p(c | x) + grad log p(x) = grad log p(x | c)``), example by example, and
  the expected gradient of each loss with respect to a classifier parameter vanishes at the
  exact classifier, while it does not at a tempered one (a check that can fail).
* Training (slow): both classifiers reach the Bayes accuracy on clean and noised data, and
  their guidance gradients are close to the exact ones (``classifier_gradient_error``).
"""

from __future__ import annotations

import functools
import math

import closed_forms
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, struct
from scipy.special import ndtri

from scorelib.metrics import classifier_gradient_error, noisy_classifier_accuracy
from scorelib.nets import ClassifierMLP
from scorelib.objectives import DLSM, NoisyCrossEntropy, example_draws
from scorelib.processes import EDM, VP, Process, broadcast_to_data
from scorelib.scores import MixtureScore, NoisyClassifier, PerClassScore, ScoreSource
from scorelib.training.classifier import train_classifier

jax.config.update("jax_enable_x64", False)

BATCHES = (1, 2, 7)
K = 3


class ToyScore(ScoreSource):
    """A non-linear, time-dependent stand-in for the frozen score."""

    def score(self, x, t):
        tb = broadcast_to_data(t, x)
        return -x * (1.0 + 0.7 * tb) + jnp.tanh(x)


def np_score(x, t):
    return -x * (1.0 + 0.7 * t) + np.tanh(x)


class LinearClassifier(struct.PyTreeNode):
    """``log p(c | x) = log_softmax(W x / (1 + t) + b t)[c]`` on the flattened ``x``."""

    process: Process = struct.field(pytree_node=False)
    W: jax.Array = None
    b: jax.Array = None

    def class_log_prob(self, x, t, labels):
        flat = jnp.reshape(x, (x.shape[0], -1))
        tb = jnp.broadcast_to(t, (x.shape[0],))[:, None]
        z = flat @ self.W.T / (1.0 + tb) + self.b[None] * tb
        lp = jax.nn.log_softmax(z, axis=-1)
        return jnp.take_along_axis(lp, labels[:, None], axis=1)[:, 0]


def np_classifier(W, b, x, t, c):
    """``(log p(c | x), grad_x log p(c | x))`` of :class:`LinearClassifier` in float64."""
    z = W @ x.ravel() / (1.0 + t) + b * t
    z = z - z.max()
    p = np.exp(z) / np.exp(z).sum()
    onehot = np.eye(len(b))[c]
    return math.log(p[c]), (W.T @ (onehot - p) / (1.0 + t)).reshape(x.shape)


LEVELS = dict(P_mean=-0.6, P_std=1.1)  # not the defaults: a hard-coded one shows
FLOOR = dict(P_mean=-0.6, P_std=1.1, p_uniform=0.3, sigma_range=(0.01, 20.0))


def _objectives(proc):
    score = ToyScore(process=proc)
    return (
        NoisyCrossEntropy(process=proc, **LEVELS),
        NoisyCrossEntropy(process=proc, **FLOOR),
        DLSM(process=proc, score=score, **LEVELS),
        DLSM(process=proc, score=score, weighting="none", ce_weight=0.7, **FLOOR),
        DLSM(process=proc, score=score, weighting="likelihood", reduce="mean", **LEVELS),
    )


def _np_sigma(u, obj):
    """The VE level of a uniform, by the mixture's inverse CDF (written from the docstring)."""
    p = obj.p_uniform
    if p > 0 and u < p:
        lo, hi = obj.sigma_range
        return math.exp(math.log(lo) + (u / p) * (math.log(hi) - math.log(lo)))
    q = min(max((u - p) / (1.0 - p), 1e-7), 1.0 - 1e-7)
    return math.exp(obj.P_mean + obj.P_std * float(ndtri(q)))


def _reference(proc, obj, W, b, x0, labels, draws):
    """Per-example losses and VE levels in float64 from the objective's draws."""
    u, eps = (np.asarray(v, np.float64) for v in draws)
    x0 = np.asarray(x0, np.float64)
    losses, sigmas = [], []
    for i in range(x0.shape[0]):
        sig = _np_sigma(float(u[i]), obj)
        t = float(closed_forms.t_of_ve_sigma(proc, sig))
        a, s = (float(v) for v in closed_forms.alpha_sigma(proc, t))
        xt = a * x0[i] + s * eps[i]
        logp, grad = np_classifier(W, b, xt, t, int(labels[i]))
        loss = -logp
        if isinstance(obj, DLSM):
            sq = (grad + np_score(xt, t) + eps[i] / s) ** 2
            err = sq.mean() if obj.reduce == "mean" else sq.sum()
            g2 = float(closed_forms.f_g2(proc, t)[1])
            lam = {"sigma2": s**2, "likelihood": g2, "none": 1.0}[obj.weighting]
            loss = 0.5 * lam * err + obj.ce_weight * loss
        losses.append(loss)
        sigmas.append(sig)
    return np.array(losses), np.array(sigmas)


def _losses_and_call(obj, clf, x0, labels, key):
    """``(obj.example_losses(...), obj(...))`` with ``example_losses`` traced once: the
    objective's own ``__call__`` runs on a stand-in that hands back the traced values (as
    ``tests/objective_calls.py`` does for score objectives) and refuses other arguments."""
    out = obj.example_losses(clf, x0, labels, key)

    class Once:
        def __getattr__(self, name):
            return getattr(obj, name)

        def example_losses(self, *args):
            if not all(a is b for a, b in zip(args, (clf, x0, labels, key), strict=True)):
                raise AssertionError(f"{type(obj).__name__}.__call__ changed its arguments")
            return out

    return out, type(obj).__call__(Once(), clf, x0, labels, key)


@functools.cache
def _run(proc, shape):
    """Every objective on batches 1, 2, 7 (the smaller the first examples of the largest),
    their batch means and the draws, in one compiled call."""
    d = math.prod(shape)
    rng = np.random.default_rng(0)
    W = rng.normal(size=(K, d)).astype(np.float32)
    b = rng.normal(size=K).astype(np.float32)
    x7 = (rng.normal(size=(7, *shape)) * 1.3 + 0.2).astype(np.float32)
    y7 = rng.integers(0, K, 7).astype(np.int32)
    key = jax.random.key(11)
    objs = _objectives(proc)

    @jax.jit
    def evaluate(W, b, xs, ys):
        clf = LinearClassifier(process=proc, W=W, b=b)
        out = [
            [_losses_and_call(o, clf, x, y, key) for o in objs] for x, y in zip(xs, ys, strict=True)
        ]
        draws = [example_draws(key, x, "uniform") for x in xs]
        return out, draws

    xs = tuple(x7[:n] for n in BATCHES)
    ys = tuple(y7[:n] for n in BATCHES)
    out, draws = jax.device_get(evaluate(W, b, xs, ys))
    return W, b, xs, ys, objs, out, draws


@pytest.mark.parametrize(
    "proc, shape", [(EDM(), (3,)), (VP(), (2, 2))], ids=["EDM-(3,)", "VP-(2,2)"]
)
def test_losses_match_a_float64_per_example_loop(proc, shape):
    """Cross-entropy and DLSM (three weightings, both reductions, with and without a
    log-uniform floor of noise levels) per example for B = 1, 2, 7, and their batch means,
    under a process with ``alpha = 1`` and one without, on vectors and on images."""
    W, b, xs, ys, objs, out, draws = _run(proc, shape)
    for x0, y, per_batch, draw in zip(xs, ys, out, draws, strict=True):
        n = x0.shape[0]
        for obj, ((per, aux), (loss, metrics)) in zip(objs, per_batch, strict=True):
            msg = f"{type(obj).__name__} {obj.weighting if isinstance(obj, DLSM) else ''} B={n}"
            ref, sig = _reference(
                proc, obj, W.astype(np.float64), b.astype(np.float64), x0, y, draw
            )
            assert per.shape == (n,)
            np.testing.assert_allclose(aux["sigma"], sig, rtol=1e-5, err_msg=msg)
            np.testing.assert_allclose(per, ref, rtol=2e-4, atol=1e-5, err_msg=msg)
            np.testing.assert_allclose(float(loss), ref.mean(), rtol=2e-4, err_msg=msg)
            np.testing.assert_allclose(float(metrics["loss"]), ref.mean(), rtol=2e-4, err_msg=msg)
            if isinstance(obj, DLSM):
                total = aux["dlsm"] + obj.ce_weight * aux["ce"]
                np.testing.assert_allclose(total, per, rtol=1e-6, err_msg=msg)
    # batch independence: example i is the same in every batch that holds it
    first = [o[0][0][0] for o in out]
    for per in first[:-1]:
        np.testing.assert_allclose(per, first[-1][: len(per)], rtol=1e-6)


def test_bad_arguments_are_refused_naming_the_field():
    proc = EDM()
    with pytest.raises(ValueError, match="objective.P_std"):
        NoisyCrossEntropy(process=proc, P_std=0.0)
    with pytest.raises(ValueError, match="objective.sigma_range"):
        NoisyCrossEntropy(process=proc, p_uniform=0.2)
    with pytest.raises(ValueError, match="objective.score"):
        DLSM(process=proc)
    with pytest.raises(ValueError, match="objective.score"):
        DLSM(process=proc, score=ToyScore(process=VP()))
    with pytest.raises(ValueError, match="objective.weighting"):
        DLSM(process=proc, score=ToyScore(process=proc), weighting="edm")
    with pytest.raises(ValueError, match="objective.ce_weight"):
        DLSM(process=proc, score=ToyScore(process=proc), ce_weight=-1.0)
    obj = NoisyCrossEntropy(process=proc)
    x = jnp.zeros((3, 2))
    with pytest.raises(ValueError, match="classifier"):
        obj(ToyScore(process=proc), x, jnp.zeros(3, jnp.int32), jax.random.key(0))
    clf = LinearClassifier(process=proc, W=jnp.ones((K, 2)), b=jnp.zeros(K))
    with pytest.raises(ValueError, match="labels"):
        obj(clf, x, jnp.zeros(2, jnp.int32), jax.random.key(0))


# --- the exact classifier of a mixture whose classes are its components -------------------

MEANS = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 1.2]])
COVS = np.array([np.diag([0.6**2, 0.4**2]), np.diag([0.4**2, 0.6**2]), 0.5**2 * np.eye(2)])


def mixture(proc):
    """``(PerClassScore of the components, the mixture's score)``."""
    comps = [MixtureScore.create(proc, [1.0], MEANS[k : k + 1], COVS[k : k + 1]) for k in range(K)]
    return PerClassScore.create(comps), MixtureScore.create(proc, np.ones(K), MEANS, COVS)


def mixture_data(n, seed):
    """``(x [n, 2], labels [n])``: draws of the mixture with equal weights and their
    components."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, K, n).astype(np.int32)
    chol = np.linalg.cholesky(COVS)[labels]
    x = MEANS[labels] + np.einsum("nij,nj->ni", chol, rng.standard_normal((n, 2)))
    return x.astype(np.float32), labels


class Tempered(struct.PyTreeNode):
    """``log_softmax(theta * (log pi_k + log p_t(x | k)))[c]``: the exact classifier at
    ``theta = 1``."""

    exact: PerClassScore = None
    theta: jax.Array = 1.0

    @property
    def process(self):
        return self.exact.process

    def class_log_prob(self, x, t, labels):
        lp = jax.nn.log_softmax(self.theta * self.exact.class_log_joint(x, t), axis=-1)
        return jnp.take_along_axis(lp, labels[:, None], axis=1)[:, 0]


@pytest.mark.parametrize("proc", [EDM(), VP()], ids=lambda p: type(p).__name__)
def test_dlsm_at_the_exact_classifier_and_score_is_conditional_dsm(proc):
    """With the exact classifier and the exact mixture score, the DLSM term of each example is
    conditional DSM of its class's exact score, ``0.5 sigma^2 |s_c(x_t) + eps / sigma|^2``,
    at the same draws (B = 7)."""
    exact, score = mixture(proc)
    x0, labels = mixture_data(7, 1)
    obj = DLSM(process=proc, score=score, ce_weight=0.0, P_mean=-0.5, P_std=1.0)
    key = jax.random.key(4)

    @jax.jit
    def both(x0, labels):
        per, aux = obj.example_losses(exact, x0, labels, key)
        _, t, eps, xt = obj.draws(x0, key)
        s_c = jnp.stack([c.score(xt, t) for c in exact.sources])[labels, jnp.arange(7)]
        sigma = proc.sigma(t)[:, None]
        return per, aux, 0.5 * sigma[:, 0] ** 2 * jnp.sum((s_c + eps / sigma) ** 2, axis=1)

    per, aux, ref = both(jnp.asarray(x0), jnp.asarray(labels))
    np.testing.assert_allclose(per, ref, rtol=2e-3)
    np.testing.assert_allclose(aux["dlsm"], per, rtol=0)


@jax.jit
def _theta_derivatives(obj, exact, thetas, x0, labels, key):
    """``[len(thetas), n]``: ``d loss_b / d theta`` per example for the tempered classifier
    at each ``theta``."""

    def losses(th):
        return obj.example_losses(Tempered(exact=exact, theta=th), x0, labels, key)[0]

    return jax.vmap(jax.jacfwd(losses))(thetas)


@pytest.mark.parametrize("kind", ["dlsm", "ce"])
def test_the_expected_gradient_vanishes_at_the_exact_classifier_only(kind):
    """The mean over 8,192 examples of the derivative of each loss with respect to the
    temperature ``theta`` is within 4 standard errors of 0 at ``theta = 1`` (the exact
    classifier minimises both losses in expectation), and at least 4 standard errors below
    0 at ``theta = 0.6`` and above 0 at ``theta = 1.5`` (the loss decreases towards 1)."""
    proc = EDM()
    exact, score = mixture(proc)
    x0, labels = (jnp.asarray(v) for v in mixture_data(8192, 2))
    if kind == "dlsm":
        obj = DLSM(process=proc, score=score, ce_weight=0.0, P_mean=-0.5, P_std=1.0)
    else:
        obj = NoisyCrossEntropy(process=proc, P_mean=-0.5, P_std=1.0)
    key = jax.random.key(7)
    thetas = (1.0, 0.6, 1.5)
    derivs = np.asarray(
        _theta_derivatives(obj, exact, jnp.asarray(thetas), x0, labels, key), np.float64
    )
    z = {
        th: d.mean() / (d.std(ddof=1) / math.sqrt(d.size))
        for th, d in zip(thetas, derivs, strict=True)
    }
    assert abs(z[1.0]) < 4, z
    assert z[0.6] < -4 and z[1.5] > 4, z


# --- training on the mixture -------------------------------------------------------------

TRAIN = dict(steps=1500, batch_size=256, lr=2e-3, seed=1)
EVAL_SIGMAS = (0.01, 0.3, 1.0, 2.0)


@functools.cache
def _trained():
    proc = EDM()
    exact, score = mixture(proc)
    x, labels = mixture_data(20_000, 0)
    levels = dict(P_mean=-0.5, P_std=1.5)
    out = {}
    for name, obj in (
        ("ce", NoisyCrossEntropy(process=proc, **levels)),
        ("dlsm", DLSM(process=proc, score=score, **levels)),
    ):
        net = ClassifierMLP((2,), K, width=64, depth=2, rngs=nnx.Rngs(0))
        clf = NoisyClassifier.create(proc, net, sigma_data=1.0)
        out[name], _ = train_classifier(obj, clf, x, labels, **TRAIN)
    fresh = NoisyClassifier.create(proc, ClassifierMLP((2,), K, rngs=nnx.Rngs(3)), 1.0)
    return exact, out, fresh


@pytest.mark.slow  # about 40 s on 2 busy cores: two trainings of 1,500 steps
def test_trained_classifiers_reach_the_bayes_accuracy_and_the_exact_gradient():
    """Cross-entropy and DLSM classifiers trained for 1,500 steps on draws of the mixture:
    accuracy within 0.02 of the Bayes classifier's (the exact one) at every level, clean
    included (sigma = 0.01, about 1 % of the components' spread); relative gradient error
    below 0.1 at sigma >= 0.3, where the exact classifier scores 0 and a fresh classifier (zero
    gradient) exactly 1. And DLSM's error is below cross-entropy's at sigma = 1: its claim,
    measured over 3 seeds at 2,000 steps (DLSM / CE error 0.19-0.27 at sigma = 1, 0.27-0.40
    at 2, 0.35-0.63 at 0.6, 0.63-0.72 at 0.3, 0.58-1.02 at 0.1, 1.0-1.16 at 0.01, where
    neither is trained much), asserted only where it holds with a wide margin."""
    exact, trained, fresh = _trained()
    x, labels = mixture_data(4000, 9)
    key = jax.random.key(5)
    bayes = noisy_classifier_accuracy(exact, x, labels, EVAL_SIGMAS, key)["accuracy"]
    assert bayes[0] > 0.9 and bayes[-1] < 0.6  # overlapping classes: a hard problem at 2
    assert np.all(
        classifier_gradient_error(exact, exact, x, labels, EVAL_SIGMAS, key)["error"] == 0
    )
    np.testing.assert_allclose(
        classifier_gradient_error(fresh, exact, x, labels, EVAL_SIGMAS, key)["error"], 1.0
    )
    errors = {}
    for name, clf in trained.items():
        acc = noisy_classifier_accuracy(clf, x, labels, EVAL_SIGMAS, key)["accuracy"]
        assert np.all(np.abs(acc - bayes) < 0.02), (name, acc, bayes)
        err = classifier_gradient_error(clf, exact, x, labels, EVAL_SIGMAS, key)
        assert np.all(err["error"][1:] < 0.1), (name, err)
        assert np.all(err["stderr"] > 0) and np.all(err["stderr"] < 0.2 * err["error"]), err
        errors[name] = err["error"]
    at_1 = EVAL_SIGMAS.index(1.0)
    assert errors["dlsm"][at_1] < errors["ce"][at_1], errors
