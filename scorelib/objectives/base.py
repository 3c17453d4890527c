"""The objective interface.

An objective is a frozen dataclass (a static pytree: hyperparameters only) that
maps a score source, a batch of clean data and a key to a loss::

    per_example(source, x0, key) -> (loss [batch], aux)   # aux: dict of [batch] arrays
    __call__(source, x0, key)    -> (scalar loss, metrics) # mean over the batch

``source`` is any :class:`scorelib.scores.ScoreSource` (during training, a
``NetworkScore`` holding the parameters being trained). Per-example weights
multiply per-example errors that are already reduced over the data axes, so a
``[batch]`` weight can never broadcast against a ``[batch, *data_shape]``
error (fault kind 7).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

Array = Any

REDUCTIONS = ("mean", "sum")


def reduce_per_example(err: Array, reduce: str) -> Array:
    """Reduce ``[batch, *data_shape]`` to ``[batch]`` by ``'mean'`` or ``'sum'`` over data axes."""
    axes = tuple(range(1, err.ndim))
    if reduce == "mean":
        return jnp.mean(err, axis=axes)
    if reduce == "sum":
        return jnp.sum(err, axis=axes)
    raise ValueError(f"objective.reduce must be one of {list(REDUCTIONS)}; got {reduce!r}")


class Objective:
    """Base class; subclasses are frozen dataclasses registered as static pytrees."""

    def per_example(self, source, x0: Array, key: jax.Array) -> tuple[Array, dict]:
        raise NotImplementedError

    def __call__(self, source, x0: Array, key: jax.Array) -> tuple[Array, dict]:
        """Mean loss over the batch and scalar metrics.

        Args:
          source: a score source (usually ``NetworkScore`` with trainable params).
          x0: ``[batch, *data_shape]`` clean data.
          key: a PRNG key for times and noise.

        Returns:
          ``(loss, metrics)`` with a scalar loss and a dict of scalars.
        """
        per, aux = self.per_example(source, x0, key)
        if per.shape != (x0.shape[0],):
            raise ValueError(f"per-example loss has shape {per.shape}; expected ({x0.shape[0]},)")
        metrics = {k: jnp.mean(v) for k, v in aux.items()}
        loss = jnp.mean(per)
        metrics["loss"] = loss
        return loss, metrics

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def register(cls):
    jax.tree_util.register_static(cls)
    return cls
