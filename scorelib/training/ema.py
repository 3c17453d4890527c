"""Exponential moving average of the parameters: by a fixed decay or by an EDM half-life.

EDM (Karras et al. 2022, ``training/training_loop.py``)::

    ema_halflife_nimg = ema_halflife_kimg * 1000
    if ema_rampup_ratio is not None:
        ema_halflife_nimg = min(ema_halflife_nimg, cur_nimg * ema_rampup_ratio)
    ema_beta = 0.5 ** (batch_size / max(ema_halflife_nimg, 1e-8))

with ``cur_nimg`` the number of images seen *before* the current step, so the
first step copies the parameters (beta = 0) when a ramp-up is used.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp


def ema_decay(
    step: Any,
    *,
    batch_size: int,
    decay: float | None = None,
    halflife_nimg: float | None = None,
    rampup_ratio: float | None = None,
) -> jax.Array:
    """The EMA coefficient ``beta`` for step index ``step`` (0-based; scalar, traceable).

    Exactly one of ``decay`` (a constant beta) or ``halflife_nimg`` (EDM: the
    half-life in examples) must be given; ``rampup_ratio`` (only with the
    half-life) caps the half-life at ``step * batch_size * rampup_ratio``.

    Returns:
      float32 scalar ``beta`` in ``[0, 1)``; the update is ``ema <- beta ema + (1 - beta) params``.

    Raises:
      ValueError: see :class:`EMA`.
    """
    return EMA(
        batch_size=batch_size, decay=decay, halflife_nimg=halflife_nimg, rampup_ratio=rampup_ratio
    ).beta(step)


def ema_update(ema: Any, params: Any, beta: Any) -> Any:
    """``beta * ema + (1 - beta) * params`` leaf by leaf (same pytree structure)."""
    beta = jnp.asarray(beta, jnp.float32)
    return jax.tree.map(lambda e, p: (beta * e + (1.0 - beta) * p).astype(e.dtype), ema, params)


@dataclasses.dataclass(frozen=True)
class EMA:
    """EMA configuration; validated when built.

    Raises:
      ValueError: naming the field (``ema.decay`` etc.) unless exactly one of ``decay``
        (in [0, 1)) or ``halflife_nimg`` (> 0) is given, ``rampup_ratio`` is ``None`` or
        > 0 and used with a half-life, and ``batch_size`` >= 1.
    """

    batch_size: int = 1
    decay: float | None = None
    halflife_nimg: float | None = None
    rampup_ratio: float | None = None

    def __post_init__(self):
        if (self.decay is None) == (self.halflife_nimg is None):
            raise ValueError(
                "ema.decay and ema.halflife_nimg: give exactly one; got "
                f"decay={self.decay!r}, halflife_nimg={self.halflife_nimg!r}"
            )
        if self.decay is not None and not 0.0 <= self.decay < 1.0:
            raise ValueError(f"ema.decay must be in [0, 1); got {self.decay!r}")
        if self.halflife_nimg is not None and not (
            math.isfinite(self.halflife_nimg) and self.halflife_nimg > 0
        ):
            raise ValueError(f"ema.halflife_nimg must be > 0; got {self.halflife_nimg!r}")
        if self.rampup_ratio is not None:
            if self.halflife_nimg is None:
                raise ValueError("ema.rampup_ratio needs ema.halflife_nimg (not ema.decay)")
            if not self.rampup_ratio > 0:
                raise ValueError(f"ema.rampup_ratio must be > 0; got {self.rampup_ratio!r}")
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            raise ValueError(f"ema.batch_size must be an integer >= 1; got {self.batch_size!r}")

    def beta(self, step: Any) -> jax.Array:
        """float32 scalar ``beta`` at 0-based step index ``step`` (see module docstring)."""
        if self.decay is not None:
            return jnp.asarray(self.decay, jnp.float32)
        halflife = jnp.asarray(self.halflife_nimg, jnp.float32)
        if self.rampup_ratio is not None:
            nimg = jnp.asarray(step, jnp.float32) * self.batch_size
            halflife = jnp.minimum(halflife, nimg * self.rampup_ratio)
        return jnp.asarray(0.5, jnp.float32) ** (self.batch_size / jnp.maximum(halflife, 1e-8))


jax.tree_util.register_static(EMA)
