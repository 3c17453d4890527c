"""The objective interface.

An objective is a frozen dataclass (a static pytree: hyperparameters only) that
maps a score source, a batch of clean data and a key to a loss::

    example_losses(source, x0, key) -> (losses [batch], aux)  # aux: dict of [batch] arrays
    example_points(x0, key)         -> (x_t, t)               # where example_losses trains
    __call__(source, x0, key)       -> (scalar loss, metrics) # mean over the batch

``source`` is any :class:`scorelib.scores.ScoreSource` (during training, a
``NetworkScore`` holding the parameters being trained). Per-example weights
(``scorelib/objectives/weights.py``) multiply per-example errors that are already
reduced over the data axes, so a ``[batch]`` weight can never broadcast against a
``[batch, *data_shape]`` error.

Class labels. A class-conditional source (:class:`scorelib.scores.ConditionalScore`)
carries the batch's labels, bound by the train step (``source.with_labels(labels)``,
``scorelib/training/step.py``); the objectives take no labels argument. An objective that
evaluates the source on the whole batch in order (DSM, the EDM loss, the smoothed-score
regression) needs nothing more: example ``b`` is scored with label ``b``. One that evaluates
it per example (SURE's divergence, the QC penalty's Jacobian probes) binds each example's
own label (:func:`example_source`), and one whose *label* depends on the class (TSM) reads
them with :func:`source_labels`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from scorelib._checks import check_choice, require
from scorelib.keys import example_keys
from scorelib.scores.conditional import ConditionalScore

Array = Any

REDUCTIONS = ("mean", "sum")


def example_draws(key: jax.Array, x0: Array, scalar: str) -> tuple[Array, Array]:
    """Each example's noise-level draw and Gaussian noise, from its own key.

    Example ``b`` uses only ``fold_in(key, b)`` (:func:`scorelib.keys.example_keys`),
    split into a scalar key and a noise key, so its draws do not depend on the batch
    size, and a batch sharded over devices gets the same noise as on one device.

    Args:
      key: the step's PRNG key.
      x0: ``[batch, *data_shape]`` clean data (only its shape and dtype are used).
      scalar: ``'uniform'`` (``u ~ U[0, 1)``) or ``'normal'`` (``z ~ N(0, 1)``).

    Returns:
      ``(s, eps)``: ``s: [batch]`` the scalar draws, ``eps: [batch, *data_shape]``
      standard normal noise, in ``x0.dtype``.

    Raises:
      ValueError: for an unknown ``scalar``.
    """
    check_choice(scalar, "scalar", ("uniform", "normal"))
    draw = jax.random.uniform if scalar == "uniform" else jax.random.normal

    def one(k):
        ks, ke = jax.random.split(k)
        return draw(ks, (), x0.dtype), jax.random.normal(ke, x0.shape[1:], x0.dtype)

    return jax.vmap(one)(example_keys(key, x0.shape[0]))


def source_labels(source, batch: int) -> Array | None:
    """The ``[batch]`` int32 class labels bound to ``source`` (``with_labels``; the null label
    ``num_classes`` for an example trained unconditionally), or ``None`` for an unconditional
    source or a conditional one without bound labels (it then answers with the null label).

    Raises:
      ValueError: naming ``labels`` when the bound labels are not one per example of the
        batch.
    """
    if not isinstance(source, ConditionalScore) or source.labels is None:
        return None
    labels = source.labels
    require(
        tuple(labels.shape) == (batch,),
        "labels",
        f"one class label per example of the batch ({batch})",
        f"shape {tuple(labels.shape)}",
    )
    return labels


def example_source(source, label: Array | None):
    """``source`` for one example: bound to ``label`` (a scalar, traced under ``vmap``) as a
    batch of one, or ``source`` itself when ``label`` is ``None``.

    For an objective that calls the source on one example at a time (inside ``jax.vmap``
    over the batch): the source's labels are bound to the whole batch, so each call must
    carry its own example's label (:func:`source_labels` gives them).
    """
    if label is None:
        return source
    return source.with_labels(jnp.reshape(label, (1,)))


def reduce_per_example(err: Array, reduce: str) -> Array:
    """Reduce ``err: [batch, *data_shape]`` to ``[batch]`` over the data axes.

    Args:
      err: per-coordinate errors.
      reduce: ``'mean'`` or ``'sum'``.

    Raises:
      ValueError: for another ``reduce`` (naming ``objective.reduce``).
    """
    check_choice(reduce, "objective.reduce", REDUCTIONS)
    axes = tuple(range(1, err.ndim))
    if reduce == "mean":
        return jnp.mean(err, axis=axes)
    return jnp.sum(err, axis=axes)


class Objective:
    """Base class; subclasses are frozen dataclasses registered as static pytrees.

    Subclasses implement :meth:`example_losses`; :meth:`__call__` averages it.
    """

    def example_losses(self, source, x0: Array, key: jax.Array) -> tuple[Array, dict]:
        """The loss of each example, before the batch mean.

        Args:
          source: a score source (usually ``NetworkScore`` with trainable params).
          x0: ``[batch, *data_shape]`` clean data.
          key: the step's PRNG key; example ``b`` draws from ``fold_in(key, b)``.

        Returns:
          ``(losses, aux)``: ``losses: [batch]`` and a dict of ``[batch]`` arrays (the
          draws, e.g. ``t`` or ``sigma``).
        """
        raise NotImplementedError

    def example_points(self, x0: Array, key: jax.Array) -> tuple[Array, Array]:
        """The noisy points and process times at which :meth:`example_losses` evaluates the
        source with the same ``x0`` and ``key`` (the same draws, recomputed).

        A penalty on the trained field (``scorelib.objectives.conservative``) is evaluated
        there, so it acts where the loss trains the network.

        Args:
          x0: ``[batch, *data_shape]`` clean data.
          key: the step's PRNG key, as given to :meth:`example_losses`.

        Returns:
          ``(x_t, t)``: ``[batch, *data_shape]`` points in process coordinates and ``[batch]``
          process times.

        Raises:
          NotImplementedError: for an objective that does not say where it trains.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not give the points it trains at (example_points)"
        )

    #: An objective whose loss changes with the training step (a ramp) sets this: the train
    #: step (:func:`scorelib.training.make_train_step`) then passes ``step``.
    uses_step = False

    def __call__(self, source, x0: Array, key: jax.Array, step=None) -> tuple[Array, dict]:
        """Mean loss over the batch and scalar metrics.

        Args:
          source: a score source (usually ``NetworkScore`` with trainable params).
          x0: ``[batch, *data_shape]`` clean data.
          key: a PRNG key for times and noise.
          step: the training step (a traced int), passed on to :meth:`example_losses` when
            given (objectives with :attr:`uses_step` only).

        Returns:
          ``(loss, metrics)`` with a scalar loss and a dict of scalars (the batch means
          of :meth:`example_losses`' ``aux``, and ``loss``).

        Raises:
          ValueError: if :meth:`example_losses` does not return a ``[batch]`` loss.
        """
        if step is None:
            losses, aux = self.example_losses(source, x0, key)
        else:
            losses, aux = self.example_losses(source, x0, key, step=step)
        if losses.shape != (x0.shape[0],):
            raise ValueError(
                f"example_losses returned shape {losses.shape}; expected ({x0.shape[0]},)"
            )
        metrics = {k: jnp.mean(v) for k, v in aux.items()}
        loss = jnp.mean(losses)
        metrics["loss"] = loss
        return loss, metrics

    def replace(self, **changes):
        """A copy with some fields changed (validated again, ``ValueError`` as the constructor)."""
        return dataclasses.replace(self, **changes)
