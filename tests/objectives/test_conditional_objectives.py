"""Objectives on a class-conditional source (issue 36, item 3).

The train step binds each batch's labels to the source (``source.with_labels``); the
objectives take no labels argument. Checked here:

* DSM, the EDM loss, SURE, the QC penalty and the DSM/TSM mixture on a label-dependent source
  against a float64 per-example loop (NumPy, closed-form coefficients from
  ``tests/closed_forms.py``, the objectives' documented per-example draws) for batches of 1, 2
  and 7 whose labels include the null label: an objective that scored example ``b`` with
  another example's label, or called the source on one example with the whole batch's
  labels, fails (fault kind 7 of /work/shared/notes/fault-kinds.md);
* the TSM label of a labelled example is its class's clean score, of a null one the
  mixture's; a target without classes or another class count is refused;
* the conditional DSM and EDM losses at the exact conditional source sit at their closed-form
  floors, and the same source with the wrong labels does not;
* the smoothed-score regression uses each class's teacher (the pooled one for the null
  label) and refuses labels with an unconditional teacher.
"""

from __future__ import annotations

import functools
import math

import closed_forms
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from scorelib.data.targets import GaussianMixtureTarget
from scorelib.objectives import (
    DSM,
    SURE,
    TSM,
    EDMLoss,
    MixedScoreMatching,
    QuasiConservative,
    example_draws,
)
from scorelib.objectives.smoothed import smoothed_score_matching
from scorelib.processes import EDM, VP, broadcast_to_data
from scorelib.scores.conditional import ConditionalScore
from scorelib.scores.jacobian import example_probes

jax.config.update("jax_enable_x64", False)

K = 3
D = 3
M0 = np.array([[0.5, 0.9, -0.3], [-0.2, 0.4, 0.7], [0.6, -0.5, 0.1]])
M1 = np.array([[0.1, -0.4, 0.2], [0.3, 0.0, -0.2], [-0.1, 0.2, 0.3]])
BATCHES = (1, 2, 7)
LABELS = np.array([2, 0, 3, 1, 0, 3, 2], np.int32)  # 3: the null label


class CondToy(ConditionalScore):
    """A label-dependent score with a non-symmetric Jacobian, and a separate denoiser."""

    classes: int = struct.field(pytree_node=False, default=K)

    @property
    def num_classes(self):
        return self.classes

    def score_given(self, x, t, labels):
        tb = broadcast_to_data(t, x)
        c = labels.astype(x.dtype)[:, None]
        m = jnp.asarray(M0, x.dtype)[None] + c[..., None] * jnp.asarray(M1, x.dtype)[None]
        return -x * (1.0 + 0.7 * tb) + jnp.tanh(jnp.einsum("bi,bij->bj", x, m) + 0.3 * c)

    def denoiser_given(self, x, t, labels):
        tb = broadcast_to_data(t, x)
        c = labels.astype(x.dtype)[:, None]
        return x / (1.0 + tb) + 0.3 * jnp.sin(x + 0.4 * c)


def np_score(x, t, c):
    z = x @ (M0 + c * M1) + 0.3 * c
    return -x * (1.0 + 0.7 * t) + np.tanh(z)


def np_score_jacobian(x, t, c):
    """``J[j, i] = d s_j / d x_i``."""
    m = M0 + c * M1
    z = x @ m + 0.3 * c
    return -(1.0 + 0.7 * t) * np.eye(D) + (1.0 - np.tanh(z) ** 2)[:, None] * m.T


def np_denoiser(x, t, c):
    return x / (1.0 + t) + 0.3 * np.sin(x + 0.4 * c)


def np_denoiser_diag_jacobian(x, t, c):
    return 1.0 / (1.0 + t) + 0.3 * np.cos(x + 0.4 * c)


TARGET = GaussianMixtureTarget.create(
    weights=[0.3, 0.5, 0.2],
    means=[[1.0, -0.5, 0.3], [-0.8, 0.6, 0.0], [0.2, 0.9, -1.0]],
    covs=[
        [[0.5, 0.1, 0.0], [0.1, 0.3, 0.05], [0.0, 0.05, 0.4]],
        [[0.2, -0.05, 0.02], [-0.05, 0.6, 0.1], [0.02, 0.1, 0.3]],
        [[0.3, 0.0, 0.1], [0.0, 0.3, 0.0], [0.1, 0.0, 0.5]],
    ],
    name="cond3d",
)


def np_clean_score(x, c):
    """The target's clean conditional score in float64; ``c = K``: the mixture's."""
    comp = [-np.linalg.solve(TARGET.covs[k], x - TARGET.means[k]) for k in range(K)]
    if c < K:
        return comp[c]
    logj = np.array(
        [
            math.log(TARGET.weights[k])
            - 0.5 * (x - TARGET.means[k]) @ np.linalg.solve(TARGET.covs[k], x - TARGET.means[k])
            - 0.5 * np.linalg.slogdet(TARGET.covs[k])[1]
            for k in range(K)
        ]
    )
    r = np.exp(logj - logj.max())
    r /= r.sum()
    return sum(r[k] * comp[k] for k in range(K))


PROC = VP()
HP = dict(P_mean=-0.8, P_std=0.6, sigma_data=0.7)
SIGMA_N = 0.5
QC_WEIGHT = 0.7
OBJECTIVES = {
    "dsm": DSM(process=PROC),
    "edm": EDMLoss(process=PROC, **HP),
    "sure": SURE(process=PROC, sigma_n=SIGMA_N, probes=2, **HP),
    "qc": QuasiConservative.create(DSM(process=PROC), weight=QC_WEIGHT, probes=2),
    "mixed": MixedScoreMatching(process=PROC, target=TARGET, kappa="gaussian_optimal"),
    "tsm": TSM(process=PROC, target=TARGET, weighting="alpha2"),
}


def _coeffs(t):
    a, s = closed_forms.alpha_sigma(PROC, float(t))
    return float(a), float(s)


@functools.cache
def _run():
    """Every objective's per-example losses on batches of 1, 2 and 7 (the first examples of
    the largest, with their labels) and the draws the references need, in one compiled call."""
    key = jax.random.key(5)
    x7 = jax.random.normal(jax.random.key(0), (7, D), jnp.float32) * 1.2 + 0.1
    y7 = jnp.asarray(LABELS)

    @jax.jit
    def run(x7, y7):
        out = {}
        for b in BATCHES:
            x, y = x7[:b], y7[:b]
            src = CondToy(process=PROC).with_labels(y)
            out[b] = {name: o.example_losses(src, x, key) for name, o in OBJECTIVES.items()}
        k0, k1 = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
        draws = {
            "uniform": example_draws(key, x7, "uniform"),
            "normal": example_draws(key, x7, "normal"),
            "uniform0": example_draws(k0, x7, "uniform"),
            "normal0": example_draws(k0, x7, "normal"),
            "probes1": example_probes(k1, 7, 2, D),
        }
        return out, draws

    out, draws = jax.device_get(run(x7, y7))
    return np.asarray(x7, np.float64), out, draws, key


def _ref_dsm(x0, y, u, eps):
    t = PROC.t_min + (PROC.t_max - PROC.t_min) * u
    a, s = _coeffs(t)
    xt = a * x0 + s * eps
    return s**2 * np.mean((np_score(xt, t, y) + eps / s) ** 2), t, xt


def _ref_edm(x0, y, z, n):
    sigma = math.exp(HP["P_mean"] + HP["P_std"] * z)
    t = float(closed_forms.t_of_ve_sigma(PROC, sigma))
    a, _ = _coeffs(t)
    xt = a * (x0 + sigma * n)
    lam = (sigma**2 + HP["sigma_data"] ** 2) / (sigma * HP["sigma_data"]) ** 2
    return lam * np.mean((np_denoiser(xt, t, y) - x0) ** 2)


def _reference(name, x0, y, b, draws, key):
    """Example ``b``'s loss in float64 (``x0 [D]``, label ``y``)."""
    f64 = lambda v: np.asarray(v, np.float64)  # noqa: E731
    if name == "dsm":
        u, eps = f64(draws["uniform"][0][b]), f64(draws["uniform"][1][b])
        return _ref_dsm(x0, y, u, eps)[0]
    if name == "edm":
        return _ref_edm(x0, y, f64(draws["normal"][0][b]), f64(draws["normal"][1][b]))
    if name == "qc":
        u, eps = f64(draws["uniform0"][0][b]), f64(draws["uniform0"][1][b])
        dsm, t, xt = _ref_dsm(x0, y, u, eps)
        jac = np_score_jacobian(xt, t, y)
        probes = f64(draws["probes1"][b])
        asym = np.mean([np.sum(((jac - jac.T) @ v) ** 2) for v in probes])
        return dsm + QC_WEIGHT * _coeffs(t)[1] ** 2 * asym
    if name == "sure":
        t_n = float(closed_forms.t_of_ve_sigma(PROC, SIGMA_N))
        a_n, _ = _coeffs(t_n)
        h = np_denoiser(a_n * x0, t_n, y)
        diag = a_n * np_denoiser_diag_jacobian(a_n * x0, t_n, y)
        probes = f64(draws["probes1"][b])  # example b's of fold_in(key, 1)
        div = np.mean([np.sum(v * diag * v) for v in probes])
        sure = (np.sum((x0 - h) ** 2) + 2 * SIGMA_N**2 * div - D * SIGMA_N**2) / D
        lam_n = (SIGMA_N**2 + HP["sigma_data"] ** 2) / (SIGMA_N * HP["sigma_data"]) ** 2
        # the DSM term: EDM's loss on x_hat = h with example b's draws of fold_in(key, 0)
        z, n = f64(draws["normal0"][0][b]), f64(draws["normal0"][1][b])
        return lam_n * sure + _ref_edm(h, y, z, n)
    # the DSM/TSM mixtures
    u, eps = f64(draws["uniform"][0][b]), f64(draws["uniform"][1][b])
    t = PROC.t_min + (PROC.t_max - PROC.t_min) * u
    a, s = _coeffs(t)
    xt = a * x0 + s * eps
    u_tsm = np_clean_score(x0, y) / a
    if name == "tsm":
        return a**2 * np.mean((np_score(xt, t, y) - u_tsm) ** 2)
    sd2 = TARGET.sigma_data**2
    kappa = sd2 / (sd2 + (s / a) ** 2)
    label = kappa * u_tsm + (1 - kappa) * (-eps / s)
    return s**2 * np.mean((np_score(xt, t, y) - label) ** 2)


TOL = {"dsm": 2e-4, "edm": 1e-3, "sure": 2e-3, "qc": 5e-4, "mixed": 5e-4, "tsm": 5e-4}


@pytest.mark.parametrize("name", list(OBJECTIVES))
@pytest.mark.slow  # one compiled program for all six objectives, over 5 s: `make test` only
def test_conditional_losses_match_a_float64_per_example_loop(name):
    x7, out, draws, key = _run()
    for b_size in BATCHES:
        losses, _ = out[b_size][name]
        assert losses.shape == (b_size,)
        ref = [_reference(name, x7[b], int(LABELS[b]), b, draws, key) for b in range(b_size)]
        np.testing.assert_allclose(losses, ref, rtol=TOL[name], atol=1e-5, err_msg=name)


def test_tsm_label_is_the_conditional_target_score():
    x0 = np.random.default_rng(3).normal(size=(7, D)).astype(np.float32)
    eps = np.random.default_rng(4).normal(size=(7, D)).astype(np.float32)
    t = np.linspace(0.1, 0.9, 7).astype(np.float32)
    obj = OBJECTIVES["tsm"]
    lab = jax.jit(lambda x, tt, e, c: obj.labels(x, tt, e, c))(x0, t, eps, jnp.asarray(LABELS))
    alpha = np.array([_coeffs(v)[0] for v in t])
    got = np.asarray(lab["u_tsm"], np.float64) * alpha[:, None]
    for b in range(7):
        want = np_clean_score(x0[b].astype(np.float64), int(LABELS[b]))
        np.testing.assert_allclose(got[b], want, rtol=1e-4, atol=1e-5)
    # without classes: the mixture's score, which the null label gives too
    null = jnp.full((7,), K, jnp.int32)
    both = jax.jit(lambda x, tt, e: (obj.labels(x, tt, e), obj.labels(x, tt, e, null)))
    plain, nulls = both(x0, t, eps)
    np.testing.assert_allclose(plain["u_tsm"], nulls["u_tsm"], rtol=1e-6, atol=1e-7)


def test_tsm_refuses_labels_it_cannot_condition():
    x0 = jnp.zeros((2, D))
    key = jax.random.key(0)
    wrong_k = CondToy(process=PROC, classes=2).with_labels(jnp.array([0, 1]))
    with pytest.raises(ValueError, match=r"^model\.num_classes must be the target's number"):
        OBJECTIVES["tsm"].example_losses(wrong_k, x0, key)
    from scorelib.data.targets import ManyWellTarget

    mw = MixedScoreMatching(process=PROC, target=ManyWellTarget.create(2, grid_size=1001))
    src = CondToy(process=PROC).with_labels(jnp.array([0, 1]))
    with pytest.raises(ValueError, match=r"^data\.labels must be false for target"):
        mw.example_losses(src, jnp.zeros((2, 2)), key)


# --------------------------------------------------------------------------- minimisers


FLOOR_TARGET = GaussianMixtureTarget.create(
    weights=[0.3, 0.4, 0.3],
    means=[[-1.0, 0.0], [1.0, 0.5], [0.0, -1.0]],
    stds=[0.4, 0.5, 0.3],
    name="floor",
)


@pytest.mark.parametrize("loss", ["dsm", "edm"])
def test_conditional_loss_at_the_exact_conditional_source_is_its_floor(loss):
    """At the exact class-conditional source (class = component, a ``PerClassScore`` of
    Gaussians), DSM's expected loss is ``d / sigma^2 - tr (alpha^2 C_c + sigma^2 I)^-1`` (at a
    fixed t, unit weight, summed) and EDM's ``lambda tr(C_c - C_c (C_c + s^2 I)^-1 C_c) / d``
    (a fixed VE sigma): the sample mean matches within 4 standard errors. With each
    example's label moved to another class the loss is far above (the check can fail), and
    with the null label (the mixture) above by the classifier term."""
    n = 2000
    x0, y = FLOOR_TARGET.batch(n, seed=1, step=0, labels=True)
    y = np.asarray(y)
    covs = FLOOR_TARGET.covs
    if loss == "dsm":
        proc, t = VP(), 0.3
        obj = DSM(process=proc, weighting="none", reduce="sum", t_range=(t, t))
        a, s = _coeffs(t)
        floor_k = [2 / s**2 - np.trace(np.linalg.inv(a**2 * c + s**2 * np.eye(2))) for c in covs]
    else:
        proc, sig, sd = EDM(), 0.5, 0.5
        obj = EDMLoss(process=proc, P_mean=math.log(sig), P_std=1e-6, sigma_data=sd)
        lam = (sig**2 + sd**2) / (sig * sd) ** 2
        floor_k = [
            lam * np.trace(c - c @ np.linalg.solve(c + sig**2 * np.eye(2), c)) / 2 for c in covs
        ]
    exact = FLOOR_TARGET.noisy_score(proc, conditional=True)
    run = jax.jit(lambda lab: obj.example_losses(exact.with_labels(lab), x0, jax.random.key(9))[0])
    floor = np.array(floor_k)[y]
    losses = np.asarray(run(jnp.asarray(y)), np.float64)
    gap = losses - floor
    se = gap.std() / math.sqrt(n)
    assert abs(gap.mean()) < 4 * se, (gap.mean(), se)
    wrong = np.asarray(run(jnp.asarray((y + 1) % K)), np.float64) - floor
    assert wrong.mean() > 20 * se, (wrong.mean(), se)
    null = np.asarray(run(jnp.full((n,), K, jnp.int32)), np.float64) - floor
    assert null.mean() > 8 * se, (null.mean(), se)


# --------------------------------------------------------------------------- smoothed


def _smoothed_setup():
    rng = np.random.default_rng(0)
    train = np.concatenate([rng.normal(-1.0, 0.3, (6, 2)), rng.normal(1.0, 0.3, (5, 2))])
    labels = np.array([0] * 6 + [1] * 5)
    kw = dict(sigma_s=0.05, M=2, estimator="exact", sigma_data=0.8)
    return train.astype(np.float32), labels, kw


@pytest.mark.slow  # the exact smoothed teachers of three classes compile for over 5 s
def test_smoothed_regression_uses_each_class_teacher():
    """Each example's label is its class's smoothed teacher bound to that example alone (the
    pooled teacher for the null label): the loss equals EDM's weight times the squared gap
    to it, example by example."""
    train, labels, kw = _smoothed_setup()
    proc = EDM()
    obj = smoothed_score_matching(proc, train, labels=labels, **kw)
    assert obj.num_classes == 2
    x0 = jnp.asarray(train[[0, 7, 3, 9]], jnp.float32)
    y_np = np.array([0, 1, 2, 1], np.int32)  # 2: the null label
    y = jnp.asarray(y_np)
    src = CondToy(process=proc, classes=2)
    key = jax.random.key(2)

    @jax.jit
    def run():
        losses, aux = obj.example_losses(src.with_labels(y), x0, key)
        xt, t = obj.example_points(x0, key)
        k1 = jax.random.fold_in(key, 1)
        teach = []
        for b in range(4):
            c = int(y_np[b])
            one = obj.teacher.null if c == 2 else obj.teacher.sources[c]
            one = one.for_examples(k1, 1, b)
            teach.append(one.denoiser(xt[b : b + 1], t[b : b + 1])[0])
        mine = src.with_labels(y).denoiser(xt, t)
        return losses, aux["sigma"], jnp.stack(teach), mine

    losses, sigma, teach, mine = (np.asarray(v, np.float64) for v in run())
    lam = (sigma**2 + 0.8**2) / (sigma * 0.8) ** 2
    np.testing.assert_allclose(losses, lam * np.mean((mine - teach) ** 2, axis=1), rtol=2e-4)


def test_smoothed_regression_refuses_labels_it_cannot_use():
    """Labels with an unconditional teacher (it would teach the pooled score under every
    label), a class count other than the teacher's, and a class without examples."""
    train, labels, kw = _smoothed_setup()
    proc = EDM()
    x0, key = jnp.asarray(train[:2]), jax.random.key(0)
    src = CondToy(process=proc, classes=2).with_labels(jnp.array([0, 1]))
    plain = smoothed_score_matching(proc, train, **kw)
    with pytest.raises(ValueError, match=r"^data\.labels must be false with an unconditional"):
        plain.example_losses(src, x0, key)
    cond = smoothed_score_matching(proc, train, labels=labels, **kw)
    wrong = CondToy(process=proc, classes=3).with_labels(jnp.array([0, 1]))
    with pytest.raises(ValueError, match=r"^model\.num_classes must be the teacher's"):
        cond.example_losses(wrong, x0, key)
    with pytest.raises(ValueError, match=r"^data\.labels must be classes 0 \.\. 2 each"):
        smoothed_score_matching(proc, train, labels=np.where(labels == 1, 2, 0), **kw)
