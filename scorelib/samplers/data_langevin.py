"""Langevin dynamics on a vanilla score, started at the training data and stopped early.

Koehler and Vuong, "Sampling multimodal distributions with the vanilla score: benefits of
data-based initialization", ICLR 2024 (arXiv 2310.01762): with a score estimate ``s`` at
one noise level (or none), the unadjusted Langevin algorithm (ULA)::

    x_{k+1} = x_k + h s(x_k) + sqrt(2 h) z_k,    z_k ~ N(0, I)

started at a training example drawn uniformly and run for a short, early-stopped number of
steps ``K`` samples a mixture of log-concave components with the right component weights:
the weights come from the data, and within a component Langevin mixes fast. Langevin from
noise gets the weights wrong, because crossing between well-separated modes takes a time
exponential in the barrier, so each chain stays in the basin it starts in: mode masses
follow the basins' shares of the start law, not the weights. Run too long on an estimated
score, a chain from the data drifts where the estimate is poor (away from the data), which
is what stopping early avoids. ``h`` and ``K`` are the method's two parameters; the paper
sets them by its theory (``h K`` short against the inter-mode mixing time, long against the
within-mode one); here they are arguments, and the table ``table=data_langevin`` sweeps
``K``.

The score is any :class:`~scorelib.scores.base.ScoreSource` at one fixed time ``t`` of its
process (the "vanilla" estimate): a network trained at one noise level, a closed-form
score of the data law (``GaussianMixtureTarget.noisy_score`` at a small ``t``), or an
empirical or smoothed score of the training set.

Keys (``scorelib.keys``): chain ``b`` owns ``k_b = fold_in(key, first_index + b)``; its
start is ``data[randint(fold_in(k_b, 0), 0, N)]`` (:func:`langevin_from_data`) or
``init_scale * normal(fold_in(k_b, 0))`` (:func:`langevin_from_noise`), and step ``j``
(0-based) draws ``normal(fold_in(fold_in(k_b, 1), j))``. A chain's states depend only on
the key and its global index, not on the batch it runs in, and the state after ``K`` steps
is the same whether the run stops at ``K`` or records ``K`` on the way to a later stop.

Stationary law and bias: for ``N(m, v)`` the ULA chain with step ``h < 2 v`` has variance
``v_k = v_inf + (1 - h / v)^(2k) (v_0 - v_inf)`` after ``k`` steps, with ``v_inf = v / (1 -
h / (2 v))`` (Roberts and Tweedie 1996); the tests check this closed form.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_int, check_real, require
from scorelib.keys import example_keys
from scorelib.samplers.driver import check_key
from scorelib.samplers.langevin import langevin_steps
from scorelib.scores.base import ScoreSource, check_examples

Array = Any


def _stops(n_steps) -> tuple[int, ...]:
    """``n_steps`` (an int, or increasing ints) as a tuple of stopping steps.

    Raises:
      ValueError: naming ``n_steps`` (a negative count, or not strictly increasing).
    """
    stops = (n_steps,) if np.ndim(n_steps) == 0 else tuple(n_steps)
    require(len(stops) >= 1, "n_steps", "an integer >= 0 or increasing integers", n_steps)
    out = tuple(check_int(s, "n_steps", low=0) for s in stops)
    require(
        all(a < b for a, b in zip(out, out[1:], strict=False)),
        "n_steps",
        "an integer >= 0 or strictly increasing integers",
        list(out),
    )
    return out


def _check(source, t, step_size, num_samples, first_index) -> tuple[float, float, int, int]:
    require(
        isinstance(source, ScoreSource), "source", "a scorelib ScoreSource", type(source).__name__
    )
    p = source.process
    t = check_real(t, "t", low=float(p.t_min), high=float(p.t_max))
    h = check_real(step_size, "step_size", low=0.0, low_open=True, high_open=True)
    n = check_int(num_samples, "num_samples", low=1)
    first = check_int(first_index, "first_index", low=0)
    return t, h, n, first


@functools.partial(jax.jit, static_argnames=("stops",))
def _chains(source, x0, keys, t, h, *, stops):
    """The states at each of ``stops``: ``[len(stops), batch, *data_shape]``."""
    chain_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, 1)
    tt = jnp.full((x0.shape[0],), t, x0.dtype)

    def score_fn(x):
        return source.score(x, tt)

    out, x, done = [], x0, 0
    for stop in stops:
        x = langevin_steps(score_fn, x, h, chain_keys, stop - done, first_noise=done)
        done = stop
        out.append(x)
    return jnp.stack(out)


def _result(states, stops, n_steps) -> np.ndarray:
    x = np.asarray(states)
    return x[0] if np.ndim(n_steps) == 0 else x


def langevin_from_data(
    source,
    key,
    data,
    *,
    t: float,
    step_size: float,
    n_steps: int | Sequence[int],
    num_samples: int,
    first_index: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Early-stopped Langevin from the data (Koehler and Vuong 2024; module docstring).

    Args:
      source: the vanilla score, a :class:`ScoreSource`, queried at time ``t`` only.
      key: one PRNG key (module docstring, "Keys").
      data: ``[N, *data_shape]`` training examples (data units); each chain starts at one
        drawn uniformly (with replacement).
      t: the source's time of the vanilla score, in ``[t_min, t_max]`` of its process (for
        EDM, ``t = sigma``).
      step_size: the ULA step ``h > 0`` (data units squared).
      n_steps: the stopping step ``K >= 0``, or strictly increasing stopping steps to record
        on one run (the state after ``K`` steps is the same either way).
      num_samples: chains (= samples), ``>= 1``.
      first_index: global index of the first chain (``>= 0``), to split a run into batches.

    Returns:
      ``(x, start)``: ``x`` ``[num_samples, *data_shape]`` (``[len(n_steps),
      num_samples, *data_shape]`` for a sequence), float numpy; ``start`` ``[num_samples]``
      the index into ``data`` of each chain's start.

    Raises:
      ValueError: naming ``source``, ``key``, ``data`` (not ``[N, *data_shape]`` of the
        source's shape, non-finite), ``t``, ``step_size``, ``n_steps``, ``num_samples`` or
        ``first_index``, before anything is compiled.
    """
    check_key(key)
    t, h, n, first = _check(source, t, step_size, num_samples, first_index)
    stops = _stops(n_steps)
    data = jnp.asarray(data)
    require(data.ndim >= 2 and len(data) >= 1, "data", "[N, *data_shape] with N >= 1", data.shape)
    check_examples(source, data, "data")
    require(bool(jnp.isfinite(data).all()), "data", "finite values", "NaN or inf")
    keys = example_keys(key, n, first)
    start = jax.vmap(lambda k: jax.random.randint(jax.random.fold_in(k, 0), (), 0, len(data)))(keys)
    states = _chains(source, data[start], keys, jnp.asarray(t, data.dtype), h, stops=stops)
    return _result(states, stops, n_steps), np.asarray(start)


def langevin_from_noise(
    source,
    key,
    data_shape: Sequence[int],
    *,
    t: float,
    step_size: float,
    n_steps: int | Sequence[int],
    num_samples: int,
    init_scale: float = 1.0,
    first_index: int = 0,
) -> np.ndarray:
    """Plain Langevin on the same vanilla score, started from ``N(0, init_scale^2 I)``: the
    baseline :func:`langevin_from_data` is compared with.

    Args:
      source, key, t, step_size, n_steps, num_samples, first_index: as
        :func:`langevin_from_data`.
      data_shape: the shape of one example.
      init_scale: the start's standard deviation (data units, ``> 0``).

    Returns:
      ``[num_samples, *data_shape]`` (``[len(n_steps), ...]`` for a sequence), float32 numpy.

    Raises:
      ValueError: naming the argument at fault, before anything is compiled.
    """
    check_key(key)
    t, h, n, first = _check(source, t, step_size, num_samples, first_index)
    stops = _stops(n_steps)
    scale = check_real(init_scale, "init_scale", low=0.0, low_open=True)
    shape = tuple(check_int(s, "data_shape", low=1) for s in np.atleast_1d(data_shape))
    expected, _ = source.expected_data_shape()
    require(
        expected is None or shape == tuple(expected),
        "data_shape",
        f"the source's data shape {list(expected or [])}",
        list(shape),
    )
    keys = example_keys(key, n, first)
    x0 = scale * jax.vmap(lambda k: jax.random.normal(jax.random.fold_in(k, 0), shape))(keys)
    check_examples(source, x0, "data_shape")
    states = _chains(source, x0, keys, jnp.float32(t), h, stops=stops)
    return _result(states, stops, n_steps)


__all__ = ["langevin_from_data", "langevin_from_noise"]
