"""Training a noise-conditional classifier: the jitted step and a small loop for Python use.

The step is :func:`scorelib.training.make_train_step`'s with labels: for state ``s`` and
``i = s.step``::

    key = fold_in(s.key, i)
    x0, labels = batch_fn(i)                                  # a pure function of i
    (loss, metrics), g = value_and_grad(objective(make_classifier(params), x0, labels, key))
    params', opt', ema' = apply_update(...);  step, counters = advance(...)

with the update, its non-finite handling and the EMA of ``scorelib.training.step``
(:func:`~scorelib.training.apply_update`, :func:`~scorelib.training.advance`), so a run resumed
from a checkpoint computes what the uninterrupted run computes, and the loop, the
checkpoints and the signals of :func:`scorelib.training.train` take it as they are. The
objective (``scorelib.objectives.classifier``) is a pytree argument of the compiled step, so
DLSM's frozen score network is an input of the program, not a constant folded into it.

:func:`train_classifier` trains one on labelled arrays in a few lines (the tables' mixture
classifiers): Adam (:func:`~scorelib.training.make_optimizer`), an EMA, batches drawn with
replacement by :func:`scorelib.data.batch_indices`, and returns the classifier of the EMA
parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from scorelib._checks import check_int, require
from scorelib.data.batching import batch_indices
from scorelib.scores.classifier import NoisyClassifier
from scorelib.training.ema import EMA
from scorelib.training.loop import train
from scorelib.training.optim import make_optimizer
from scorelib.training.state import TrainState, create_state
from scorelib.training.step import update_step

Array = Any


def classifier_source(template: NoisyClassifier) -> Callable[[Any], NoisyClassifier]:
    """``make_classifier(params)``: ``template`` with ``params`` (the trained leaves)."""

    def make_classifier(params):
        return template.replace(params=params)

    return make_classifier


def labelled_batches(x: Array, labels: Array, batch_size: int, seed: int):
    """``batch_fn(step) -> (x [B, ...], labels [B])``: rows drawn with replacement by
    :func:`scorelib.data.batch_indices` (``fold_in(fold_in(key(seed), step), b)`` for example
    ``b``), images and labels alike; traceable inside ``jit``.

    Raises:
      ValueError: naming ``labels`` (not one int per row of ``x``) or ``batch_size``.
    """
    n = int(jnp.shape(x)[0])
    require(
        jnp.shape(labels) == (n,) and jnp.issubdtype(jnp.asarray(labels).dtype, jnp.integer),
        "labels",
        f"[{n}] integer class labels (one per row of x)",
        jnp.shape(labels),
    )
    batch_size = check_int(batch_size, "batch_size", low=1)
    x, labels = jnp.asarray(x), jnp.asarray(labels, jnp.int32)

    def batch_fn(step):
        idx = batch_indices(n, batch_size, seed=seed, step=step)
        return jnp.take(x, idx, axis=0), jnp.take(labels, idx)

    return batch_fn


def make_classifier_step(
    objective,
    make_classifier: Callable[[Any], Any],
    optimizer,
    ema: EMA,
    batch_fn: Callable[[jax.Array], tuple[Array, Array]],
    *,
    lr_schedule: Callable | None = None,
    jit: bool = True,
    batch_sharding: jax.sharding.Sharding | None = None,
) -> Callable[[TrainState], tuple[TrainState, dict]]:
    """Build ``step(state) -> (state, metrics)`` for a classifier objective (module
    docstring), jit-compiled with the state donated.

    Args:
      objective: ``objective(classifier, x0, labels, key) -> (loss, metrics)``
        (``scorelib.objectives.classifier.NoisyCrossEntropy`` or ``DLSM``), a pytree.
      make_classifier: ``params -> classifier`` (:func:`classifier_source`).
      optimizer: an optax transformation (:func:`scorelib.training.make_optimizer`).
      ema: an :class:`~scorelib.training.EMA` configuration.
      batch_fn: ``step (int32 scalar) -> (x0 [B, *data_shape], labels [B])``, traceable.
      lr_schedule: optional ``count -> lr`` to report ``metrics['lr']``.
      jit: compile (``donate_argnums=0``); ``False`` for debugging.
      batch_sharding: data parallelism, as :func:`scorelib.training.make_train_step`.

    Returns:
      ``step``; the old state must not be used after ``step(state)`` (donated). Metrics:
      ``loss``, ``grad_norm``, ``ema_beta``, ``finite``, the objective's and ``lr``.
    """

    def step(state: TrainState, objective) -> tuple[TrainState, dict]:
        i = state.step
        key = jax.random.fold_in(state.rng, i)
        x0, labels = batch_fn(i)
        if batch_sharding is not None:
            x0 = jax.lax.with_sharding_constraint(x0, batch_sharding)
            labels = jax.lax.with_sharding_constraint(labels, batch_sharding)

        def loss_fn(params):
            return objective(make_classifier(params), x0, labels, key)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        return update_step(state, loss, metrics, grads, optimizer, ema, lr_schedule)

    compiled = jax.jit(step, donate_argnums=0) if jit else step

    def run(state: TrainState) -> tuple[TrainState, dict]:
        return compiled(state, objective)

    return run


def train_classifier(
    objective,
    classifier: NoisyClassifier,
    x: Array,
    labels: Array,
    *,
    steps: int,
    batch_size: int = 256,
    lr: float = 1e-3,
    warmup_steps: int = 0,
    grad_clip: float | None = 1.0,
    ema_decay: float = 0.999,
    seed: int = 0,
    progress: bool = False,
) -> tuple[NoisyClassifier, TrainState]:
    """Train ``classifier`` with ``objective`` on labelled arrays (no files written).

    Args:
      objective: a classifier objective (``NoisyCrossEntropy``, ``DLSM``) on the classifier's
        process.
      classifier: the initial classifier (``NoisyClassifier.create(process, model)``).
      x: ``[n, *data_shape]`` clean training data; labels: ``[n]`` int classes.
      steps: optimizer steps (>= 0); batch_size: examples per step.
      lr, warmup_steps, grad_clip: Adam's (:func:`scorelib.training.make_optimizer`).
      ema_decay: the EMA decay (with the warm-up ramp of :class:`scorelib.training.EMA`).
      seed: the seed of the batches, noise levels and noise.
      progress: show a progress bar.

    Returns:
      ``(classifier with the EMA parameters, final TrainState)``.

    Raises:
      ValueError: naming the argument (``objective`` on another process than the
        classifier's, ``labels``, ``steps``, ...); ``FloatingPointError`` on a non-finite
        loss.
    """
    require(
        getattr(objective, "process", None) == classifier.process,
        "objective",
        f"an objective on the classifier's process {classifier.process!r}",
        getattr(objective, "process", type(objective).__name__),
    )
    steps = check_int(steps, "steps", low=0)
    optimizer = make_optimizer(lr, warmup_steps, grad_clip)
    ema = EMA(batch_size=check_int(batch_size, "batch_size", low=1), decay=ema_decay)
    step = make_classifier_step(
        objective,
        classifier_source(classifier),
        optimizer,
        ema,
        labelled_batches(x, labels, batch_size, seed),
    )
    state = create_state(classifier.params, optimizer, seed)
    state = train(
        state,
        step,
        num_steps=steps,
        log_every=max(1, min(100, steps)),
        progress=progress,
        handle_signals=False,
        tensorboard=False,
    )
    return classifier.replace(params=state.ema_params), state
