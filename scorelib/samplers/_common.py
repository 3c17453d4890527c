"""Shared pieces of every sampler: input validation (on the host, before any
compilation), per-example keys, noise draws, and the time/frame conversions.

Key scheme (documented, relied on by tests and by anyone who needs to reproduce a
draw): example ``b`` of a call owns ``k_b = fold_in(key, first_index + b)``.
Its starting draw is ``normal(fold_in(k_b, 0), data_shape)``; step ``i`` (0-based,
counted along the grid) draws ``normal(fold_in(fold_in(k_b, i + 1), j), data_shape)``
for its ``j``-th noise vector (``j = 0`` first). So a sample does not depend on the
batch it was drawn in, only on ``key`` and its global index.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib.scores.base import ScoreSource

Array = Any


# --------------------------------------------------------------------------- host side
def check_common(source, shape, grid, x_T, first_index, float64) -> tuple[tuple, np.ndarray]:
    """Validate the arguments shared by every sampler; return ``(shape, grid)``.

    ``grid`` comes back as float64 numpy. Raises ``ValueError`` naming the argument.
    """
    if not isinstance(source, ScoreSource):
        raise ValueError(
            f"source must be a scorelib ScoreSource; got {type(source).__name__}"
        )
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ValueError(f"shape must be a tuple (batch, *data_shape); got {shape!r}") from None
    if len(shape) < 1 or any(s < 1 for s in shape):
        raise ValueError(
            f"shape must be (batch, *data_shape) with every size >= 1; got {shape}"
        )
    data_shape = getattr(source, "data_shape", None)
    if data_shape and tuple(data_shape) != shape[1:]:
        raise ValueError(
            f"shape[1:] must equal the source's data_shape {tuple(data_shape)}; got "
            f"shape {shape}"
        )
    g = np.asarray(grid, dtype=np.float64)
    if g.ndim != 1 or g.shape[0] < 2:
        raise ValueError(
            f"sampler.grid must be 1-D with at least 2 points (N + 1 for N >= 1 steps); got "
            f"shape {g.shape}"
        )
    if not np.all(np.isfinite(g)):
        raise ValueError("sampler.grid must be finite")
    if not (np.all(g[:-1] > 0) and g[-1] >= 0):
        raise ValueError(
            "sampler.grid must hold VE noise levels > 0, except the last which may be exactly 0; "
            f"got {g}"
        )
    cast = g.astype(np.float64 if float64 else np.float32)
    if not np.all(np.diff(cast) < 0):
        raise ValueError(
            "sampler.grid must be strictly decreasing"
            + ("" if float64 else " in float32 (use float64=True for finer grids)")
        )
    if x_T is not None and tuple(np.shape(x_T)) != shape:
        raise ValueError(f"x_T must have shape {shape} (= shape); got {tuple(np.shape(x_T))}")
    if isinstance(first_index, bool) or not isinstance(first_index, (int, np.integer)) or (
        first_index < 0
    ):
        raise ValueError(f"first_index must be an integer >= 0; got {first_index!r}")
    if not isinstance(float64, bool):
        raise ValueError(f"float64 must be a bool; got {float64!r}")
    return shape, g


def check_key(key) -> None:
    """Raise ``ValueError`` unless ``key`` is a typed PRNG key or a raw ``uint32[2]`` key."""
    dtype = getattr(key, "dtype", None)
    typed = dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    raw = dtype == np.uint32 and tuple(np.shape(key)) == (2,)
    if not ((typed and np.shape(key) == ()) or raw):
        raise ValueError(
            "key must be one PRNG key (jax.random.key(seed) or jax.random.PRNGKey(seed)); got "
            f"{type(key).__name__} of shape {np.shape(key)}"
        )


def require(cond: bool, field: str, allowed: str, value: Any) -> None:
    """Raise ``ValueError('sampler.<field> must be <allowed>; got <value>')`` unless ``cond``."""
    if not cond:
        raise ValueError(f"sampler.{field} must be {allowed}; got {value!r}")


def check_real(value, field: str, *, low: float, low_open: bool, high: float = math.inf):
    """A finite-or-inf real in ``(low, high]`` / ``[low, high]``; returns it as float."""
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    v = float(value) if ok else math.nan
    ok = ok and not math.isnan(v) and (v > low if low_open else v >= low) and v <= high
    bracket = "(" if low_open else "["
    require(ok, field, f"a number in {bracket}{low}, {high}]", value)
    return v


def check_int(value, field: str, *, low: int) -> int:
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= low
    require(ok, field, f"an integer >= {low}", value)
    return int(value)


def x64_scope(float64: bool):
    """``jax.enable_x64(True)`` when ``float64`` (scoped: nothing leaks out), else a no-op."""
    return jax.enable_x64(True) if float64 else contextlib.nullcontext()


# --------------------------------------------------------------------------- traced side
def example_keys(key: jax.Array, first_index: Array, batch: int) -> jax.Array:
    """``[batch]`` keys ``fold_in(key, first_index + b)``."""
    idx = jnp.asarray(first_index, jnp.uint32) + jnp.arange(batch, dtype=jnp.uint32)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, idx)


def step_keys(keys: jax.Array, i: Array) -> jax.Array:
    """Per-example keys of grid step ``i`` (0-based): ``fold_in(k_b, i + 1)``."""
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, i + 1)


def normal(keys: jax.Array, j: Array, data_shape: tuple, dtype) -> Array:
    """``[batch, *data_shape]`` standard normals, example ``b`` from ``fold_in(keys[b], j)``."""

    def one(k):
        return jax.random.normal(jax.random.fold_in(k, j), data_shape, dtype)

    return jax.vmap(one)(keys)


def per_example(v: Array, x: Array) -> Array:
    """Reshape ``[batch]`` to ``[batch, 1, ..., 1]`` to broadcast against ``x``."""
    return jnp.reshape(v, v.shape + (1,) * (x.ndim - 1))


def initial_state(process, keys, sigma0, x_T, shape, dtype) -> Array:
    """The starting state in process coordinates at VE level ``sigma0``.

    ``x_T`` when given; else ``alpha(t0) * sigma0 * eps`` with ``eps`` from
    ``fold_in(k_b, 0)``: the noise-only approximation of ``p_{t0}`` (Karras et al.
    2022, Algorithm 1 line 2, ``x_0 ~ N(0, t_0^2 I)``, mapped to the process frame).
    When the grid starts at the process's ``t_max`` this is the process prior
    ``N(0, prior_std^2 I)`` (exactly for VE and EDM; for VP and sub-VP up to
    ``sigma(t_max) = 1 - O(alpha(t_max)^2)``).
    """
    if x_T is not None:
        return jnp.asarray(x_T, dtype)
    t0 = process.t_of_ve_sigma(sigma0)
    scale = process.alpha(t0) * sigma0
    return (scale * normal(keys, 0, shape[1:], dtype)).astype(dtype)


def ve_denoiser(source, x_ve: Array, sigma: Array) -> Array:
    """``D(alpha x_ve, t(sigma))``: the denoiser in the VE frame at level ``sigma > 0``."""
    process = source.process
    t = process.t_of_ve_sigma(sigma)
    a = process.alpha(t)
    return source.denoiser(a * x_ve, t)


def n_scanned(n_steps: int, final_zero: bool) -> int:
    """Steps whose target level is positive (the last step to 0 is peeled off the scan)."""
    return n_steps - 1 if final_zero else n_steps
