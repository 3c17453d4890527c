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
``O(batch x chunk)`` whatever ``n`` is. Inside a chunk the logits come from one matmul,
``||y||^2 - 2 y.x_i + ||x_i||^2``: that form cancels catastrophically for a query near a
training point at small sigma (its float32 error, about ``1e-7 ||y||^2``, divided by
``2 sigma^2``), so the points of the ``exact_top`` sub-blocks (16 consecutive points, see
:func:`scan_blocks`) with the largest logits of each query in each chunk are left out of
the matmul sums and added with logits recomputed from differences ``||y - x_i||^2``. The
answer is then exact unless the points within the matmul error of the nearest one fall
in more than ``exact_top`` sub-blocks of one chunk; the tests check it against a float64
loop at ``sigma = 1e-4``, at a training point and far from data.

At small noise the softmax is carried by a handful of points, and the exponentials and
the second matmul over the whole set are wasted. So the streamed softmax is preceded by a
*certified pruned* pass (:func:`pruned_softmax_stats`, ``prune`` sub-blocks): one matmul
scan keeps, per query, the ``prune + 1`` sub-blocks with the largest matmul maxima
(:func:`top_blocks`); the softmax over the points of the first ``prune`` is computed
exactly from differences, and the other points' logits are bounded by the ``prune + 1``-th
maximum plus the matmul's float32 error bound (:func:`matmul_error_bound`). When that
bound puts every other point below ``e^-30 / n`` of the largest weight, for every query of
the call, the pruned answer is the exact one to float32 and is returned; otherwise the
full streamed softmax runs (one ``lax.cond`` per call). The answer never depends on which
branch ran beyond float32 rounding.

Whether to try the pruned pass is a speed choice: in few dimensions the points within the
softmax's width of a query are many, the certificate fails and the pruned scan is wasted
before the full pass, while the matmul it would save is cheap. ``prune="auto"`` (the
default) runs it from :data:`AUTO_PRUNE_MIN_DIM` dimensions on, the crossover measured
with ``benchmarks/closed_form.py`` (BENCHMARKS.md, "Closed-form diffusion").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from scorelib._checks import array_shape, check_array, check_int, check_real_dtype, require
from scorelib.processes.base import Process, broadcast_to_data
from scorelib.scores.base import ScoreSource, check_query, flatten

Array = Any


def _accumulate(stats, logits, w_points):
    """Fold ``logits: [b, c]`` (``-inf`` = absent) into the running ``(m, l, acc)``.

    ``w_points(w)`` gives the weighted sum ``[b, d]`` of the ``c`` points for weights
    ``w: [b, c]``. A query with no finite logit yet keeps ``m = -inf`` without a NaN.
    """
    m, l, acc = stats
    m_new = jnp.maximum(m, jnp.max(logits, axis=-1))
    ref = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    scale = jnp.exp(m - ref)
    w = jnp.exp(logits - ref[:, None])
    return m_new, l * scale + jnp.sum(w, -1), acc * scale[:, None] + w_points(w)


def sub_block(chunk: int) -> int:
    """Points per sub-block of a chunk: the largest divisor of ``chunk`` up to 16."""
    return max(s for s in range(1, 17) if chunk % s == 0)


def scan_blocks(table, y, body, init):
    """Scan ``body`` over the training table in blocks of ``table.chunk`` points.

    The one home of the blocked matmul: block ``j`` holds points ``p: [c, d]`` and gets
    ``g = 2 y.p^T - ||p||^2: [b, c]`` (``= ||y||^2 - ||y - p||^2``, so larger is nearer;
    ``-inf`` on padding rows), from one ``[b, d] x [d, c]`` matmul, and ``g``'s maxima over
    sub-blocks of ``sub_block(c)`` consecutive points, ``gmax: [b, c / sub]`` (a plain max
    is cheap on CPU, where an arg-max or top-k over ``c`` costs about 40% of the matmul:
    callers search the few sub-blocks with the largest maxima instead of all ``c`` points).
    ``g`` is exact up to float32 rounding (:func:`matmul_error_bound`); callers recompute
    the distances of the points they keep with :func:`exact_logits`.

    Args:
      table: anything with ``data [n_pad, d]`` (zero padding rows), ``sq_norms [n_pad]``
        (``+inf`` on padding rows) and ``chunk`` (an :class:`EmpiricalScore`).
      y: ``[b, d]`` finite queries (data units).
      body: ``(carry, (g [b, c], gmax [b, c / sub], p [c, d], start)) -> (carry, out)``,
        ``start`` the global index of the block's first point (int32).
      init: the initial carry.

    Returns:
      ``(carry, outs)`` as :func:`jax.lax.scan`, ``outs`` stacked over the blocks.
    """
    c = table.chunk
    b, d = y.shape
    sub = sub_block(c)
    n_chunks = table.data.shape[0] // c
    pts = table.data.reshape(n_chunks, c, d).astype(y.dtype)
    sq = table.sq_norms.reshape(n_chunks, c).astype(y.dtype)  # +inf on padding rows
    starts = jnp.arange(n_chunks, dtype=jnp.int32) * c

    def step(carry, block):
        p, p_sq, start = block
        # full float32 products (no TF32 on GPUs): the pruning certificate bounds this error
        g = 2.0 * jnp.matmul(y, p.T, precision=jax.lax.Precision.HIGHEST) - p_sq[None]
        gmax = jnp.max(g.reshape(b, c // sub, sub), axis=-1)
        return body(carry, (g, gmax, p, start))

    return jax.lax.scan(step, init, (pts, sq, starts))


def top_sub_blocks(gmax, r: int, sub: int):
    """``[b, r' sub]`` chunk-local indices of the points of the ``r' = min(r, c / sub)``
    sub-blocks with the largest maxima ``gmax: [b, c / sub]`` (:func:`scan_blocks`).

    The ``r`` largest values of ``g`` all lie in these sub-blocks (each of the ``r``
    largest points lies in a sub-block whose maximum is at least the ``r``-th value, and
    at most ``r`` sub-blocks have such a maximum), so an exact top-``r`` of the chunk needs
    only them.
    """
    _, jb = jax.lax.top_k(gmax, min(r, gmax.shape[1]))
    return (jb[:, :, None] * sub + jnp.arange(sub, dtype=jb.dtype)).reshape(gmax.shape[0], -1)


def exact_logits(y, pts, inv2s2):
    """``-||y_b - p_bj||^2 inv2s2`` from differences (no cancellation near a point).

    Args:
      y: ``[b, d]``; pts: ``[b, K, d]`` each query's candidate points; inv2s2: a scalar or
        ``[b, 1]``.

    Returns:
      ``[b, K]``.
    """
    return -jnp.sum((y[:, None, :] - pts) ** 2, axis=-1) * inv2s2


def full_softmax_stats(table, y, inv2s2):
    """Streamed softmax of ``-||y - x_i||^2 inv2s2`` over a padded training table.

    In each chunk the ``exact_top`` sub-blocks with the largest matmul logits (at most
    ``16 exact_top`` points, :func:`scan_blocks`) are left out of the matmul sums and
    added with logits recomputed from differences (:func:`exact_logits`).

    Args:
      table: anything with ``data [n_pad, d]``, ``valid [n_pad]``, ``sq_norms [n_pad]``,
        ``chunk`` and ``exact_top`` (an :class:`EmpiricalScore`).
      y: ``[b, d]`` queries in the VE frame (data units).
      inv2s2: ``1 / (2 ve_sigma^2)``, a scalar or ``[b, 1]``.

    Returns:
      ``(m [b], l [b], acc [b, d])``: the largest logit, ``sum_i exp(logit_i - m)`` and
      ``sum_i exp(logit_i - m) x_i``, so the softmax mean is ``acc / l[:, None]``.
    """
    b = y.shape[0]
    sub = sub_block(table.chunk)
    yy = jnp.sum(y**2, axis=-1, keepdims=True)  # [b, 1]
    neg = jnp.array(-jnp.inf, y.dtype)
    rows = jnp.arange(b)[:, None]

    def body(stats, block):
        g, gmax, p, _ = block
        loc = top_sub_blocks(gmax, table.exact_top, sub)  # [b, r sub]: done exactly
        picked = loc[:, ::sub] // sub  # [b, r] their sub-blocks
        hit = jnp.zeros(gmax.shape, bool).at[rows, picked].set(True)  # [b, c / sub]
        approx = ((g - yy) * inv2s2).reshape(hit.shape + (sub,))  # -inf stays on padding
        rest = jnp.where(hit[..., None], neg, approx).reshape(g.shape)
        stats = _accumulate(stats, rest, lambda w: w @ p)
        pts = p[loc]  # [b, r sub, d]
        real = jnp.take_along_axis(g, loc, 1) > neg  # padding rows stay out
        exact = jnp.where(real, exact_logits(y, pts, inv2s2), neg)
        return _accumulate(stats, exact, lambda w: jnp.einsum("bk,bkd->bd", w, pts)), None

    init = (jnp.full((b,), -jnp.inf, y.dtype), jnp.zeros((b,), y.dtype), jnp.zeros_like(y))
    stats, _ = scan_blocks(table, y, body, init)
    return stats


# Pruned points may carry at most e^-CERT_MARGIN of the largest weight, all n together.
CERT_MARGIN = 30.0

#: ``prune="auto"``: the sub-blocks kept by the pruned pass, and the fewest dimensions
#: ``d`` (of a flattened point) from which it runs; below, the streamed softmax alone.
#: Measured crossover of the sigma-CFDM sampler's samples/s, pruned against streamed,
#: on isotropic Gaussian data (BENCHMARKS.md, "Closed-form diffusion": N = 10^4 and 10^5,
#: d = 2 .. 64).
AUTO_PRUNE = 8
AUTO_PRUNE_MIN_DIM = 8


def resolve_prune(prune, d: int) -> int:
    """The sub-blocks of the pruned pass for ``prune`` (an int >= 0 or ``"auto"``) and
    points of ``d`` dimensions: ``"auto"`` is :data:`AUTO_PRUNE` from
    :data:`AUTO_PRUNE_MIN_DIM` dimensions on, else 0 (the streamed softmax alone).

    Raises:
      ValueError: naming ``prune`` unless it is ``"auto"`` or an integer >= 0.
    """
    if isinstance(prune, str):
        require(prune == "auto", "prune", '"auto" or an integer >= 0', prune)
        return AUTO_PRUNE if d >= AUTO_PRUNE_MIN_DIM else 0
    return check_int(prune, "prune", low=0)


def matmul_error_bound(y, max_sq_norm):
    """``[b]`` bound on ``|g - g_exact|`` for the matmul logits of :func:`scan_blocks`.

    ``g = 2 y.p - ||p||^2`` in float32 with ``d``-term dot products: the classical bound
    ``gamma_d sum_j |y_j p_j| <= d u ||y|| ||p||`` (Higham 2002, Sec. 3.1) on the products
    and ``u ||p||^2`` on the norm, with ``2 ||y|| ||p|| <= ||y||^2 + ||p||^2``; twice that
    for safety: ``2 (d + 2) u (||y||^2 + max ||p||^2)``, ``u = 2^-24``. (The scan's matmul
    runs at full float32 precision; TF32 would void this bound.)

    Args:
      y: ``[b, d]`` queries; max_sq_norm: the largest ``||x_i||^2`` of the table.
    """
    d = y.shape[-1]
    u = float(np.finfo(np.float32).eps) / 2
    return 2.0 * (d + 2) * u * (jnp.sum(y**2, axis=-1) + max_sq_norm)


def top_blocks(table, y, r: int):
    """The ``r`` sub-blocks with the largest matmul maxima of each query, over the table.

    One :func:`scan_blocks` pass with a running top-``(r + 1)`` of the sub-block maxima
    ``gmax`` (a top-``k`` over ``r + 1 + c / sub`` values per block, not over ``c``
    points). The ``r`` largest values of ``g`` all lie in the first ``r`` sub-blocks (the
    argument of :func:`top_sub_blocks`, over the whole table), and every point outside
    them has ``g`` at most the ``(r + 1)``-th maximum.

    Args:
      table: an :class:`EmpiricalScore`; y: ``[b, d]``; r: ``>= 1``.

    Returns:
      ``(vals [b, r + 1], ids [b, r + 1])``: the maxima in decreasing order (``-inf``
      where the table has fewer sub-blocks or only padding) and the global sub-block
      indices (point ``i`` is in sub-block ``i // sub_block(table.chunk)``).
    """
    b = y.shape[0]
    sub = sub_block(table.chunk)
    keep = r + 1

    def body(carry, block):
        vals, ids = carry
        _, gmax, _, start = block
        vals, pos = jax.lax.top_k(jnp.concatenate([vals, gmax], 1), keep)
        old = jnp.take_along_axis(ids, jnp.minimum(pos, keep - 1), 1)
        return (vals, jnp.where(pos < keep, old, start // sub + pos - keep)), None

    init = (jnp.full((b, keep), -jnp.inf, y.dtype), jnp.zeros((b, keep), jnp.int32))
    (vals, ids), _ = scan_blocks(table, y, body, init)
    # Measured on XLA:CPU (jax 0.10): without the barrier, using both outputs downstream
    # (a mask from vals, a gather by ids) made the whole call 10x slower.
    return jax.lax.optimization_barrier((vals, ids))


def block_points(table, ids, vals):
    """``(idx [b, r sub], real [b, r sub])``: the point indices of sub-blocks ``ids: [b, r]``
    and whether each is a training point (False on padding and on ``-inf`` sub-blocks,
    which :func:`top_blocks` returns when there are fewer than ``r``)."""
    sub = sub_block(table.chunk)
    idx = (ids[:, :, None] * sub + jnp.arange(sub, dtype=ids.dtype)).reshape(ids.shape[0], -1)
    live = jnp.repeat(vals > -jnp.inf, sub, axis=1)
    return idx, live & table.valid[idx]


def pruned_softmax_stats(table, y, inv2s2, r: int):
    """The softmax of :func:`full_softmax_stats` over the points of the ``r`` sub-blocks of
    :func:`top_blocks` only, exact from differences, and whether pruning the rest is
    certified for each query (module docstring).

    Args:
      table: an :class:`EmpiricalScore`; y: ``[b, d]``; inv2s2: scalar or ``[b, 1]``;
      r: ``>= 1`` sub-blocks kept.

    Returns:
      ``((m [b], l [b], acc [b, d]), certified [b] bool)``; certified means every pruned
      point's weight is below ``e^-CERT_MARGIN / n`` of the largest one.
    """
    b = y.shape[0]
    vals, ids = top_blocks(table, y, r)
    idx, real = block_points(table, ids[:, :r], vals[:, :r])
    pts = table.data[idx].astype(y.dtype)  # [b, r sub, d]
    neg = jnp.array(-jnp.inf, y.dtype)
    logits = jnp.where(real, exact_logits(y, pts, inv2s2), neg)
    m = jnp.max(logits, axis=1)
    w = jnp.exp(logits - m[:, None])
    stats = (m, jnp.sum(w, axis=1), jnp.einsum("bk,bkd->bd", w, pts))
    scale = jnp.broadcast_to(jnp.reshape(inv2s2, (-1,)), (b,))
    max_sq = jnp.max(jnp.where(table.valid, table.sq_norms, 0.0)).astype(y.dtype)
    eps = matmul_error_bound(y, max_sq)
    rest = (vals[:, r] + eps - jnp.sum(y**2, axis=-1)) * scale  # >= every pruned logit
    certified = (vals[:, r] == neg) | (m - rest >= cert_threshold(table))
    return stats, certified


def cert_threshold(table) -> float:
    """The logit gap that certifies pruning: ``log n_pad + CERT_MARGIN``."""
    return float(np.log(table.data.shape[0])) + CERT_MARGIN


def may_certify(table, y, inv2s2):
    """``[b]`` False where no pruning can be certified, so the pruned pass is skipped.

    The gap between the nearest point ``p`` and any other ``p'`` is
    ``||y - p'||^2 - ||y - p||^2 = (p - p').(2 y - p - p') <= min((rho + R)^2,
    4 R (rho + R))`` with ``rho = ||y - centre||`` and ``R`` the table's radius about its
    centre; below the certificate's threshold (times ``2 ve_sigma^2``) nothing can be
    certified (large noise). A speed gate only: either branch gives the same answer.
    """
    rho = jnp.sqrt(jnp.sum((y - table.centre.astype(y.dtype)) ** 2, axis=-1))
    big = table.radius.astype(y.dtype)
    gap = jnp.minimum((rho + big) ** 2, 4.0 * big * (rho + big))
    scale = jnp.broadcast_to(jnp.reshape(inv2s2, (-1,)), (y.shape[0],))
    return gap * scale >= cert_threshold(table) - 1.0


def softmax_stats(table, y, inv2s2):
    """Streamed softmax of ``-||y - x_i||^2 inv2s2`` over a padded training table.

    The certified pruned pass when ``table.prune > 0`` and every query of the call is
    certified (:func:`pruned_softmax_stats`), else :func:`full_softmax_stats`; the
    pruned pass is not even tried when :func:`may_certify` rules it out for a query.

    Args:
      table: an :class:`EmpiricalScore`.
      y: ``[b, d]`` queries in the VE frame (data units).
      inv2s2: ``1 / (2 ve_sigma^2)``, a scalar or ``[b, 1]``.

    Returns:
      ``(m [b], l [b], acc [b, d])``: the largest logit, ``sum_i exp(logit_i - m)`` and
      ``sum_i exp(logit_i - m) x_i``, so the softmax mean is ``acc / l[:, None]``.
    """
    full = lambda: full_softmax_stats(table, y, inv2s2)  # noqa: E731
    if table.prune == 0:
        return full()
    b, d = y.shape

    def pruned():
        stats, certified = pruned_softmax_stats(table, y, inv2s2, table.prune)
        return stats, jnp.all(certified)

    def skipped():  # placeholders, never returned: the full pass replaces them
        zeros = jnp.zeros((b,), y.dtype)
        return (zeros, zeros, jnp.zeros((b, d), y.dtype)), jnp.array(False)

    # one conditional per pass, the full pass in one branch only (it was compiled twice
    # when it was also the fallback inside the pruned branch)
    stats, ok = jax.lax.cond(jnp.all(may_certify(table, y, inv2s2)), pruned, skipped)
    return jax.lax.cond(ok, lambda: stats, full)


class EmpiricalScore(ScoreSource):
    """Score source of the noised empirical distribution of a training set.

    Fields:
      data: ``[n_pad, d]`` flattened training points, padded to a multiple of ``chunk``.
      valid: ``[n_pad]`` bool, False on padding rows.
      sq_norms: ``[n_pad]`` squared norms ``||x_i||^2`` (``+inf`` on padding rows, so
        their matmul logits are ``-inf``).
      data_shape: unflattened data shape (static).
      chunk: training points per step of the online softmax (static).
      exact_top: sub-blocks per query and chunk recomputed from differences (static).
      prune: sub-blocks per query kept by the certified pruned pass (static; 0: always
        the full streamed softmax; :meth:`create` resolves ``"auto"`` to an int).
      centre, radius: ``[d]`` the training points' mean and ``[]`` their largest distance
        from it (:func:`may_certify`).
    """

    data: Array = None
    valid: Array = None
    sq_norms: Array = None
    data_shape: tuple = struct.field(pytree_node=False, default=())
    chunk: int = struct.field(pytree_node=False, default=4096)
    exact_top: int = struct.field(pytree_node=False, default=2)
    prune: int = struct.field(pytree_node=False, default=8)
    centre: Array = None
    radius: Array = None

    @property
    def n(self) -> int:
        """The number of training points (padding excluded)."""
        return int(np.sum(np.asarray(self.valid)))

    def _training_set(self) -> str:
        """``the training set's points (data of shape (8, 2))``, for error messages."""
        n = "n" if isinstance(self.valid, jax.core.Tracer) else self.n
        shape = ", ".join(map(str, (n, *self.data_shape)))
        return f"the training set's points (data of shape ({shape}))"

    def expected_data_shape(self) -> tuple[tuple, Callable[[], str]]:
        """``(data_shape, note)``: queries are ``[batch, *data_shape]`` like the training set;
        the note is written only for an error (counting the points reads ``valid``)."""
        return tuple(self.data_shape), lambda: f" to match {self._training_set()}"

    def check_flat_query(self, y, ve_sigma) -> int:
        """The entry check of :meth:`posterior_mean`: ``y: [batch, d]`` real with ``d`` the
        training points' size, ``ve_sigma`` a scalar or ``[batch, 1]``; returns ``batch``.

        Raises:
          ValueError: naming ``y`` (its shape and the training set's) or ``ve_sigma``.
        """
        d = self.data.shape[1]
        note = lambda: f" (flattened queries) to match {self._training_set()}"  # noqa: E731
        batch = check_array(y, "y", ("batch", d), note=note)["batch"]
        check_real_dtype(ve_sigma, "ve_sigma")
        if array_shape(ve_sigma) not in ((), (batch, 1)):
            raise ValueError(
                f"ve_sigma must be a scalar or have shape [batch={batch}, 1]; "
                f"got shape {array_shape(ve_sigma)}"
            )
        return batch

    @classmethod
    def create(
        cls,
        process: Process,
        data,
        *,
        chunk: int = 4096,
        exact_top: int = 2,
        prune: int | str = "auto",
    ) -> EmpiricalScore:
        """Build from ``data: [n, *data_shape]`` (data units, ``n >= 1``).

        Args:
          process: the noise process.
          data: the training set.
          chunk: training points per online-softmax step (>= 1); lower it for large
            ``batch x d`` to bound memory at ``batch x chunk`` floats.
          exact_top: the sub-blocks (up to 16 points each) with the largest logits of each
            query in each chunk recomputed from differences (>= 1; module docstring).
          prune: sub-blocks per query of the certified pruned pass (>= 0; 0 turns it
            off; module docstring), or ``"auto"``: :data:`AUTO_PRUNE` for points of at
            least :data:`AUTO_PRUNE_MIN_DIM` dimensions, else 0 (:func:`resolve_prune`,
            the measured crossover). The answer is the same either way (to float32).

        Raises:
          ValueError: for empty, non-finite or non-real (complex, bool) data or a bad
            ``chunk`` / ``exact_top`` / ``prune``.
        """
        check_real_dtype(data, "data")
        x = np.asarray(data, dtype=np.float64)
        if x.ndim < 2 or x.shape[0] < 1:
            raise ValueError(f"data must have shape [n >= 1, *data_shape]; got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("data must be finite")
        check_int(chunk, "chunk", low=1)
        check_int(exact_top, "exact_top", low=1)
        prune = resolve_prune(prune, int(np.prod(x.shape[1:])))
        n = x.shape[0]
        chunk = int(min(chunk, n))
        n_pad = -(-n // chunk) * chunk
        flat = np.zeros((n_pad, int(np.prod(x.shape[1:]))), np.float64)
        flat[:n] = x.reshape(n, -1)
        valid = np.arange(n_pad) < n
        centre = flat[:n].mean(axis=0)
        dtype = jax.dtypes.canonicalize_dtype(np.float64)
        return cls(
            process=process,
            data=jnp.asarray(flat, dtype),
            valid=jnp.asarray(valid),
            sq_norms=jnp.asarray(np.where(valid, np.sum(flat**2, axis=1), np.inf), dtype),
            data_shape=tuple(x.shape[1:]),
            chunk=chunk,
            exact_top=int(exact_top),
            prune=prune,
            centre=jnp.asarray(centre, dtype),
            radius=jnp.asarray(np.sqrt(np.max(np.sum((flat[:n] - centre) ** 2, axis=1))), dtype),
        )

    def _softmax_stats(self, x, t):
        """Online softmax over the training set: ``(max logit, sum, weighted sum)``."""
        check_query(self, x, t)
        xf = flatten(x)
        y = xf / broadcast_to_data(self.process.alpha(t), xf)  # VE frame
        s = broadcast_to_data(self.process.ve_sigma(t), xf)  # scalar or [b, 1]
        return softmax_stats(self, y, 0.5 / s**2)

    def posterior_mean(self, y, ve_sigma, keys=None):
        """``sum_i softmax_i(-||y - x_i||^2 / (2 ve_sigma^2)) x_i`` in the VE frame.

        The estimator interface shared with the nearest-neighbour estimator
        (``scorelib/scores/neighbours.py``); ``keys`` is unused here (the sum is exact).

        Args:
          y: ``[b, d]`` flattened queries in the VE frame (data units).
          ve_sigma: scalar or ``[b, 1]``, ``> 0``.
          keys: ignored.

        Returns:
          ``[b, d]``.

        Raises:
          ValueError: as :meth:`check_flat_query`.
        """
        del keys
        self.check_flat_query(y, ve_sigma)
        _, l, acc = softmax_stats(self, y, 0.5 / ve_sigma**2)
        return acc / l[:, None]

    def log_prob(self, x, t):
        """``log p_t(x) = log (1/n) sum_i N(x; alpha x_i, sigma^2 I)`` (nats): ``[batch]``.

        From the streamed softmax's statistics in the VE frame ``y = x / alpha``, level
        ``s = ve_sigma``: ``m + log l`` is ``logsumexp_i -||y - x_i||^2 / (2 s^2)``, so
        ``log p_t(x) = m + log l - log n - (d / 2) log(2 pi s^2) - d log alpha`` (the
        density of ``x = alpha y``). Shapes and errors as :meth:`denoiser`.
        """
        m, l, _ = self._softmax_stats(x, t)
        d = self.data.shape[1]
        s = jnp.broadcast_to(jnp.reshape(self.process.ve_sigma(t), (-1,)), m.shape)
        a = jnp.broadcast_to(jnp.reshape(self.process.alpha(t), (-1,)), m.shape)
        n = jnp.sum(self.valid).astype(m.dtype)
        return m + jnp.log(l) - jnp.log(n) - 0.5 * d * jnp.log(2 * jnp.pi * s**2) - d * jnp.log(a)

    def denoiser(self, x, t):
        """``sum_i softmax_i(-||x/alpha - x_i||^2 / (2 ve_sigma^2)) x_i``; shape of ``x``.

        Karras et al. 2022, App. B.3 (the ideal denoiser). ``x: [batch, *data_shape]``;
        ``t`` a scalar or ``[batch]`` with ``ve_sigma(t) > 0``.

        Raises:
          ValueError: naming ``x`` (its shape and the training set's) unless it is
            ``[batch, *data_shape]``, or ``t`` unless it is a scalar or ``[batch]``.
        """
        _, l, acc = self._softmax_stats(x, t)
        return jnp.reshape(acc / l[:, None], x.shape)
