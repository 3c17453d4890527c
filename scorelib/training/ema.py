"""Exponential moving average of the parameters: by a fixed decay or by an EDM half-life.

The update after step ``t`` (0-based step index) is ``ema <- beta_t ema + (1 - beta_t) params``.

* Decay mode: ``beta_t = decay``.
* Half-life mode, EDM (Karras et al. 2022, ``training/training_loop.py``)::

      ema_halflife_nimg = ema_halflife_kimg * 1000
      if ema_rampup_ratio is not None:
          ema_halflife_nimg = min(ema_halflife_nimg, cur_nimg * ema_rampup_ratio)
      ema_beta = 0.5 ** (batch_size / max(ema_halflife_nimg, 1e-8))

  with ``cur_nimg = t * batch_size`` the number of examples seen *before* the step, so
  the first step copies the parameters (beta = 0) when a ramp-up is used.

Warm-up (``warmup=True``, the default) caps either mode's beta at the standard ramp
``(1 + t) / (10 + t)`` (the ``num_updates`` ramp of TensorFlow's
``tf.train.ExponentialMovingAverage``), so the EMA of a short run is not dominated by
the initial weights: without it, ``decay=0.999`` after 3,000 steps still holds
``0.999^3000 = 5%`` of them (0.9995: 22%). EDM's ramp-up with ``rampup_ratio <= ln 2 / 9
= 0.077`` (EDM uses 0.05) is below the cap at every step, so it is unchanged: since
``ln(1 - x) >= -x / (1 - x)``, ``ln((1 + t) / (10 + t)) >= -9 / (1 + t) >
-ln 2 / (rampup_ratio t)``. Skipped non-finite steps count in ``t``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from scorelib._checks import check_int, check_real, require
from scorelib._pytree import static_pytree

WARMUP_OFFSET = 10.0  # beta_t <= (1 + t) / (WARMUP_OFFSET + t)


def ema_decay(
    step: Any,
    *,
    batch_size: int,
    decay: float | None = None,
    halflife_nimg: float | None = None,
    rampup_ratio: float | None = None,
    warmup: bool = True,
) -> jax.Array:
    """The EMA coefficient ``beta`` for step index ``step`` (0-based; scalar, traceable).

    Exactly one of ``decay`` (a constant beta) or ``halflife_nimg`` (EDM: the
    half-life in examples) must be given; ``rampup_ratio`` (only with the
    half-life) caps the half-life at ``step * batch_size * rampup_ratio``; ``warmup``
    caps beta at ``(1 + step) / (10 + step)`` (see the module docstring).

    Returns:
      float32 scalar ``beta`` in ``[0, 1)``; the update is ``ema <- beta ema + (1 - beta) params``.

    Raises:
      ValueError: see :class:`EMA`.
    """
    return EMA(
        batch_size=batch_size,
        decay=decay,
        halflife_nimg=halflife_nimg,
        rampup_ratio=rampup_ratio,
        warmup=warmup,
    ).beta(step)


def ema_update(ema: Any, params: Any, beta: Any) -> Any:
    """``beta * ema + (1 - beta) * params`` leaf by leaf (same pytree structure)."""
    beta = jnp.asarray(beta, jnp.float32)
    return jax.tree.map(lambda e, p: (beta * e + (1.0 - beta) * p).astype(e.dtype), ema, params)


@static_pytree
@dataclasses.dataclass(frozen=True)
class EMA:
    """EMA configuration; validated when built.

    Attributes:
      batch_size: examples per step (the half-life is counted in examples).
      decay: constant beta in ``[0, 1)`` (decay mode).
      halflife_nimg: EDM half-life in examples, > 0 (half-life mode).
      rampup_ratio: EDM ramp-up: the half-life is at most ``rampup_ratio`` times the
        examples seen so far (half-life mode only).
      warmup: cap beta at ``(1 + t) / (10 + t)`` at step ``t`` (default on).

    Raises:
      ValueError: naming the field (``ema.decay`` etc.) unless exactly one of ``decay``
        (in [0, 1)) or ``halflife_nimg`` (> 0) is given, ``rampup_ratio`` is ``None`` or
        > 0 and used with a half-life, ``batch_size`` >= 1 and ``warmup`` a bool.
    """

    batch_size: int = 1
    decay: float | None = None
    halflife_nimg: float | None = None
    rampup_ratio: float | None = None
    warmup: bool = True

    def __post_init__(self):
        if (self.decay is None) == (self.halflife_nimg is None):
            raise ValueError(
                "ema.decay and ema.halflife_nimg: give exactly one; got "
                f"decay={self.decay!r}, halflife_nimg={self.halflife_nimg!r}"
            )
        if self.decay is not None:
            check_real(self.decay, "ema.decay", low=0.0, high=1.0, high_open=True)
        if self.halflife_nimg is not None:
            check_real(
                self.halflife_nimg,
                "ema.halflife_nimg",
                low=0.0,
                low_open=True,
                high=math.inf,
                high_open=True,
            )
        if self.rampup_ratio is not None:
            if self.halflife_nimg is None:
                raise ValueError("ema.rampup_ratio needs ema.halflife_nimg (not ema.decay)")
            check_real(self.rampup_ratio, "ema.rampup_ratio", low=0.0, low_open=True)
        check_int(self.batch_size, "ema.batch_size", low=1)
        require(isinstance(self.warmup, bool), "ema.warmup", "true or false", self.warmup)

    def beta(self, step: Any) -> jax.Array:
        """float32 scalar ``beta`` at 0-based step index ``step`` (see module docstring)."""
        t = jnp.asarray(step, jnp.float32)
        if self.decay is not None:
            beta = jnp.asarray(self.decay, jnp.float32)
        else:
            halflife = jnp.asarray(self.halflife_nimg, jnp.float32)
            if self.rampup_ratio is not None:
                halflife = jnp.minimum(halflife, t * self.batch_size * self.rampup_ratio)
            beta = jnp.asarray(0.5, jnp.float32) ** (self.batch_size / jnp.maximum(halflife, 1e-8))
        if self.warmup:
            beta = jnp.minimum(beta, (1.0 + t) / (WARMUP_OFFSET + t))
        return beta
