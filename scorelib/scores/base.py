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

from typing import Any

import jax.numpy as jnp
from flax import struct

from scorelib.processes.base import Process, broadcast_to_data

Array = Any


def check_time_shape(x: Array, t: Array) -> None:
    """Raise ``ValueError`` unless ``t`` is a scalar or ``[batch]`` matching ``x: [batch, ...]``."""
    broadcast_to_data(t, x)


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
      ValueError: if ``t`` is neither a scalar nor ``[batch]``.
    """
    a = broadcast_to_data(process.alpha(t), x)
    s = broadcast_to_data(process.sigma(t), x)
    return (a * denoised - x) / s**2


def denoiser_from_score(process: Process, x: Array, t: Array, score: Array) -> Array:
    """Tweedie: ``D = (x + sigma(t)^2 score) / alpha(t)`` (data units).

    The inverse of :func:`score_from_denoiser`; shapes, source and errors as there.
    """
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

    def for_examples(self, key, batch: int, first_index: Array = 0) -> ScoreSource:
        """A copy whose own random draws belong to examples ``first_index .. first_index +
        batch - 1`` of ``key`` (:func:`scorelib.keys.example_keys`).

        A deterministic source has no draws: this default returns ``self``. Random sources
        (``SmoothedScore``, ``ReverseDiffusionScore``) hold the per-example keys;
        ``scorelib.samplers.per_example(sampler)`` calls this with each sampler call's key,
        batch and ``first_index``.
        """
        return self


def flatten(x: Array) -> Array:
    """``[batch, *data_shape] -> [batch, d]``."""
    return jnp.reshape(x, (x.shape[0], -1))
