"""The Langevin corrector: unadjusted Langevin steps at a fixed time, shared by PC sampling
and annealed Langevin dynamics, and callable alone.

One step (Song & Ermon 2019, Algorithm 1 line 6; Song et al. 2021, Algorithms 4-5)::

    x <- x + eps s(x) + sqrt(2 eps) z,    z ~ N(0, I)

with ``s`` the score of the density to sample and ``eps > 0`` a step size that depends
on the time (and, in PC, the grid) only, never on the state: then the chain is the unadjusted
Langevin algorithm (ULA) with a fixed step, whose stationary law is the target up to an
``O(eps)`` discretisation bias (for ``N(m, v)`` exactly ``N(m, v / (1 - eps / (2 v)))``,
Roberts & Tweedie 1996), and every chain is independent of the others in its batch.
The step loop is a ``lax.scan``: compile time does not grow with the number of steps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_int, check_real, require
from scorelib.keys import example_keys
from scorelib.samplers.driver import check_key, normal, x64_scope
from scorelib.scores.base import ScoreSource

Array = Any


def langevin_steps(
    score_fn: Callable[[Array], Array],
    x: Array,
    step_size: Array,
    keys: jax.Array,
    n_steps: int,
    *,
    first_noise: int = 0,
    unroll: int = 1,
) -> Array:
    """``n_steps`` steps ``x <- x + step_size score_fn(x) + sqrt(2 step_size) z_j`` (traced).

    The building block of :func:`langevin_corrector`, PC's corrector and annealed
    Langevin; call it inside ``jit``.

    Args:
      score_fn: ``x -> score``, ``[batch, *data_shape]`` to the same shape.
      x: ``[batch, *data_shape]`` start.
      step_size: the step ``eps > 0``: a scalar, or anything broadcasting against ``x``.
      keys: ``[batch]`` per-example keys; step ``j`` (0-based) draws
        ``z_j = normal(fold_in(keys[b], first_noise + j))`` for example ``b``.
      n_steps: number of steps (a Python int >= 0).
      first_noise: the fold-in index of the first step's noise.
      unroll: ``lax.scan`` unroll factor.

    Returns:
      ``[batch, *data_shape]``, the state after ``n_steps`` steps.
    """

    def body(x, j):
        s = score_fn(x)
        z = normal(keys, j, x.shape[1:], x.dtype)
        return x + step_size * s + jnp.sqrt(2 * step_size) * z, None

    js = jnp.arange(first_noise, first_noise + n_steps)
    return jax.lax.scan(body, x, js, unroll=unroll)[0]


def corrector_step_size(process, t: Array, *, snr: float, alpha_ratio: Array = 1.0) -> Array:
    """PC's Langevin step at time ``t``: ``eps = 2 a (snr sigma(t))^2``.

    ``sigma(t)`` is the process's noise std (data units, process frame) and
    ``a = alpha_ratio``, the ``alpha_i`` of Song et al. 2021, Algorithm 5 (1 for VE, and
    for VP ``1 - beta_i``, derived here as ``(alpha(t_i) / alpha(t_{i+1}))^2``).

    Derivation from Song et al. 2021, Algorithms 4-5 (``eps = 2 a (snr ||z|| / ||s||)^2``):
    where ``p_t`` is noise-dominated, ``s(x, t) ~ -(x - alpha mu) / sigma(t)^2`` and
    ``||s|| ~ sqrt(d) / sigma(t) ~ ||z|| / sigma(t)``, so the paper's rule takes this step
    in expectation, and ``snr`` keeps its meaning, the ratio of the drift ``eps ||s||`` to
    the noise ``sqrt(2 eps) ||z||`` (about ``sqrt(a) snr``). What differs: the paper's step
    depends on each chain's own ``||s||``. ULA with a state-dependent step ``eps(x)``
    leaves ``p(x) / eps(x)`` invariant (for small steps), not ``p``: for ``N(0, v I)`` in
    ``d`` dimensions the variance becomes ``v (d + 2) / d`` (std 3.87 instead of 3 at
    ``d = 3``, ``v = 9``), and where ``s = 0`` the step is infinite (a NaN state). The
    batch-mean norms of the reference code (score_sde ``LangevinCorrector``) avoid that
    but make each sample depend on its batch. Where ``p_t`` is data-dominated (low
    noise), ``||s||`` is below ``sqrt(d) / sigma(t)`` along directions of data variance,
    so the paper's step is larger than this one there.

    Args:
      process: the noise process.
      t: process time, scalar (or ``[batch]``).
      snr: the signal-to-noise ratio (> 0; score_sde uses 0.16 for VE CIFAR-10).
      alpha_ratio: ``a`` above (1 when the step is used alone).

    Returns:
      ``eps``, the shape of ``t``.
    """
    return 2 * alpha_ratio * (snr * process.sigma(t)) ** 2


@functools.partial(jax.jit, static_argnames=("n_steps",))
def _corrector(source, key, x, t, step_size, first_index, *, n_steps):
    keys = example_keys(key, x.shape[0], first_index)
    return langevin_steps(lambda y: source.score(y, t), x, step_size, keys, n_steps)


def _scalar(value: Any) -> Any:
    """A 0-d numpy or JAX array as a Python float (for the host checks); else ``value``."""
    if isinstance(value, (np.ndarray, jax.Array)) and np.ndim(value) == 0:
        return float(value)
    return value


def langevin_corrector(
    source, key, x, t, *, step_size, n_steps: int, first_index: int = 0, float64: bool = False
) -> Array:
    """``n_steps`` Langevin steps targeting ``p_t`` from ``x`` (the corrector alone).

    ``x <- x + eps s(x, t) + sqrt(2 eps) z`` with the fixed step ``eps = step_size``
    (e.g. ``corrector_step_size(source.process, t, snr=0.16)``, PC's rule; Song et al.
    2021, Algorithm 4 with the step of :func:`corrector_step_size`).

    Keys: example ``b`` owns ``k_b = fold_in(key, first_index + b)``; its step ``j``
    (0-based) draws ``normal(fold_in(k_b, j))``, so a chain does not depend on its batch.

    Args:
      source: a ``ScoreSource`` (the score of ``p_t``).
      key: one PRNG key (typed or raw).
      x: ``[batch, *data_shape]`` start states in process coordinates.
      t: process time (a real scalar in ``[process.t_min, process.t_max]``).
      step_size: ``eps > 0`` (a real scalar, data units squared).
      n_steps: number of steps (>= 0).
      first_index: global index of ``x[0]`` (>= 0).
      float64: run in float64 (scoped ``jax.enable_x64``).

    Returns:
      ``[batch, *data_shape]`` states after ``n_steps`` steps (float32, or float64).

    Raises:
      ValueError: naming ``source``, ``key``, ``x``, ``t``, ``step_size``, ``n_steps``,
        ``first_index`` or ``float64``, before anything is compiled.
    """
    require(
        isinstance(source, ScoreSource), "source", "a scorelib ScoreSource", type(source).__name__
    )
    check_key(key)
    shape = tuple(np.shape(x))
    data_shape = getattr(source, "data_shape", None)
    require(
        len(shape) >= 2 and shape[0] >= 1 and (not data_shape or tuple(data_shape) == shape[1:]),
        "x",
        f"of shape [batch >= 1, *data_shape] (data_shape {data_shape})",
        f"shape {shape}",
    )
    p = source.process
    t = check_real(_scalar(t), "t", low=p.t_min, high=p.t_max)
    step_size = check_real(
        _scalar(step_size), "step_size", low=0.0, low_open=True, high=np.inf, high_open=True
    )
    n_steps = check_int(n_steps, "n_steps", low=0)
    check_int(first_index, "first_index", low=0)
    require(isinstance(float64, bool), "float64", "a bool", float64)
    with x64_scope(float64):
        dtype = jnp.float64 if float64 else jnp.float32
        return _corrector(
            source,
            key,
            jnp.asarray(x, dtype),
            jnp.asarray(t, dtype),
            jnp.asarray(step_size, dtype),
            first_index,
            n_steps=n_steps,
        )
