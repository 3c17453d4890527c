"""Train several objectives over several seeds at once, with the same budget.

For comparisons of objectives ("same network, optimizer, EMA, data stream and number of
steps; mean and std over seeds"), :func:`train_seeds` runs one train step of
:func:`scorelib.training.make_train_step` per objective, ``jax.vmap``-ed over the seeds,
and every objective's step inside one jit-compiled call with the states donated: one
dispatch per step for all ``objectives x seeds`` networks.

Seed ``i`` of every objective starts from the same initial state ``states[i]`` (network
initialisation and base key), and all runs read the same data stream ``batch_fn(step)``:
the objectives see common random numbers, so their differences are not seed noise. Each
run computes what :func:`make_train_step` computes for it alone; ``tests/training/
test_multi_seed.py`` checks this against separate single-seed runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from scorelib._checks import check_int, require
from scorelib.training.ema import EMA
from scorelib.training.state import TrainState
from scorelib.training.step import make_train_step


def stack(trees: Sequence[Any]) -> Any:
    """Pytrees of equal structure stacked along a new leading axis (fresh buffers)."""
    require(len(trees) >= 1, "trees", "a non-empty sequence of pytrees", len(trees))
    return jax.tree.map(lambda *a: jnp.stack(a), *trees)


def unstack(tree: Any) -> list[Any]:
    """The inverse of :func:`stack`: ``[tree[i] for i in range(leading axis)]``."""
    leaves = jax.tree.leaves(tree)
    require(
        bool(leaves) and all(np.ndim(a) >= 1 for a in leaves),
        "tree",
        "a pytree whose leaves share a leading axis",
        [np.shape(a) for a in leaves],
    )
    n = np.shape(leaves[0])[0]
    return [jax.tree.map(lambda a, i=i: a[i], tree) for i in range(n)]


def train_seeds(
    objectives: Mapping[str, Callable],
    make_source: Callable,
    optimizer: optax.GradientTransformation,
    ema: EMA,
    batch_fn: Callable[[jax.Array], jax.Array],
    states: Sequence[TrainState],
    num_steps: int,
    *,
    log_every: int = 0,
    on_log: Callable[[int, dict[str, np.ndarray]], None] | None = None,
    label_dropout: float = 0.0,
) -> tuple[dict[str, TrainState], dict[str, float]]:
    """Train every objective from every initial state for ``num_steps`` steps.

    Args:
      objectives: ``{name: objective}``, each ``objective(source, x0, key) -> (loss,
        metrics)`` as :func:`make_train_step` takes it.
      make_source, optimizer, ema, batch_fn, label_dropout: as :func:`make_train_step`,
        shared by all runs (``batch_fn`` may return ``(x0, labels)``).
      states: one initial :class:`TrainState` per seed (e.g. from
        :func:`scorelib.training.init_state` with the seed's network); every objective
        starts from a copy of each.
      num_steps: steps per run (>= 1).
      log_every: call ``on_log`` after every ``log_every``-th step and after the last one
        (0: never).
      on_log: ``on_log(step, {name: loss [n_seeds] float32})`` with ``step`` the number of
        steps done; the only host synchronisations during training.

    Returns:
      ``(final, info)``: ``final[name]`` is a :class:`TrainState` whose leaves carry a
      leading seed axis in the order of ``states`` (:func:`unstack` splits it);
      ``info`` holds ``compile_s`` (the first step, compilation included), ``train_s``
      and ``steps_per_s`` (the other steps, every run together).

    Raises:
      ValueError: for no objectives, no states, ``num_steps < 1`` or ``log_every < 0``.
    """
    require(len(objectives) >= 1, "objectives", "a non-empty mapping", dict(objectives))
    require(len(states) >= 1, "states", "one TrainState per seed (at least one)", len(states))
    num_steps = check_int(num_steps, "num_steps", low=1)
    log_every = check_int(log_every, "log_every", low=0)
    names = list(objectives)
    raw = {
        k: make_train_step(
            objectives[k],
            make_source,
            optimizer,
            ema,
            batch_fn,
            jit=False,
            label_dropout=label_dropout,
        )
        for k in names
    }

    def step_all(all_states):
        new, losses = {}, {}
        for k in names:
            new[k], metrics = jax.vmap(raw[k])(all_states[k])
            losses[k] = metrics["loss"]
        return new, losses

    step_all = jax.jit(step_all, donate_argnums=0)
    current = {k: stack(states) for k in names}  # separate buffers per objective (donated)

    def report(done, losses):
        if on_log is not None and log_every and (done % log_every == 0 or done == num_steps):
            on_log(done, {k: np.asarray(v) for k, v in losses.items()})

    t0 = time.perf_counter()
    current, losses = step_all(current)
    jax.block_until_ready(losses)
    compile_s = time.perf_counter() - t0
    report(1, losses)
    t0 = time.perf_counter()
    for done in range(2, num_steps + 1):
        current, losses = step_all(current)
        report(done, losses)
    jax.block_until_ready(current)
    train_s = time.perf_counter() - t0
    info = {
        "compile_s": compile_s,
        "train_s": train_s,
        "steps_per_s": (num_steps - 1) / max(train_s, 1e-9),
    }
    return current, info
