"""The score-source interface and the Tweedie conversions, written once.

A score source answers ``score(x, t) = grad_x log p_t(x)`` and, equivalently,
the denoiser ``D(x, t) = E[x_0 | x_t = x]``. Tweedie's formula links them
(Efron 2011; Karras et al. 2022, eq. 3 generalised to ``alpha != 1``)::

    score(x, t) = (alpha(t) D(x, t) - x) / sigma(t)^2
    D(x, t)     = (x + sigma(t)^2 score(x, t)) / alpha(t)

A source subclasses :class:`ScoreSource` and implements *one* of ``denoiser``
or ``score``; the other comes from the conversion. Sources are flax
``PyTreeNode`` dataclasses: their arrays are pytree leaves, their process is
static, so a source can be passed as an argument into ``jax.jit``.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
from flax import struct

from scorelib._checks import array_shape, check_array, check_shape, check_time, require
from scorelib.processes.base import Process, broadcast_to_data

Array = Any


def check_examples(source, x: Array, field: str = "x") -> int:
    """Require a score source and a real ``x: [batch, *data_shape]`` for it; return ``batch``.

    ``data_shape`` is the source's when it has one (:meth:`ScoreSource.expected_data_shape`).
    Static shapes and dtypes only: free inside ``jit``. The entry check of the sources'
    ``score`` / ``denoiser`` (:func:`check_query`) and of functions that take a source and
    its examples (metrics, samplers).

    Raises:
      ValueError: naming ``source`` for anything but a :class:`ScoreSource`, or ``field``:
        ``x must have shape [batch, 2] (<where 2 comes from>); got shape (3, 1)``.
    """
    require(
        isinstance(source, ScoreSource), "source", "a scorelib ScoreSource", type(source).__name__
    )
    data_shape, note = source.expected_data_shape()
    pattern = ("batch", *data_shape) if data_shape else ("batch", "*data_shape")
    return check_array(x, field, pattern, note=note)["batch"]


def check_data_shape(data_shape, d: int) -> tuple[int, ...]:
    """``data_shape`` as a tuple, ``(d,)`` when ``None``; it must hold ``d`` entries.

    Raises:
      ValueError: naming ``data_shape`` when its product is not ``d``.
    """
    if data_shape is None:
        return (d,)
    try:
        shape = tuple(int(s) for s in data_shape)
    except (TypeError, ValueError):
        shape = None
    require(
        shape is not None and math.prod(shape) == d and all(s >= 1 for s in shape),
        "data_shape",
        f"a shape holding d = {d} entries",
        data_shape,
    )
    return shape


def check_query(source, x: Array, t: Array, field: str = "x") -> int:
    """:func:`check_examples`, and ``t`` a real scalar or ``[batch]``; returns ``batch``.

    Raises:
      ValueError: as :func:`check_examples`, or naming ``t``.
    """
    batch = check_examples(source, x, field)
    check_time(t, "t", batch)
    return batch


def score_from_denoiser(process: Process, x: Array, t: Array, denoised: Array) -> Array:
    """Tweedie: ``score = (alpha(t) D - x) / sigma(t)^2`` (Efron, "Tweedie's formula and
    selection bias", JASA 2011, Sec. 2, with a scaled mean; Karras et al. 2022, eq. 3 for
    ``alpha = 1``).

    Args:
      process: the noise process.
      x: ``[batch, *data_shape]`` noisy input ``x_t``.
      t: scalar or ``[batch]`` process time.
      denoised: ``[batch, *data_shape]`` the denoiser output ``D(x, t)``.

    Returns:
      ``[batch, *data_shape]``, the score in units of 1/data.

    Raises:
      ValueError: if ``t`` is neither a scalar nor ``[batch]``, or ``denoised`` is not of
        the shape of ``x``.
    """
    check_shape(denoised, "denoised", array_shape(x), note=" (the shape of x)")
    a = broadcast_to_data(process.alpha(t), x)
    s = broadcast_to_data(process.sigma(t), x)
    return (a * denoised - x) / s**2


def denoiser_from_score(process: Process, x: Array, t: Array, score: Array) -> Array:
    """Tweedie: ``D = (x + sigma(t)^2 score) / alpha(t)`` (data units).

    The inverse of :func:`score_from_denoiser`; shapes, source and errors as there.
    """
    check_shape(score, "score", array_shape(x), note=" (the shape of x)")
    a = broadcast_to_data(process.alpha(t), x)
    s = broadcast_to_data(process.sigma(t), x)
    return (x + s**2 * score) / a


class ScoreSource(struct.PyTreeNode):
    """Anything that gives ``score(x, t)`` and ``denoiser(x, t)`` under a process.

    Subclasses implement :meth:`denoiser` or :meth:`score` (or both).

    Every method takes ``x: [batch, *data_shape]`` and ``t`` a scalar or
    ``[batch]`` and returns an array of the shape of ``x``.
    """

    process: Process = struct.field(pytree_node=False)

    def expected_data_shape(self) -> tuple[tuple | None, Any]:
        """``(data_shape, note)``: the shape of one example this source takes (``None`` when
        it does not know it) and, for error messages, where that shape comes from (a string,
        or a callable that writes it, called only for an error).

        Default: the ``data_shape`` field or property when the source has a non-empty one.
        """
        data_shape = getattr(self, "data_shape", None)
        if not data_shape:
            return None, ""
        return tuple(data_shape), f" (the data_shape of the {type(self).__name__})"

    def denoiser(self, x: Array, t: Array) -> Array:
        """Posterior mean ``E[x_0 | x_t = x]`` in data units; shape of ``x``.

        Default: Tweedie from :meth:`score` (:func:`denoiser_from_score`).

        Raises:
          NotImplementedError: if the subclass implements neither method.
        """
        if type(self).score is ScoreSource.score:
            raise NotImplementedError(
                f"{type(self).__name__} implements neither score nor denoiser"
            )
        return denoiser_from_score(self.process, x, t, self.score(x, t))

    def score(self, x: Array, t: Array) -> Array:
        """``grad_x log p_t(x)`` in units of 1/data; shape of ``x``.

        Default: Tweedie from :meth:`denoiser` (:func:`score_from_denoiser`).

        Raises:
          NotImplementedError: if the subclass implements neither method.
        """
        if type(self).denoiser is ScoreSource.denoiser:
            raise NotImplementedError(
                f"{type(self).__name__} implements neither score nor denoiser"
            )
        return score_from_denoiser(self.process, x, t, self.denoiser(x, t))

    def batch_multiple(self) -> int:
        """How many examples the wrapped network sees per example of a query (static; at
        least 1): the sampler driver's CPU blocks are this many times smaller, so the
        network's batch, not the sampler's, is what stays in cache
        (``scorelib.samplers.driver.CPU_CHUNK``; the samples do not change, each example
        being independent of its block).

        Default: the largest of the sources this one holds as fields, 1 when none; a
        source that stacks its queries into one call (classifier-free guidance's
        conditional and unconditional halves) multiplies it.
        """
        inner = [v.batch_multiple() for v in vars(self).values() if isinstance(v, ScoreSource)]
        return max(inner, default=1)

    def for_examples(self, key, batch: int, first_index: Array = 0) -> ScoreSource:
        """A copy whose own random draws belong to examples ``first_index .. first_index +
        batch - 1`` of ``key`` (:func:`scorelib.keys.example_keys`).

        A deterministic source has no draws: this default returns ``self``. Random sources
        (``SmoothedScore``, ``ReverseDiffusionScore``) hold the per-example keys, conditional
        sources (``scorelib.scores.conditional``) their examples' labels; every sampler's
        driver calls this with the sampler's key for each block of examples it runs
        (``scorelib/samplers/driver.py``). Must be jit-safe with a traced ``first_index``.
        """
        return self


def flatten(x: Array) -> Array:
    """``[batch, *data_shape] -> [batch, d]``."""
    return jnp.reshape(x, (x.shape[0], -1))
