"""The sigma-CFDM sampler: Euler in rectified-flow time from an exact draw at ``T``.

Scarvelis, Saez de Ocariz Borde and Solomon, "Closed-form diffusion models" (arXiv
2310.12395), Algorithm 1 as the unofficial ports implement it:

1. Start at flow time ``T`` in ``[0, 1)``. The marginal of the training set there is the
   *unsmoothed* mixture ``(1/N) sum_i N(T x_i, (1 - T)^2 I)``, so ``x_T = T x_i + (1 - T) xi``
   with ``i ~ U{1..N}``, ``xi ~ N(0, I)`` is an exact draw (no score evaluation).
2. Euler steps ``x <- x + h v(x, s)`` with ``v = (D(x, s) - x) / (1 - s)``
   (:func:`scorelib.processes.rectified.flow_velocity`) from ``s = T`` to ``s = 1 - h``
   (``T = 0`` starts at ``s = h``, which is then drawn exactly as in 1).

``h = (1 - T) / n`` with ``n = round((1 - T) S)`` steps, i.e. ``h = 1 / S`` when ``T`` lies
on the ``1/S`` grid (the paper's defaults ``S = 100``, ``T = 0.95``: 5 steps). The last
step lands exactly on ``D(x, 1 - h)`` (``x + h (D - x) / h``).

This sampler does not fit the driver's ``StepRule`` contract (its grid is in flow time,
not VE levels, its start is a draw from the training set, and its source's smoothing draws
must follow the example index), so it is a function with the library's key rule instead:
example ``b`` owns ``k_b = fold_in(key, first_index + b)``; its start index is
``randint(fold_in(k_b, 1))``, its start noise ``normal(fold_in(k_b, 2))`` and its smoothing
draws come from ``fold_in(k_b, 0)`` (``scorelib/scores/smoothed.py``). Every registered sampler
runs on a :class:`~scorelib.scores.smoothed.SmoothedScore` too: the driver binds its draws to
each block's examples (``scorelib/samplers/driver.py``).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from scorelib._checks import check_int, check_real, require
from scorelib.keys import example_keys
from scorelib.processes.rectified import RectifiedFlow, flow_velocity, process_time
from scorelib.scores.empirical import EmpiricalScore
from scorelib.scores.smoothed import SmoothedScore

Array = Any


def cfdm_steps(T: float, S: int) -> tuple[float, int, float]:
    """``(start, n, h)``: the flow-time start, the number of Euler steps and their size.

    Raises:
      ValueError: naming ``sampler.T`` (``[0, 1)``) or ``sampler.S`` (``>= 1``), or when
        no step fits between ``T`` and 1.
    """
    T = check_real(T, "sampler.T", low=0.0, high=1.0, high_open=True)
    S = check_int(S, "sampler.S", low=1)
    start = max(T, 1.0 / S)
    n = int(round((1.0 - start) * S))
    require(n >= 1, "sampler.T", f"at most 1 - 1/sampler.S = {1 - 1 / S} (one Euler step)", T)
    return start, n, (1.0 - start) / n


def training_table(source) -> EmpiricalScore:
    """The training set behind a source (its estimator's table)."""
    est = source.estimator if isinstance(source, SmoothedScore) else source
    return getattr(est, "table", est)


def mixture_draw(table, keys: jax.Array, s: float, dtype) -> Array:
    """``[batch, d]`` exact draws ``s x_i + (1 - s) xi`` of the mixture at flow time ``s``."""
    n = jnp.sum(table.valid)  # the valid rows are a prefix
    d = table.data.shape[1]

    def one(k):
        i = jax.random.randint(jax.random.fold_in(k, 1), (), 0, n)
        xi = jax.random.normal(jax.random.fold_in(k, 2), (d,), dtype)
        return s * table.data[i].astype(dtype) + (1.0 - s) * xi

    return jax.vmap(one)(keys)


@functools.partial(jax.jit, static_argnames=("batch", "start", "n", "h"))
def _run(source, key, first_index, *, batch, start, n, h):
    keys = example_keys(key, batch, first_index)
    if isinstance(source, SmoothedScore):
        source = source.replace(keys=keys)
    table = training_table(source)
    x = mixture_draw(table, keys, start, jnp.float32)
    shape = (batch, *source.data_shape)
    x = x.reshape(shape)

    def step(x, j):
        s = start + j * h
        d = source.denoiser(x, process_time(s))
        return x + h * flow_velocity(x, s, d), None

    x, _ = jax.lax.scan(step, x, jnp.arange(n, dtype=jnp.float32))
    return x


def cfdm_sample(source, key, batch: int, *, T: float = 0.95, S: int = 100, first_index=0):
    """sigma-CFDM samples (module docstring): ``(x [batch, *data_shape], info)``.

    Args:
      source: a :class:`SmoothedScore` or an :class:`EmpiricalScore` on the
        :class:`RectifiedFlow` process.
      key: one PRNG key.
      batch: samples in this call (>= 1).
      T: start flow time in ``[0, 1)``.
      S: the step count of the unit interval (``h = 1/S``).
      first_index: global index of example 0 (>= 0).

    Returns:
      ``x`` in data units and ``info = {"nfe": n, "steps": n, "start": T}`` (the start
      draw costs no evaluation; each evaluation of a smoothed source is ``M`` posterior
      means).

    Raises:
      ValueError: naming ``score.process``, ``sampler.T``, ``sampler.S``, ``batch`` or
        ``first_index``, before anything is compiled.
    """
    require(
        isinstance(source, (SmoothedScore, EmpiricalScore)),
        "source",
        "a SmoothedScore or EmpiricalScore",
        type(source).__name__,
    )
    require(
        isinstance(source.process, RectifiedFlow),
        "score.process",
        "RectifiedFlow (the sampler integrates in rectified-flow time)",
        type(source.process).__name__,
    )
    start, n, h = cfdm_steps(T, S)
    batch = check_int(batch, "batch", low=1)
    first_index = check_int(first_index, "first_index", low=0)
    x = _run(source, key, first_index, batch=batch, start=start, n=n, h=h)
    return x, {"nfe": n, "steps": n, "start": start}
