"""The train state: everything a resumed run needs, as one pytree.

``TrainState`` holds the parameters, their EMA, the optimizer state (which
includes Adam's moments and the schedule count), the step, the base PRNG key
and the counters of non-finite steps. Checkpointing this single pytree is
what makes an interrupted-and-resumed run equal an uninterrupted one bit for
bit: no counter lives outside it.

A state may also hold several parts trained by one optimizer each (distillation's
student, fake score and discriminator): ``params`` and ``opt_state`` are then dicts of
parts, ``ema_params`` the EMA of one part, and a step updates some of the parts
(:func:`scorelib.training.apply_update`). Per-run state of a kind of training that the
step carries along (distillation's ratio means) goes in a subclass's extra fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from scorelib._checks import require


class TrainState(struct.PyTreeNode):
    """Training state (all fields are arrays or pytrees of arrays).

    Attributes:
      params: the trainable parameters (an ``nnx.State`` of ``nnx.Param``), or a dict
        ``{part: parameters}`` of parts with one optimizer each.
      ema_params: exponential moving average of ``params`` (same structure), or of
        ``params[ema_part]`` (see :meth:`create`).
      opt_state: the optax optimizer state, or a dict ``{part: optimizer state}``.
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

    @classmethod
    def create(
        cls,
        params: Any,
        optimizer: optax.GradientTransformation | Mapping[str, optax.GradientTransformation],
        seed: int,
        *,
        ema_part: str | None = None,
        **fields: Any,
    ):
        """A fresh state at step 0 with ``ema_params`` a copy of ``params`` (or of
        ``params[ema_part]``).

        Args:
          params: a pytree of float arrays, or a dict ``{part: pytree}`` when
            ``optimizer`` is a dict.
          optimizer: the optax transformation that will update ``params``, or a dict
            ``{part: transformation}`` with the keys of ``params``.
          seed: integer seed of the base key (the objective's times/noise and dropout).
          ema_part: the part whose EMA ``ema_params`` holds (a multi-part state); ``None``:
            the EMA of all of ``params``.
          **fields: a subclass's extra fields.

        Every leaf is committed to one device when some are (parameters restored from a
        checkpoint are, the fresh parts are not): the jitted step's cache key includes
        which inputs are committed and its outputs all are, so a mixed state would
        compile the step a second time at step 1.

        Raises:
          ValueError: naming ``params`` when the parts of ``params`` and ``optimizer``
            differ, or ``ema_part`` when it is not one of them.
        """
        copy = lambda tree: jax.tree.map(lambda x: jnp.array(x, copy=True), tree)  # noqa: E731
        if isinstance(optimizer, Mapping):
            parts = sorted(optimizer)
            require(
                isinstance(params, Mapping) and sorted(params) == parts,
                "params",
                f"a dict with the optimizers' parts {parts}",
                sorted(params) if isinstance(params, Mapping) else type(params).__name__,
            )
            require(ema_part is None or ema_part in parts, "ema_part", f"one of {parts}", ema_part)
            params = {k: copy(params[k]) for k in optimizer}
            opt_state = {k: optimizer[k].init(params[k]) for k in optimizer}
        else:
            require(ema_part is None, "ema_part", "None for a single-optimizer state", ema_part)
            params = copy(params)
            opt_state = optimizer.init(params)
        state = cls(
            params=params,
            # a separate buffer: the train step donates the state, and one buffer may not
            # be donated twice
            ema_params=copy(params if ema_part is None else params[ema_part]),
            opt_state=opt_state,
            step=jnp.zeros((), jnp.int32),
            key=jax.random.key_data(jax.random.key(seed)),
            n_skipped=jnp.zeros((), jnp.int32),
            first_nonfinite=jnp.full((), -1, jnp.int32),
            **fields,
        )
        concrete = [x for x in jax.tree.leaves(state) if not isinstance(x, jax.core.Tracer)]
        devices = {d for x in concrete if getattr(x, "committed", False) for d in x.devices()}
        if len(devices) == 1:
            state = jax.device_put(state, devices.pop())
        return state


def create_state(params: Any, optimizer: optax.GradientTransformation, seed: int) -> TrainState:
    """A fresh ``TrainState`` at step 0 with ``ema_params`` a copy of ``params``
    (:meth:`TrainState.create` with one optimizer).

    Args:
      params: a pytree of float arrays.
      optimizer: the optax transformation that will update ``params``.
      seed: integer seed of the base key (the objective's times/noise and dropout).
    """
    return TrainState.create(params, optimizer, seed)


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
