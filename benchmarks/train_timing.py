"""The EDM train step the scaling benchmarks time, and its timed block: one copy for
``benchmarks/scaling.py`` (forced CPU devices, 2 processes, SIGUSR1) and
``benchmarks/scaling_gpu.py`` (GPUs). Not a benchmark itself; the benchmarks run as scripts
from this folder and import it as ``train_timing``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import jax
import optax

from scorelib import parallel
from scorelib.objectives import EDMLoss
from scorelib.processes import EDM
from scorelib.training import EMA, make_train_step, network_source


def edm_train_step(
    graphdef: Any,
    optimizer: optax.GradientTransformation,
    batch_fn: Callable[[jax.Array], jax.Array],
    batch_size: int,
    ema_decay: float,
    mesh: jax.sharding.Mesh | None = None,
) -> Callable:
    """The jitted EDM train step (``EDMLoss`` under ``EDM()``, ``sigma_data = 0.5``) of the
    network ``graphdef``, with an EMA of constant ``ema_decay``.

    Args:
      graphdef: the network's graph definition (``scorelib.training.init_state``).
      optimizer: the optax transformation the state was made with.
      batch_fn: ``step -> x0 [batch_size, *data_shape]``, traceable.
      batch_size: the global batch (the EMA's batch size).
      ema_decay: the EMA's decay per step.
      mesh: split the batch along the mesh's ``data`` axis (the state placed with
        ``scorelib.parallel.shard``); ``None``: one device.

    Returns:
      ``step(state) -> (state, metrics)`` (``scorelib.training.make_train_step``).
    """
    process = EDM()
    return make_train_step(
        EDMLoss(process=process),
        network_source(process, graphdef, 0.5),
        optimizer,
        EMA(batch_size=batch_size, decay=ema_decay),
        batch_fn,
        batch_sharding=None if mesh is None else parallel.batch_sharding(mesh),
    )


def run_steps(step: Callable, state: Any, n: int) -> Any:
    """``n`` steps from ``state``, waiting for the loss every 10 steps as the training loop
    does (more unsynchronised collective steps can deadlock XLA:CPU) and after the last."""
    for k in range(n):
        state, m = step(state)
        if (k + 1) % 10 == 0:
            jax.block_until_ready(m["loss"])
    jax.block_until_ready(m["loss"])
    return state


def best_block_seconds(step: Callable, state: Any, steps: int, repeats: int) -> tuple[Any, float]:
    """The fastest of ``repeats`` blocks of ``steps`` steps, after a 10-step compile and
    warm-up block.

    Returns:
      ``(state, seconds)``: the state after the last block and the minimum wall time of a
      block (``time.perf_counter``), in seconds.
    """
    state = run_steps(step, state, 10)  # compile + warm-up
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        state = run_steps(step, state, steps)
        best = min(best, time.perf_counter() - t0)
    return state, best
