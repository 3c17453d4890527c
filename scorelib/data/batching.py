"""Deterministic, per-step, per-process batches.

A batch is a pure function of ``(seed, step, process_index)``. Every example of
the *global* batch at a step draws from its own key,
``fold_in(fold_in(key(seed), step), position)`` (the library's per-example key rule,
:func:`scorelib.keys.example_keys`, applied to the step key), and process ``p`` with a
local batch of ``B`` takes positions ``p * B ... p * B + B - 1``. So:

* the same call gives the same batch, in Python or inside ``jax.jit``;
* the local batches of processes ``0 .. P-1`` concatenated equal the batch of one
  process with batch size ``P * B`` (the global batch does not depend on how many
  processes share it);
* a batch of size ``B`` is a prefix of the batch of size ``B' > B``.

Indices are drawn with replacement (``jax.random.randint``), so there are no epochs
to keep in sync across restarts or processes.

Class labels (``data.labels``): given the data set's ``labels: [n]``, :func:`get_batch` and
:func:`get_dequantised_batch` return ``(x, y)``, the rows and their labels read with the
same index draw, so every property above holds for the labels too; without ``labels`` they
return the rows alone, exactly as before labels existed.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_int, check_real, require
from scorelib.data.images import uniform_dequantise
from scorelib.keys import example_keys

Array = Any


def batch_keys(batch_size: int, *, seed, step, process_index=0) -> Array:
    """The per-example keys of a local training batch at ``(seed, step, process_index)``.

    Args:
      batch_size: the local (per-process) batch size ``B`` (a Python int >= 1).
      seed, step, process_index: integers >= 0 (Python ints or traced int32 scalars).

    Returns:
      typed PRNG key array ``[B]``: example ``j`` of process ``p`` uses
      ``fold_in(fold_in(key(seed), step), p * B + j)``, i.e.
      ``scorelib.keys.example_keys(fold_in(key(seed), step), B, p * B)``.

    Raises:
      ValueError: if ``batch_size < 1``.
    """
    batch_size = check_int(batch_size, "batch_size", low=1)
    step_key = jax.random.fold_in(jax.random.key(seed), step)
    return example_keys(step_key, batch_size, process_index * batch_size)


def batch_indices(n: int, batch_size: int, *, seed, step, process_index=0) -> Array:
    """Row indices ``[B]`` (int32 in ``[0, n)``) of the local batch; see the module docstring.

    Raises:
      ValueError: if ``n < 1`` or ``batch_size < 1``.
    """
    if int(n) < 1:
        raise ValueError(f"cannot draw a batch from an empty data set (n={n})")
    check_int(batch_size, "batch_size", low=1)
    return _batch_indices(int(n), int(batch_size), seed, step, process_index)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _batch_indices(n, batch_size, seed, step, process_index):
    keys = batch_keys(batch_size, seed=seed, step=step, process_index=process_index)
    return jax.vmap(lambda k: jax.random.randint(k, (), 0, n, dtype=jnp.int32))(keys)


def check_labels(labels: Array, n: int, field: str = "data.labels") -> None:
    """Require ``labels`` to be integer ``[n]`` class labels of the ``n`` rows of a data set
    (static shape and dtype only: no host sync, usable on traced arrays).

    Raises:
      ValueError: naming ``field`` for another shape or a non-integer dtype.
    """
    dtype = labels.dtype if hasattr(labels, "dtype") else np.asarray(labels).dtype
    shape = np.shape(labels)
    require(
        shape == (n,) and np.issubdtype(dtype, np.integer),
        field,
        f"integer class labels [n] of the n = {n} rows of the data",
        f"dtype {dtype} and shape {shape}",
    )


def _take_rows(a: Array, idx: Array) -> Array:
    """``a[idx]``: numpy without a device copy when ``a`` is numpy and ``idx`` is not traced."""
    if isinstance(a, np.ndarray) and not isinstance(idx, jax.core.Tracer):
        return a[np.asarray(idx)]
    return jnp.take(a, idx, axis=0)


def get_batch(
    data: Array, batch_size: int, *, seed, step, process_index=0, labels: Array | None = None
):
    """The local batch of rows of ``data`` at ``(seed, step, process_index)``, with their
    class labels when ``labels`` is given.

    Usable inside a jitted train step (keep ``data`` on device as a ``jax.Array``
    argument; ``seed``/``step``/``process_index`` may be traced) and from Python.

    Args:
      data: ``[n, *data_shape]`` numpy or jax array (e.g. ``ImageDataset.train``).
      batch_size: local batch size ``B``.
      seed, step, process_index: integers; see the module docstring.
      labels: ``None``, or the rows' integer class labels ``[n]`` (e.g.
        ``ImageDataset.train_labels``).

    Returns:
      ``x: [B, *data_shape]`` without ``labels``; with them ``(x, y)``, ``y: [B]`` int32
      the labels of the rows of ``x`` (one index draw for both). A numpy array when the
      source array is numpy and the call is not traced (no copy of the data set to the
      device), else a ``jax.Array``.

    Raises:
      ValueError: if ``data`` has no leading axis or is empty, ``batch_size < 1``, or
        ``labels`` is not integer ``[n]`` (naming ``data.labels``).
    """
    require(np.ndim(data) >= 1, "data", "[n, *data_shape]", np.shape(data))
    if labels is not None:
        labels = labels if hasattr(labels, "dtype") else np.asarray(labels)
        check_labels(labels, data.shape[0])
    idx = batch_indices(
        data.shape[0], batch_size, seed=seed, step=step, process_index=process_index
    )
    x = _take_rows(data, idx)
    if labels is None:
        return x
    y = _take_rows(labels, idx)
    return x, (y.astype(np.int32) if isinstance(y, np.ndarray) else y.astype(jnp.int32))


def get_dequantised_batch(
    data: Array,
    batch_size: int,
    delta: float,
    *,
    seed,
    step,
    process_index=0,
    labels: Array | None = None,
):
    """:func:`get_batch` with uniform dequantisation: each value of the batch plus noise
    ``delta u``, ``u ~ U(-1/2, 1/2)``, over its own quantisation bin
    (:func:`scorelib.data.images.uniform_dequantise`).

    Example ``j`` draws its noise from ``fold_in(k_j, 1)``, ``k_j`` its key of
    :func:`batch_keys` (which also draws its row), so the properties of the module docstring
    hold for the noise too: a pure function of ``(seed, step, process_index)``, split over
    processes as one global batch, a prefix of any larger batch.

    Args:
      data: ``[n, *data_shape]`` values on levels ``delta`` apart (e.g. ``ImageDataset.train``).
      batch_size: local batch size ``B``.
      delta: the level spacing (> 0, data units; :func:`scorelib.data.images.level_spacing`).
      seed, step, process_index, labels: as for :func:`get_batch`.

    Returns:
      ``[B, *data_shape]`` float32 ``jax.Array``; with ``labels``, ``(x, y)`` as
      :func:`get_batch` (``y`` the labels of the rows before dequantisation).

    Raises:
      ValueError: as :func:`get_batch`, or for ``delta <= 0``.
    """
    delta = check_real(delta, "delta", low=0.0, low_open=True, high_open=True)
    out = get_batch(
        data, batch_size, seed=seed, step=step, process_index=process_index, labels=labels
    )
    x, y = out if labels is not None else (out, None)
    keys = batch_keys(batch_size, seed=seed, step=step, process_index=process_index)
    x = uniform_dequantise(x, jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys), delta)
    return x if labels is None else (x, y)
