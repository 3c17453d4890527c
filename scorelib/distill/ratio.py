"""The density ratio from discriminator logits, its clipping and the two-stage
normalisation of the weights (Xu, Nie and Vahdat 2025, Sec. 4 and App. B; the
authors' released code, ``_get_f_div_weighting_h``).

At the optimum of the logistic discriminator loss the logit is ``log(p_t / q_t)``, so
``r = exp(logit)``. Pipeline, all under stop-gradient:

1. average the logits over the heads, clamp the mean to ``[-logit_clip, logit_clip]``;
2. ``r = exp(.)`` clipped to ``[ratio_min, ratio_max]``;
3. stage 1, over noise levels: divide ``r`` by the mean ratio of its noise-level bin
   (``E_q r = 1`` at every noise level), optionally an EMA of the bin means across steps;
4. ``h = h_f(r)``;
5. stage 2, over the batch: divide ``h`` by its batch mean, so the weights average 1 and
   the gradient scale is that of reverse-KL.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from scorelib._checks import check_arrays, check_int

Array = Any

EPS = 1e-6  # the authors' guard in both normalisations


def ratio_from_logits(
    logits: Array, *, logit_clip: float = 10.0, ratio_min: float = 0.1, ratio_max: float = 20.0
) -> Array:
    """``r = clip(exp(clip(mean_heads(logits), -logit_clip, logit_clip)), ratio_min, ratio_max)``.

    Args:
      logits: ``[batch, heads]`` discriminator logits (``log p_t / q_t`` at the optimum).

    Returns:
      ``[batch]`` ratios, with no gradient.

    Raises:
      ValueError: naming ``logits`` unless it is real ``[batch, heads]``.
    """
    check_arrays(("batch", "heads"), logits=logits)
    mean = jnp.clip(jnp.mean(jax.lax.stop_gradient(logits), axis=-1), -logit_clip, logit_clip)
    return jnp.clip(jnp.exp(mean), ratio_min, ratio_max)


def bin_index(ve_sigma: Array, sigma_min: float, sigma_max: float, bins: int) -> Array:
    """``[batch]`` int32 index of equal-width bins of ``[sigma_min, sigma_max]`` (data units).

    Raises:
      ValueError: naming ``ve_sigma`` (not real ``[batch]``) or ``bins`` (not an int >= 1).
    """
    check_arrays(("batch",), ve_sigma=ve_sigma)
    check_int(bins, "bins", low=1)
    u = (ve_sigma - sigma_min) / (sigma_max - sigma_min)
    return jnp.clip(jnp.floor(u * bins).astype(jnp.int32), 0, bins - 1)


def bin_means(values: Array, index: Array, bins: int, previous: Array, ema_rate: float) -> Array:
    """Per-bin means of ``values``, blended with ``previous`` as an EMA.

    ``new_k = ema_rate previous_k + (1 - ema_rate) mean_k`` for bins with samples in this
    batch; a bin without samples keeps ``previous_k``.

    Args:
      values: ``[batch]``; index: ``[batch]`` bins in ``[0, bins)``; previous: ``[bins]``.

    Returns:
      ``[bins]`` in ``previous``'s dtype.

    Raises:
      ValueError: naming the argument whose shape does not fit.
    """
    check_int(bins, "bins", low=1)
    check_arrays(("batch",), values=values, index=index)
    check_arrays((bins,), previous=previous)
    one_hot = jax.nn.one_hot(index, bins, dtype=values.dtype)  # [batch, bins]
    count = one_hot.sum(0)
    mean = (one_hot * values[:, None]).sum(0) / jnp.maximum(count, 1.0)
    blended = ema_rate * previous + (1.0 - ema_rate) * mean
    return jnp.where(count > 0, blended, previous).astype(previous.dtype)


def normalise_ratio(r: Array, index: Array, means: Array) -> Array:
    """Stage 1: ``r / (means[bin] + 1e-6)``; ``r, index: [batch]``, ``means: [bins]``.

    Raises:
      ValueError: naming the argument whose shape does not fit.
    """
    check_arrays(("batch",), r=r, index=index)
    check_arrays(("bins",), means=means)
    return r / (means[index] + EPS)


def normalise_weights(h: Array) -> Array:
    """Stage 2: ``h / (mean(h) + 1e-6)`` over the batch (``[batch] -> [batch]``, mean ~1).

    Raises:
      ValueError: naming ``h`` unless it is real ``[batch]``.
    """
    check_arrays(("batch",), h=h)
    return h / (jnp.mean(h) + EPS)
