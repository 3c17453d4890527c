"""train_seeds (every objective x every seed in one vmapped, jitted step) against separate
single-seed runs of make_train_step, and its logging and argument checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scorelib.nets.mlp import MLP
from scorelib.objectives import DSM, EDMLoss
from scorelib.processes import EDM
from scorelib.training import (
    EMA,
    init_state,
    make_optimizer,
    make_train_step,
    network_source,
    stack,
    train_seeds,
    unstack,
)

BATCH, STEPS, SEEDS = 16, 6, (0, 3)


def batch_fn(i):
    k = jax.random.fold_in(jax.random.key(7), i)
    return jnp.array([1.0, -0.5]) + 0.3 * jax.random.normal(k, (BATCH, 2))


def setup():
    opt = make_optimizer(lr=1e-2, warmup_steps=2, grad_clip=1.0)
    ema = EMA(batch_size=BATCH, halflife_nimg=40, rampup_ratio=0.05)
    states = []
    for seed in SEEDS:
        graphdef, state = init_state(MLP((2,), width=16, depth=2, rngs=nnx.Rngs(seed)), opt, seed)
        states.append(state)
    objectives = {"dsm": DSM(EDM()), "edm": EDMLoss(EDM())}
    return graphdef, opt, ema, states, objectives


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_equals_separate_single_seed_runs():
    graphdef, opt, ema, states, objectives = setup()
    make_source = network_source(EDM(), graphdef, 0.5)
    logged = []
    final, info = train_seeds(
        objectives,
        make_source,
        opt,
        ema,
        batch_fn,
        states,
        STEPS,
        log_every=4,
        on_log=lambda step, losses: logged.append((step, {k: v.shape for k, v in losses.items()})),
    )
    assert [s for s, _ in logged] == [4, STEPS]  # every 4th step and the last
    assert logged[0][1] == {"dsm": (2,), "edm": (2,)}
    assert set(info) == {"compile_s", "train_s", "steps_per_s"}
    for name, objective in objectives.items():
        per_seed = unstack(final[name])
        assert len(per_seed) == len(SEEDS)
        step = make_train_step(objective, make_source, opt, ema, batch_fn)
        for i, seed in enumerate(SEEDS):
            _, state = init_state(MLP((2,), width=16, depth=2, rngs=nnx.Rngs(seed)), opt, seed)
            for _ in range(STEPS):
                state, _ = step(state)
            got, want = per_seed[i], state
            assert int(got.step) == STEPS and int(got.n_skipped) == int(want.n_skipped)
            for a, b in zip(
                jax.tree.leaves((got.params, got.ema_params, got.opt_state)),
                jax.tree.leaves((want.params, want.ema_params, want.opt_state)),
                strict=True,
            ):
                # vmap turns the matmuls into batched ones whose float32 sums XLA may order
                # differently: after 6 steps the runs agree to about 1 ulp (measured: max
                # |diff| 6e-8), not bit for bit
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_initial_states_are_not_consumed_and_stack_roundtrips():
    graphdef, opt, ema, states, objectives = setup()
    before = [np.asarray(jax.tree.leaves(s.params)[0]) for s in states]
    train_seeds(objectives, network_source(EDM(), graphdef, 0.5), opt, ema, batch_fn, states, 2)
    # the given states were copied (stacked), not donated
    for s, b in zip(states, before, strict=True):
        np.testing.assert_array_equal(jax.tree.leaves(s.params)[0], b)
    back = unstack(stack(states))
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(states), strict=True):
        np.testing.assert_array_equal(a, b)


def test_bad_arguments():
    graphdef, opt, ema, states, objectives = setup()
    src = network_source(EDM(), graphdef, 0.5)
    with pytest.raises(ValueError, match="num_steps must be an integer >= 1"):
        train_seeds(objectives, src, opt, ema, batch_fn, states, 0)
    with pytest.raises(ValueError, match="objectives must be a non-empty mapping"):
        train_seeds({}, src, opt, ema, batch_fn, states, 1)
    with pytest.raises(ValueError, match="states must be one TrainState per seed"):
        train_seeds(objectives, src, opt, ema, batch_fn, [], 1)
    with pytest.raises(ValueError, match="log_every must be an integer >= 0"):
        train_seeds(objectives, src, opt, ema, batch_fn, states, 1, log_every=-1)
