"""The QCSBM penalty as an objective wrapper: the points it penalises are those the wrapped
objective trains at; per-example losses against a float64 loop from the full Jacobian; the
gradient is the wrapped objective's plus ``weight`` times the closed form's; training with it
removes the asymmetry that training without it leaves."""

from __future__ import annotations

import functools

import closed_forms
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import struct
from vector_fields import tiny_net

from scorelib.data.targets import random_gaussian_mixture
from scorelib.objectives import (
    DSM,
    EDMLoss,
    MixedScoreMatching,
    Objective,
    QuasiConservative,
    quasi_conservative,
)
from scorelib.objectives.smoothed import smoothed_score_matching
from scorelib.processes import EDM, VP
from scorelib.scores import ScoreSource
from scorelib.scores.jacobian import probe_vectors

_CALLS: dict = {}


def _record(tag, x, t):
    def save(x, t):
        _CALLS.setdefault(tag, []).append(
            (np.asarray(x), np.broadcast_to(np.asarray(t), (x.shape[0],)))
        )

    jax.debug.callback(save, x, t)


class Recorder(ScoreSource):
    """Records every ``(x, t)`` it is called at (also under jit), under its ``tag``."""

    tag: str = struct.field(pytree_node=False, default="")

    def score(self, x, t):
        _record(self.tag, x, t)
        return -x

    def denoiser(self, x, t):
        _record(self.tag, x, t)
        return 0.5 * x


def _objectives(process, x_train):
    target = random_gaussian_mixture(3, 2, seed=1)
    return {
        "dsm": DSM(process=process),
        "dsm_range": DSM(process=process, t_range=(0.2, 0.7)),
        "edm": EDMLoss(process=process, P_mean=-0.5),
        "edm_uniform": EDMLoss(process=process, p_uniform=0.5, sigma_range=(0.01, 5.0)),
        "mixed": MixedScoreMatching(process, target, t_sampling="log_sigma"),
        "smoothed": smoothed_score_matching(process, x_train, sigma_s=0.3, M=2, estimator="exact"),
    }


@pytest.mark.parametrize(
    "process,names",
    [(EDM(), None), (VP(), ("edm", "smoothed"))],  # VP: alpha != 1 in the EDM-style draws
    ids=lambda p: type(p).__name__ if not isinstance(p, tuple) else "",
)
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_example_points_are_where_the_objective_evaluates_the_source(process, names):
    rng = np.random.default_rng(0)
    x0 = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
    key = jax.random.key(3)
    objs = _objectives(process, np.asarray(rng.normal(size=(20, 3)), np.float32))
    objs = {k: v for k, v in objs.items() if names is None or k in names}

    @jax.jit
    def run(x0, key):  # every objective in one compiled call
        out = {}
        for name, obj in objs.items():
            obj.example_losses(Recorder(process=process, tag=name), x0, key)
            wrapped = quasi_conservative(obj, weight=0.1)
            out[name] = (
                obj.example_points(x0, key),
                wrapped.example_points(x0, key)[0],
                obj.example_points(x0, jax.random.fold_in(key, 0))[0],
            )
        return out

    _CALLS.clear()
    out = jax.block_until_ready(run(x0, key))
    for name, ((xt, t), wrapped_xt, folded_xt) in out.items():
        assert len(_CALLS[name]) == 1, name
        assert xt.shape == x0.shape and t.shape == (5,), name
        np.testing.assert_array_equal(np.asarray(xt), _CALLS[name][0][0], err_msg=name)
        np.testing.assert_array_equal(np.asarray(t), _CALLS[name][0][1], err_msg=name)
        np.testing.assert_array_equal(np.asarray(wrapped_xt), np.asarray(folded_xt))


_CASES = [  # EDM's DSM at t <= 2: tanh far from saturation, float32 derivatives accurate
    (EDM(), "dsm_mid", dict(weight=0.3, probes=2, weighting="sigma2", form="skew")),
    (VP(), "dsm", dict(weight=1.5, probes=3, weighting="likelihood", form="paper")),
    (EDM(), "edm", dict(weight=0.7, probes=1, weighting="none", form="skew")),
]
_PER_EXAMPLE = [(b, *_CASES[0]) for b in (1, 2, 7)] + [(7, *c) for c in _CASES[1:]]
_PER_EXAMPLE_IDS = ["edm-dsm-1", "edm-dsm-2", "edm-dsm-7", "vp-dsm-7", "edm-edm-7"]


def _per_example_case(batch, process, inner, kw):
    """``(wrapper, net, x0)`` of one case of test_per_example_losses_against_a_float64_loop."""
    net = tiny_net(2, d=3, process=process)
    x0 = jnp.asarray(np.random.default_rng(batch).normal(size=(batch, 3)), jnp.float32)
    obj = {
        "dsm": lambda: DSM(process=process),
        "dsm_mid": lambda: DSM(process=process, t_range=(0.05, 2.0)),
        "edm": lambda: EDMLoss(process=process),
    }[inner]()
    return quasi_conservative(obj, **kw), net, x0


@functools.cache
def _per_example_outputs(key_seed=11):
    """Every case of test_per_example_losses_against_a_float64_loop in one compiled call:
    the wrapper's ``example_losses`` and ``__call__``, and what :func:`_reference` needs:
    the wrapped objective's per-example losses and points at ``fold_in(key, 0)``, each
    example's full Jacobian of the score there (``jax.jacfwd``) and its probes by the
    documented rule (``probe_vectors`` of ``fold_in(fold_in(key, 1), b)``)."""
    cases = [_per_example_case(*c) for c in _PER_EXAMPLE]
    key = jax.random.key(key_seed)

    def one(wrapper, net, x0):
        inner = wrapper.objective
        k0 = jax.random.fold_in(key, 0)
        xt, t = inner.example_points(x0, k0)

        def jac(z, tb):
            return jax.jacfwd(lambda zz: net.score(zz[None], tb[None])[0])(z)

        def probes(b):
            k = jax.random.fold_in(jax.random.fold_in(key, 1), b)
            return probe_vectors(k, wrapper.probes, x0.shape[1])

        return dict(
            example_losses=wrapper.example_losses(net, x0, key),
            call=wrapper(net, x0, key),
            inner_losses=inner.example_losses(net, x0, k0)[0],
            t=t,
            jac=jax.vmap(jac)(xt, t),
            probes=jax.vmap(probes)(jnp.arange(x0.shape[0])),
        )

    nets_x0 = [(net, x0) for _, net, x0 in cases]
    run = jax.jit(lambda nx: [one(w, n, x) for (w, _, _), (n, x) in zip(cases, nx, strict=True)])
    return cases, jax.device_get(run(nets_x0))


def _reference(wrapper, out):
    """Per-example ``(total, objective_loss, penalty)`` in float64 from the full Jacobian
    (:func:`_per_example_outputs`), the weight from tests/closed_forms.py."""
    inner = wrapper.objective
    out_rows = []
    for b in range(out["t"].shape[0]):
        jac = np.asarray(out["jac"][b], np.float64)
        v = np.asarray(out["probes"][b], np.float64)
        a, bt = v @ jac.T, v @ jac  # rows: J v_p and J^T v_p
        if wrapper.form == "skew":
            est = np.mean(np.sum((a - bt) ** 2, axis=1))
        else:
            est = np.mean(2 * (np.sum(bt**2, axis=1) - np.sum(a * bt, axis=1)))
        t_b = float(out["t"][b])
        _, sig = closed_forms.alpha_sigma(inner.process, t_b)
        g2 = closed_forms.f_g2(inner.process, t_b)[1]
        w = {"sigma2": sig**2, "likelihood": g2, "none": 1.0}[wrapper.weighting]
        pen = w * est
        loss_b = float(out["inner_losses"][b])
        out_rows.append((loss_b + wrapper.weight * pen, loss_b, pen))
    return np.asarray(out_rows)


@pytest.mark.parametrize("case", range(len(_PER_EXAMPLE)), ids=_PER_EXAMPLE_IDS)
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_per_example_losses_against_a_float64_loop(case):
    """The wrapper's per-example losses and batch mean against :func:`_reference` (all
    cases compiled together, :func:`_per_example_outputs`)."""
    batch = _PER_EXAMPLE[case][0]
    cases, outs = _per_example_outputs()
    (wrapper, _, _), out = cases[case], outs[case]
    losses, aux = out["example_losses"]
    ref = _reference(wrapper, out)
    assert losses.shape == (batch,)
    np.testing.assert_allclose(aux["objective_loss"], ref[:, 1], rtol=1e-5)
    np.testing.assert_allclose(aux["qc_penalty"], ref[:, 2], rtol=2e-4)
    np.testing.assert_allclose(losses, ref[:, 0], rtol=2e-4)
    assert np.all(ref[:, 2] > 0)  # not vacuous: the net is not a gradient field
    loss, metrics = out["call"]
    assert set(metrics) >= {"loss", "objective_loss", "asymmetry", "qc_penalty"}
    np.testing.assert_allclose(metrics["qc_penalty"], ref[:, 2].mean(), rtol=2e-4)
    np.testing.assert_allclose(loss, ref[:, 0].mean(), rtol=2e-4)


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in jax.tree.leaves(tree)])


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_gradient_is_the_objectives_plus_weight_times_the_closed_form_penalty():
    process = EDM()
    net = tiny_net(5, d=3, process=process)
    x0 = jnp.asarray(np.random.default_rng(6).normal(size=(4, 3)), jnp.float32)
    key = jax.random.key(2)
    obj = DSM(process=process, t_range=(0.05, 2.0))
    k0 = jax.random.fold_in(key, 0)
    probes = 3

    def closed_form(n):  # mean_b sigma_b^2 mean_p |(J_b - J_b^T) v_bp|^2 with J_b by jacfwd
        xt, t = obj.example_points(x0, k0)

        def one(b):
            jac = jax.jacfwd(lambda z: n.score(z[None], t[b][None])[0])(xt[b])
            v = probe_vectors(jax.random.fold_in(jax.random.fold_in(key, 1), b), probes, 3)
            return t[b] ** 2 * jnp.mean(jnp.sum((v @ (jac - jac.T).T) ** 2, axis=1))

        return jnp.mean(jnp.stack([one(b) for b in range(4)]))

    weights = (0.0, 0.4)

    @jax.jit
    def grads(net):  # every gradient in one compiled call
        wrapped = [quasi_conservative(obj, weight=w, probes=probes) for w in weights]
        return (
            jax.grad(lambda n: obj(n, x0, k0)[0])(net),
            jax.grad(closed_form)(net),
            [jax.grad(lambda n, w=w: w(n, x0, key)[0])(net) for w in wrapped],
        )

    g_obj, g_pen, gs = grads(net)
    g_obj, g_pen = _flat(g_obj), _flat(g_pen)
    for weight, g in zip(weights, gs, strict=True):
        np.testing.assert_allclose(_flat(g), g_obj + weight * g_pen, rtol=2e-4, atol=1e-6)
    assert np.abs(0.4 * g_pen).max() > 0.1 * np.abs(g_obj).max()  # a visible share


def _exact_asymmetry(net, x, t):
    """``mean_x |J - J^T|_F^2 / (4 |J|_F^2)`` with ``J`` the score's Jacobian by jacfwd (jnp)."""

    def one(xb):
        jac = jax.jacfwd(lambda z: net.score(z[None], t)[0])(xb)
        return jnp.sum((jac - jac.T) ** 2) / (4 * jnp.sum(jac**2))

    return jnp.mean(jax.vmap(one)(x))


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_training_with_the_penalty_removes_the_asymmetry_training_without_it_keeps():
    """Known-good vs known-bad at equal steps: DSM alone removes a random net's rotational part
    only slowly (the Gaussian data's score is a gradient field, so DSM does too, eventually);
    DSM + penalty removes it faster (measured: NAsym 0.28 at the start, 0.19 after 300 steps
    without the penalty, 0.048 with it; 0.046 and 0.0067 after 1,000 steps)."""
    process = EDM()
    d = 3
    rng = np.random.default_rng(0)
    x_data = jnp.asarray(rng.normal(size=(512, d)) * [1.0, 0.5, 0.3], jnp.float32)
    start = tiny_net(1, d=d, h=16, process=process, scale=0.8)
    dsm = DSM(process=process, t_range=(0.3, 1.5))
    objectives = (  # without and with the penalty
        quasi_conservative(dsm, weight=0.0),
        quasi_conservative(dsm, weight=1.0, probes=2),
    )
    x_eval = x_data[:64] + 0.8 * jnp.asarray(rng.normal(size=(64, d)), jnp.float32)
    opt = optax.adam(3e-3)

    @jax.jit
    def run(net, steps=300):  # both trainings and the asymmetries in one compiled call
        def step(carry, i):
            idx = jax.random.choice(jax.random.key(i), 512, (64,))
            new = []
            for objective, (n, s) in zip(objectives, carry, strict=True):
                loss = lambda m, o=objective: o(m, x_data[idx], jax.random.key(1000 + i))[0]  # noqa: E731
                g = jax.grad(loss)(n)
                upd, s = opt.update(g, s, n)
                new.append((optax.apply_updates(n, upd), s))
            return tuple(new), None

        init = tuple((net, opt.init(net)) for _ in objectives)
        (plain, _), (penalised, _) = jax.lax.scan(step, init, jnp.arange(steps))[0]
        return [_exact_asymmetry(m, x_eval, 0.8) for m in (net, plain, penalised)]

    before, plain, penalised = (float(v) for v in run(start))
    assert plain > 0.5 * before, (before, plain)
    assert penalised < 0.4 * plain, (plain, penalised)


class NoPoints(Objective):
    def example_losses(self, source, x0, key):
        return jnp.zeros(x0.shape[0]), {}


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(weight=-0.1), "penalty.weight"),
        (dict(weight=float("nan")), "penalty.weight"),
        (dict(weight="0.1"), "penalty.weight"),
        (dict(probes=0), "penalty.probes"),
        (dict(probes=1.0), "penalty.probes"),
        (dict(noise="uniform"), "penalty.noise"),
        (dict(weighting="sigma4"), "penalty.weighting"),
        (dict(form="sym"), "penalty.form"),
    ],
)
def test_bad_settings_name_the_field(kw, field):
    with pytest.raises(ValueError, match=f"^{field} must"):
        quasi_conservative(DSM(process=EDM()), **kw)


def test_an_objective_without_points_is_refused():
    with pytest.raises(ValueError, match="^penalty=qc needs an objective whose training points"):
        QuasiConservative.create(NoPoints())
    with pytest.raises(ValueError, match="^penalty=qc needs an objective whose training points"):
        QuasiConservative.create(lambda s, x, k: (0.0, {}))


def _compose(overrides):
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from experiments import schema

    schema.register_configs()
    root = Path(__file__).resolve().parents[2]
    with initialize_config_dir(config_dir=str(root / "configs"), version_base="1.3"):
        return compose("train", overrides=overrides)


def test_penalty_qc_composes_and_wraps_the_runs_objective():
    from experiments import build

    cfg = _compose(["penalty=qc", "penalty.weight=0.25", "penalty.probes=2"])
    process = build.build_process(cfg)
    obj = build.build_objective(cfg, process, build.build_data(cfg))
    assert isinstance(obj, QuasiConservative)
    assert (obj.weight, obj.probes, obj.form, obj.weighting) == (0.25, 2, "skew", "sigma2")
    assert isinstance(obj.objective, EDMLoss) and obj.objective.P_mean == -1.6  # digits_edm's
    plain = build.build_objective(_compose([]), process)
    assert isinstance(plain, EDMLoss)  # no penalty unless asked for
    bad = _compose(["penalty=qc", "penalty.probes=0"])
    with pytest.raises(ValueError, match="^penalty.probes must"):
        build.build_objective(bad, process)
    with pytest.raises(ValueError, match="^penalty.probs is not an argument"):  # misspelt
        build.build_objective(_compose(["penalty=qc", "+penalty.probs=2"]), process)
