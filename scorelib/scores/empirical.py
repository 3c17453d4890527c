"""The exact score of a finite training set (the "delta-mixture" or empirical score).

The training set ``{x_i}_{i<n}`` as a distribution ``(1/n) sum_i delta(x - x_i)``, noised by
any process, is the mixture ``(1/n) sum_i N(alpha x_i, sigma^2 I)``. Its denoiser is the
softmax-weighted mean of the training points (Wang & Vastola 2024, Sec. 5, the
"delta mixture"; Karras et al. 2022, App. B.3, the ideal denoiser):

    D(x, t) = sum_i w_i x_i,   w = softmax_i( -||x / alpha - x_i||^2 / (2 ve_sigma^2) )

with ``ve_sigma = sigma / alpha``; the score follows by Tweedie,
``(alpha D - x) / sigma^2``. Sampling with it reproduces training points exactly
(memorisation), which is why it is a reference point, not a generator.

The softmax over the training set is computed online over chunks of the training set
(a running max, sum and weighted sum, as in a streaming ``logsumexp``), so memory is
``O(batch x chunk x d)`` whatever ``n`` is, and the squared distances are formed as
differences, never as ``||x||^2 - 2 x.x_i + ||x_i||^2`` (which cancels catastrophically
for a query near a training point at small sigma).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from scorelib._checks import check_int
from scorelib.processes.base import Process, broadcast_to_data
from scorelib.scores.base import ScoreSource, check_time_shape, flatten

Array = Any


class EmpiricalScore(ScoreSource):
    """Score source of the noised empirical distribution of a training set.

    Fields:
      data: ``[n_pad, d]`` flattened training points, padded to a multiple of ``chunk``.
      valid: ``[n_pad]`` bool, False on padding rows.
      data_shape: unflattened data shape (static).
      chunk: training points per step of the online softmax (static).
    """

    data: Array = None
    valid: Array = None
    data_shape: tuple = struct.field(pytree_node=False, default=())
    chunk: int = struct.field(pytree_node=False, default=512)

    @classmethod
    def create(cls, process: Process, data, *, chunk: int = 512) -> EmpiricalScore:
        """Build from ``data: [n, *data_shape]`` (data units, ``n >= 1``).

        Args:
          process: the noise process.
          data: the training set.
          chunk: training points per online-softmax step (>= 1); lower it for large
            ``batch x d`` to bound memory at ``batch x chunk x d`` floats.

        Raises:
          ValueError: for empty or non-finite data or a bad ``chunk``.
        """
        x = np.asarray(data, dtype=np.float64)
        if x.ndim < 2 or x.shape[0] < 1:
            raise ValueError(f"data must have shape [n >= 1, *data_shape]; got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("data must be finite")
        check_int(chunk, "chunk", low=1)
        n = x.shape[0]
        chunk = int(min(chunk, n))
        n_pad = -(-n // chunk) * chunk
        flat = np.zeros((n_pad, int(np.prod(x.shape[1:]))), np.float64)
        flat[:n] = x.reshape(n, -1)
        valid = np.arange(n_pad) < n
        dtype = jax.dtypes.canonicalize_dtype(np.float64)
        return cls(process=process, data=jnp.asarray(flat, dtype), valid=jnp.asarray(valid),
                   data_shape=tuple(x.shape[1:]), chunk=chunk)

    def _softmax_stats(self, x, t):
        """Online softmax over the training set: ``(max logit [b], sum [b], weighted sum [b, d])``.
        """
        check_time_shape(x, t)
        process = self.process
        xf = flatten(x)
        y = xf / broadcast_to_data(process.alpha(t), xf)  # VE frame
        s = broadcast_to_data(process.ve_sigma(t), xf)  # [b or 1, 1]
        inv2s2 = 0.5 / s**2  # scalar or [b, 1]
        b = xf.shape[0]
        n_chunks = self.data.shape[0] // self.chunk
        pts = self.data.reshape(n_chunks, self.chunk, -1)
        ok = self.valid.reshape(n_chunks, self.chunk)

        def body(carry, chunk):
            m, l, acc = carry
            p, v = chunk
            sq = jnp.sum((y[:, None, :] - p[None]) ** 2, axis=-1)  # [b, c]
            logits = jnp.where(v[None], -sq * inv2s2, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(logits, axis=-1))
            scale = jnp.exp(m - m_new)
            w = jnp.exp(logits - m_new[:, None])
            return (m_new, l * scale + jnp.sum(w, -1), acc * scale[:, None] + w @ p), None

        init = (
            jnp.full((b,), -jnp.inf, xf.dtype),
            jnp.zeros((b,), xf.dtype),
            jnp.zeros_like(xf),
        )
        (m, l, acc), _ = jax.lax.scan(body, init, (pts, ok))
        return m, l, acc

    def denoiser(self, x, t):
        """``sum_i softmax_i(-||x/alpha - x_i||^2 / (2 ve_sigma^2)) x_i``; shape of ``x``.

        Karras et al. 2022, App. B.3 (the ideal denoiser). ``x: [batch, *data_shape]``;
        ``t`` a scalar or ``[batch]`` with ``ve_sigma(t) > 0``.

        Raises:
          ValueError: if ``t`` is neither a scalar nor ``[batch]``.
        """
        _, l, acc = self._softmax_stats(x, t)
        return jnp.reshape(acc / l[:, None], x.shape)
