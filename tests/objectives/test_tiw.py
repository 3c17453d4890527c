"""TIW-DSM against the exact ratio of two Gaussians: its loss on the biased law equals the
EDM loss on the unbiased law up to a constant (differences between two networks agree
within their standard error), the weight alone keeps the biased law's preference, the
time-independent weight is unbiased too, the exact ratio's gradient by hand, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.objectives.dsm import EDMLoss
from scorelib.objectives.tiw import ExactLogRatio, TIWLoss, grad_log_ratio
from scorelib.processes.edm import EDM
from scorelib.processes.vp import VP
from scorelib.scores.mixture import MixtureScore

D = 2
MU_P = np.array([[0.8, -0.4]])  # the unbiased law p = N(MU_P, I)
MU_Q = np.zeros((1, D))  # the biased training law q = N(0, I)


def gauss(process, mu):
    return MixtureScore.create(process, [1.0], mu, np.eye(D)[None])


def losses(objective, source, x0, key):
    return np.asarray(objective.example_losses(source, x0, key)[0], np.float64)


@pytest.mark.parametrize("process", [EDM(), VP()], ids=["edm", "vp"])
def test_tiw_on_q_equals_edm_on_p_up_to_a_constant(process):
    """For two sources A (p's exact score) and B (q's), E_q[TIW(A) - TIW(B)] equals
    E_p[EDM(A) - EDM(B)] within 4 standard errors; the weight alone prefers B (q's score)
    as plain EDM on q does; the time-independent weight w(x0) is unbiased too."""
    n = 200_000
    ratio = ExactLogRatio(reference=gauss(process, MU_P), biased=gauss(process, MU_Q))
    kw = dict(P_mean=-1.2, P_std=1.2, sigma_data=1.0)
    a, b = gauss(process, MU_P), gauss(process, MU_Q)
    xq = (MU_Q + np.asarray(jax.random.normal(jax.random.key(0), (n, D)))).astype(np.float32)
    xp = (MU_P + np.asarray(jax.random.normal(jax.random.key(1), (n, D)))).astype(np.float32)
    key = jax.random.key(2)
    edm = EDMLoss(process, **kw)
    ref = losses(edm, a, xp, key) - losses(edm, b, xp, key)
    want, want_se = ref.mean(), ref.std() / np.sqrt(n)
    assert want < -10 * want_se  # p's score has the lower loss on p: not an empty check
    got = {}
    for mode in ("tiw", "iw", "reweight"):
        tiw = TIWLoss(
            process=process, log_ratio=ratio, mode=mode, ratio_min=1e-6, ratio_max=1e6, **kw
        )
        d = losses(tiw, a, xq, key) - losses(tiw, b, xq, key)
        got[mode] = (d.mean(), d.std() / np.sqrt(n))
    for mode in ("tiw", "iw"):
        m, se = got[mode]
        assert abs(m - want) < 4 * np.hypot(se, want_se), (mode, m, want, se, want_se)
    assert got["reweight"][0] > 10 * got["reweight"][1]  # weight alone: q's score wins


def test_exact_ratio_and_its_gradient_by_hand():
    """p_t = N(mu_p, (1 + sigma^2) I), q_t = N(0, (1 + sigma^2) I) under EDM: log w_t(x) =
    (2 x.mu_p - |mu_p|^2) / (2 (1 + sigma^2)), its gradient mu_p / (1 + sigma^2)."""
    process = EDM()
    ratio = ExactLogRatio(reference=gauss(process, MU_P), biased=gauss(process, MU_Q))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(5, D)), jnp.float32)
    t = jnp.full((5,), 0.7)
    v = 1 + 0.7**2
    want = (2 * np.asarray(x) @ MU_P[0] - MU_P[0] @ MU_P[0]) / (2 * v)
    np.testing.assert_allclose(ratio.log_ratio(x, t), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad_log_ratio(ratio, x, t), np.tile(MU_P / v, (5, 1)), rtol=1e-5)


def test_weight_is_clipped_and_carries_no_gradient():
    process = EDM()
    ratio = ExactLogRatio(reference=gauss(process, MU_P * 10), biased=gauss(process, MU_Q))
    tiw = TIWLoss(process=process, log_ratio=ratio, ratio_min=0.5, ratio_max=2.0)
    x = jnp.asarray([[8.0, -4.0], [-8.0, 4.0], [0.0, 0.0]])
    w = tiw.weights(x, jnp.full((3,), 0.01))
    np.testing.assert_allclose(w[:2], [2.0, 0.5])
    g = jax.grad(lambda z: jnp.sum(tiw.weights(z, jnp.full((3,), 0.01))))(x)
    assert float(jnp.abs(g).max()) == 0.0


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(mode="both"), "objective.mode must be one of"),
        (
            dict(ratio_min=2.0, ratio_max=1.0),
            "objective.ratio_max must be a number > objective.ratio_min",
        ),
        (dict(log_ratio=3.0), "objective.log_ratio must be an object with log_ratio(x, t)"),
        (dict(P_std=0.0), "objective.P_std must be"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(kw, needle):
    process = EDM()
    args = dict(
        process=process, log_ratio=ExactLogRatio(gauss(process, MU_P), gauss(process, MU_Q))
    )
    args.update(kw)
    with pytest.raises(ValueError) as e:
        TIWLoss(**args)
    assert needle in str(e.value), str(e.value)


class _Logits:
    """A stand-in classifier: fixed logits, two classes."""

    num_classes = 2

    def logits(self, x, t):
        return jnp.stack([x[:, 0], 2.0 * x[:, 0] + 1.0], axis=-1)


def test_classifier_log_ratio_subtracts_the_batch_prior():
    """logit_ref - logit_biased - log(n_ref / n_biased): with 1 reference example per 4
    biased ones, log w = (2x + 1 - x) - log(1/4)."""
    from scorelib.objectives.tiw import classifier_log_ratio

    r = classifier_log_ratio(_Logits(), n_reference=1, n_biased=4)
    x = jnp.asarray([[0.0, 0.0], [1.5, 0.0]])
    np.testing.assert_allclose(
        r.log_ratio(x, jnp.zeros(2)), [1 + np.log(4), 2.5 + np.log(4)], rtol=1e-6
    )
    with pytest.raises(ValueError, match="n_biased must be"):
        classifier_log_ratio(_Logits(), n_reference=1, n_biased=0)


def test_ratio_and_objective_must_share_the_process():
    with pytest.raises(ValueError, match="biased must be a source on the reference's process"):
        ExactLogRatio(reference=gauss(EDM(), MU_P), biased=gauss(VP(), MU_Q))
    ratio = ExactLogRatio(reference=gauss(EDM(), MU_P), biased=gauss(EDM(), MU_Q))
    with pytest.raises(ValueError, match="objective.log_ratio must be a ratio on the objective"):
        TIWLoss(process=VP(), log_ratio=ratio)
    with pytest.raises(ValueError, match="objective.process must be a noise process"):
        TIWLoss(log_ratio=ratio)
    with pytest.raises(ValueError, match="reference must be a source with log_prob"):
        ExactLogRatio(reference=None, biased=gauss(EDM(), MU_Q))


def test_effective_sample_fraction_by_hand():
    from scorelib.objectives.tiw import effective_sample_fraction

    assert effective_sample_fraction([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert effective_sample_fraction([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert effective_sample_fraction([3.0, 1.0]) == pytest.approx(16 / (2 * 10))
    with pytest.raises(ValueError, match="weights must be"):
        effective_sample_fraction([0.0, 0.0])


def test_weights_at_average_one_under_the_biased_law():
    """E_q[w_t(x_t)] = 1 for the exact ratio at every noise level: the mean of weights_at
    over examples of q is 1 within 4 standard errors."""
    ratio = ExactLogRatio(reference=gauss(EDM(), MU_P), biased=gauss(EDM(), MU_Q))
    tiw = TIWLoss(process=EDM(), log_ratio=ratio, ratio_min=1e-6, ratio_max=1e6)
    n = 100_000
    xq = np.asarray(jax.random.normal(jax.random.key(3), (n, D)), np.float32)
    for i, sigma in enumerate((0.05, 0.5, 2.0)):
        noise = jax.random.normal(jax.random.key(10 + i), xq.shape)
        w = np.asarray(tiw.weights_at(xq, sigma, noise), np.float64)
        assert abs(w.mean() - 1) < 4 * w.std() / np.sqrt(n), (sigma, w.mean())
    with pytest.raises(ValueError, match="sigma must be"):
        tiw.weights_at(xq, 0.0, xq)
    with pytest.raises(ValueError, match="noise must be of x0's shape"):
        tiw.weights_at(xq, 0.5, xq[:3])
