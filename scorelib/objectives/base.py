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


def example_draws(key: jax.Array, x0: Array, scalar: str) -> tuple[Array, Array]:
    """Each example's noise level draw and Gaussian noise, from its own key.

    Example ``b`` uses only ``fold_in(key, b)`` (split into a scalar key and a noise
    key), so its draws do not depend on the batch size, and a batch sharded over
    devices gets the same noise as on one device (DESIGN: per-example keys).

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
    if scalar not in ("uniform", "normal"):
        raise ValueError(f"scalar must be 'uniform' or 'normal'; got {scalar!r}")
    draw = jax.random.uniform if scalar == "uniform" else jax.random.normal

    def one(i):
        ks, ke = jax.random.split(jax.random.fold_in(key, i))
        return draw(ks, (), x0.dtype), jax.random.normal(ke, x0.shape[1:], x0.dtype)

    return jax.vmap(one)(jnp.arange(x0.shape[0]))


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
