"""The pieces every train step shares (score training and distillation): a state of parts with
one optimizer each, the update that moves only the chosen parts and is discarded when
non-finite, the step counters, and the optimizer factory's AdamW variant."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from scorelib import training
from scorelib.training import TrainState, advance, apply_update, make_optimizer

LR = {"a": 0.1, "b": 0.5}


def _parts_state():
    params = {"a": {"w": jnp.array([1.0, -2.0])}, "b": {"w": jnp.array([3.0, 0.5])}}
    opts = {k: optax.sgd(lr) for k, lr in LR.items()}
    return TrainState.create(params, opts, seed=0, ema_part="a"), opts


def _np(tree):
    return jax.tree.map(np.asarray, jax.device_get(tree))


def test_create_parts_copies_params_and_tracks_one_parts_ema():
    state, _ = _parts_state()
    assert set(state.params) == set(state.opt_state) == {"a", "b"}
    np.testing.assert_array_equal(state.ema_params["w"], [1.0, -2.0])
    assert state.ema_params["w"] is not state.params["a"]["w"]  # a buffer of its own
    assert int(state.step) == 0 and int(state.n_skipped) == 0 and int(state.first_nonfinite) == -1


def test_create_refuses_parts_that_do_not_match():
    p = {"a": jnp.zeros(2), "b": jnp.zeros(2)}
    with pytest.raises(ValueError, match=r"params must be a dict with the optimizers' parts"):
        TrainState.create(p, {"a": optax.sgd(0.1)}, seed=0)
    with pytest.raises(ValueError, match=r"ema_part must be one of \['a', 'b'\]; got 'c'"):
        TrainState.create(p, {k: optax.sgd(0.1) for k in p}, seed=0, ema_part="c")
    with pytest.raises(ValueError, match="ema_part must be None for a single-optimizer state"):
        TrainState.create(jnp.zeros(2), optax.sgd(0.1), seed=0, ema_part="a")


def test_update_moves_only_the_given_parts_and_the_ema_with_its_part():
    state, opts = _parts_state()
    beta = jnp.float32(0.75)
    g = {"w": jnp.array([0.5, 1.0])}
    old = _np(state)
    # part 'b' only: SGD on b; a, its optimizer state and the EMA (of a) stay
    kw = dict(ema_beta=beta, ema_part="a")
    new, norm, finite = apply_update(state, jnp.float32(1.0), {"b": g}, opts, **kw)
    new = _np(new)
    np.testing.assert_allclose(new.params["b"]["w"], [3.0 - 0.5 * 0.5, 0.5 - 0.5 * 1.0])
    np.testing.assert_array_equal(new.params["a"]["w"], old.params["a"]["w"])
    np.testing.assert_array_equal(new.ema_params["w"], old.ema_params["w"])
    assert bool(finite) and float(norm) == pytest.approx(np.hypot(0.5, 1.0))
    # part 'a' (the EMA's): SGD on a, then ema = beta ema + (1 - beta) a_new
    new, _, _ = apply_update(state, jnp.float32(1.0), {"a": g}, opts, **kw)
    new = _np(new)
    a_new = np.array([1.0 - 0.1 * 0.5, -2.0 - 0.1 * 1.0])
    np.testing.assert_allclose(new.params["a"]["w"], a_new, rtol=1e-6)
    np.testing.assert_allclose(
        new.ema_params["w"], 0.75 * np.array([1.0, -2.0]) + 0.25 * a_new, rtol=1e-6
    )
    np.testing.assert_array_equal(new.params["b"]["w"], old.params["b"]["w"])
    # an EMA part the state does not hold is refused, naming it
    with pytest.raises(ValueError, match="ema_part must be the part whose EMA the state holds"):
        apply_update(state, jnp.float32(1.0), {"a": g}, opts, ema_beta=beta)


@pytest.mark.parametrize("bad", ["loss", "grad"])
def test_a_nonfinite_update_is_discarded_and_counted_once(bad):
    state, opts = _parts_state()
    adam = {k: optax.adam(0.1) for k in LR}  # a state that would move (count, moments)
    state = TrainState.create(_np(state.params), adam, seed=0, ema_part="a")
    loss = jnp.float32(jnp.nan if bad == "loss" else 1.0)
    g = {"a": {"w": jnp.array([jnp.inf if bad == "grad" else 1.0, 1.0])}}
    new, _, finite = apply_update(state, loss, g, adam, ema_beta=0.5, ema_part="a")
    assert not bool(finite)
    for x, y in zip(jax.tree.leaves(_np(new)), jax.tree.leaves(_np(state)), strict=True):
        np.testing.assert_array_equal(x, y)
    counted = advance(state, new, finite)
    assert (int(counted.step), int(counted.n_skipped), int(counted.first_nonfinite)) == (1, 1, 0)
    again = advance(counted, counted, finite)  # the second non-finite step keeps the first's index
    assert (int(again.step), int(again.n_skipped), int(again.first_nonfinite)) == (2, 2, 0)
    fine = advance(again, again, jnp.bool_(True))
    assert (int(fine.step), int(fine.n_skipped), int(fine.first_nonfinite)) == (3, 2, 0)


def test_adamw_first_update_is_the_closed_form():
    """One AdamW step from zero moments (Loshchilov and Hutter 2019, Alg. 2): the
    bias-corrected moments are g and g^2, so p1 = p0 - lr (g / (|g| + eps) + wd p0)."""
    lr, wd, eps = 0.01, 0.1, 1e-8
    p0 = np.array([0.5, -1.5, 2.0], np.float32)
    g = np.array([0.3, -0.02, 0.0], np.float32)
    opt = make_optimizer(lr, grad_clip=None, weight_decay=wd, eps=eps)
    upd, _ = opt.update(jnp.asarray(g), opt.init(jnp.asarray(p0)), jnp.asarray(p0))
    p1 = np.asarray(optax.apply_updates(jnp.asarray(p0), upd))
    p0d, gd = p0.astype(np.float64), g.astype(np.float64)
    np.testing.assert_allclose(p1, p0d - lr * (gd / (np.abs(gd) + eps) + wd * p0d), rtol=1e-6)
    # with a warm-up the first step's rate is lr / warmup_steps (the update itself, to
    # float32's bias correction: 1 - float32(0.999) is 0.001 (1 + 1.3e-5), so |g| / sqrt(v_hat)
    # is 1 to 6.4e-6)
    warm = make_optimizer(lr, warmup_steps=4, grad_clip=None, weight_decay=wd, eps=eps)
    upd, _ = warm.update(jnp.asarray(g), warm.init(jnp.asarray(p0)), jnp.asarray(p0))
    np.testing.assert_allclose(
        np.asarray(upd), -lr / 4 * (gd / (np.abs(gd) + eps) + wd * p0d), rtol=1e-5
    )


def test_adamw_state_layout_is_the_distillation_checkpoints():
    """A constant-rate AdamW keeps optax.adamw's state (no schedule count): the layout of
    the distillation checkpoints; Adam keeps its schedule count (score training's)."""
    p = {"w": jnp.zeros(3)}
    adamw = make_optimizer(1e-4, grad_clip=None, weight_decay=0.01).init(p)
    assert jax.tree.structure(adamw) == jax.tree.structure(
        optax.adamw(1e-4, weight_decay=0.01).init(p)
    )
    adam = make_optimizer(1e-4, grad_clip=None).init(p)
    assert isinstance(adam[-1], optax.ScaleByScheduleState)


@pytest.mark.parametrize("wd", [-0.1, float("nan"), float("inf")])
def test_weight_decay_out_of_range_names_the_field(wd):
    with pytest.raises(ValueError, match="optim.weight_decay must be"):
        training.make_optimizer(1e-3, weight_decay=wd)
