"""The train state: everything a resumed run needs, as one pytree.

``TrainState`` holds the parameters, their EMA, the optimizer state (which
includes Adam's moments and the schedule count), the step, the base PRNG key
and the counters of non-finite steps. Checkpointing this single pytree is
what makes an interrupted-and-resumed run equal an uninterrupted one bit for
bit: no counter lives outside it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct


class TrainState(struct.PyTreeNode):
    """Training state (all fields are arrays or pytrees of arrays).

    Attributes:
      params: the trainable parameters (an ``nnx.State`` of ``nnx.Param``).
      ema_params: exponential moving average of ``params`` (same structure).
      opt_state: the optax optimizer state.
      step: ``int32`` scalar, number of train steps taken (= the index of the next step).
      key: ``uint32`` key data (``jax.random.key_data``) of the base key; the key of
        step ``i`` is ``fold_in(key, i)``, so it never changes during a run.
      n_skipped: ``int32`` scalar, steps whose update was skipped because the loss or
        gradients were non-finite (``nonfinite='skip'``).
      first_nonfinite: ``int32`` scalar, index of the first step with a non-finite loss
        or gradient norm, ``-1`` if none.
    """

    params: Any
    ema_params: Any
    opt_state: Any
    step: jax.Array
    key: jax.Array
    n_skipped: jax.Array
    first_nonfinite: jax.Array

    @property
    def rng(self) -> jax.Array:
        """The base key as a typed PRNG key."""
        return jax.random.wrap_key_data(self.key)


def create_state(params: Any, optimizer: optax.GradientTransformation, seed: int) -> TrainState:
    """A fresh ``TrainState`` at step 0 with ``ema_params`` a copy of ``params``.

    Args:
      params: a pytree of float arrays.
      optimizer: the optax transformation that will update ``params``.
      seed: integer seed of the base key (the objective's times/noise and dropout).
    """
    copy = lambda tree: jax.tree.map(lambda x: jnp.array(x, copy=True), tree)
    return TrainState(
        params=copy(params),
        # a separate buffer: the train step donates the state, and one buffer may not
        # be donated twice
        ema_params=copy(params),
        opt_state=optimizer.init(params),
        step=jnp.zeros((), jnp.int32),
        key=jax.random.key_data(jax.random.key(seed)),
        n_skipped=jnp.zeros((), jnp.int32),
        first_nonfinite=jnp.full((), -1, jnp.int32),
    )


def init_state(
    model: nnx.Module, optimizer: optax.GradientTransformation, seed: int
) -> tuple[Any, TrainState]:
    """Split an NNX model into ``(graphdef, params)`` and build the initial ``TrainState``.

    Args:
      model: an ``nnx.Module`` whose state is only ``nnx.Param`` (e.g. ``nets.MLP``).
      optimizer: e.g. from :func:`scorelib.training.make_optimizer`.
      seed: seed of the base training key.

    Returns:
      ``(graphdef, state)``; rebuild the network with ``nnx.merge(graphdef, state.params)``.

    Raises:
      ValueError: (from ``nnx.split``) if the model holds state other than ``nnx.Param``.
    """
    graphdef, params = nnx.split(model, nnx.Param)
    return graphdef, create_state(params, optimizer, seed)


def abstract_state(state: TrainState) -> TrainState:
    """``jax.ShapeDtypeStruct`` leaves (with shardings) for restoring into ``state``'s layout."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        state,
    )
