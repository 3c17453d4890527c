"""The nearest-neighbour estimator of the training-set posterior mean (sigma-CFDM, Sec. 5).

Scarvelis, Saez de Ocariz Borde and Solomon, "Closed-form diffusion models" (arXiv
2310.12395), adapting DEANN (Karppa, Aumuller and Pagh, AISTATS 2022): the softmax over
``N`` training points is a Gaussian kernel sum, estimated from the ``k`` nearest training
points of the query plus ``l`` points drawn uniformly from the other ``N - k``, weighted
``1/N`` and ``(N - k)/(l N)`` (the inverse inclusion probabilities), so

    D(y) ~ sum_{j in K u L} w_j x_j,   w = softmax_j( -||y - x_j||^2 / (2 ve_sigma^2) + log c_j )

with ``c_j = 1/N`` on the neighbours and ``(N - k)/(l N)`` on the random points. With
``k = N`` it is the exact posterior mean; with ``l = 0`` and ``k = 1`` the nearest point.
The logits are recomputed exactly from differences after the search.

Search backends (``backend``):

* ``jax`` (default, any device): exact top-``k``: the ``k`` sub-blocks with the largest
  matmul maxima over the training set (:func:`scorelib.scores.empirical.top_blocks`, the
  pass of the exact softmax's pruning), their points ranked by exact distances.
* ``faiss`` (``faiss-cpu``, host callback): ``index = "flat"`` (exact ``IndexFlatL2``),
  ``"ivf"`` (``IndexIVFFlat``, ``nlist`` cells, ``nprobe`` searched) or ``"hnsw"``
  (``IndexHNSWFlat``, ``hnsw_m`` links, ``ef_search``); the approximate ones report their
  recall@k with :func:`recall_at_k`.

The uniform draws of example ``b`` come from the key the caller passes for that query
(``SmoothedScore`` passes one per perturbation and time), so they are per-example too.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from scorelib._checks import check_arrays, check_choice, check_int, check_shape, require
from scorelib.scores.empirical import EmpiricalScore, block_points, exact_logits, top_blocks

Array = Any

BACKENDS = ("jax", "faiss")
FAISS_INDEXES = ("flat", "ivf", "hnsw")


def top_k_neighbours(table: EmpiricalScore, y: Array, k: int) -> Array:
    """``[b, k]`` indices of the ``k`` training points nearest to ``y: [b, d]`` (exact, JAX).

    The ``k`` nearest points lie in the ``k`` sub-blocks with the largest matmul maxima
    (:func:`scorelib.scores.empirical.top_blocks`: one matmul pass over the table with a
    running top-``k`` of sub-block maxima, about ``1/16`` of the points); the ``16 k``
    points of those sub-blocks are then ranked by distances recomputed from differences.
    """
    vals, ids = top_blocks(table, y, k)
    idx, real = block_points(table, ids[:, :k], vals[:, :k])  # [b, k sub]
    pts = table.data[idx].astype(y.dtype)
    neg = jnp.array(-jnp.inf, y.dtype)
    _, pos = jax.lax.top_k(jnp.where(real, exact_logits(y, pts, 1.0), neg), k)
    return jnp.take_along_axis(idx, pos, 1).astype(jnp.int32)


def complement_draws(nbr: Array, u: Array) -> Array:
    """Map ``u: [b, l]`` in ``[0, N - k)`` to the ``u``-th index not in ``nbr: [b, k]``.

    With ``s`` the sorted neighbours, the ``u``-th (0-based) other index is
    ``u + #{j : s_j - j <= u}``.
    """
    s = jnp.sort(nbr, axis=1)
    gaps = s - jnp.arange(s.shape[1], dtype=s.dtype)[None]  # non-neighbours before s_j
    return u + jnp.sum(gaps[:, None, :] <= u[:, :, None], axis=-1).astype(u.dtype)


class NeighbourScore(struct.PyTreeNode):
    """The k-nearest + l-uniform estimator of the posterior mean over a training table.

    Fields:
      table: the :class:`EmpiricalScore` holding the training set (and its process).
      k, l: neighbours and uniform draws per query (static).
      backend: ``jax`` or ``faiss`` (static).
      n: the number of training points (static).
      index: the faiss index (static; ``None`` for ``jax``).
    """

    table: EmpiricalScore
    n: int = struct.field(pytree_node=False, default=1)
    k: int = struct.field(pytree_node=False, default=15)
    l: int = struct.field(pytree_node=False, default=15)  # noqa: E741
    backend: str = struct.field(pytree_node=False, default="jax")
    index: Any = struct.field(pytree_node=False, default=None)

    @classmethod
    def create(
        cls,
        table: EmpiricalScore,
        *,
        k: int = 15,
        l: int = 15,  # noqa: E741
        backend: str = "jax",
        index: str | None = None,
        nlist: int | None = None,
        nprobe: int | None = None,
        hnsw_m: int | None = None,
        ef_search: int | None = None,
    ) -> NeighbourScore:
        """Build over ``table``'s training set of ``N`` points.

        Args:
          table: the exact source (its training set and process).
          k: neighbours, ``1 <= k <= N``.
          l: uniform draws from the other points, ``>= 0`` (0 when ``k = N``).
          backend: ``jax`` or ``faiss``.
          index: faiss index kind, ``flat`` (default), ``ivf`` or ``hnsw`` (faiss only).
          nlist: IVF cells (default ``round(sqrt(N))``); nprobe: cells searched (default 8).
          hnsw_m: HNSW links per node (default 32); ef_search: HNSW search breadth
            (default 64).

        Raises:
          ValueError: naming ``score.k``, ``score.l``, ``score.backend``, ``score.index``
            and the index options (an option of another backend or index is refused).
        """
        n = table.n
        k = check_int(k, "score.k", low=1, high=n)
        l = check_int(l, "score.l", low=0)  # noqa: E741
        require(l == 0 or k < n, "score.l", "0 when score.k = N (no other points)", l)
        check_choice(backend, "score.backend", BACKENDS)
        given = {
            "index": index,
            "nlist": nlist,
            "nprobe": nprobe,
            "hnsw_m": hnsw_m,
            "ef_search": ef_search,
        }
        used = {
            "jax": (),
            "flat": ("index",),
            "ivf": ("index", "nlist", "nprobe"),
            "hnsw": ("index", "hnsw_m", "ef_search"),
        }
        if backend == "faiss":
            index = check_choice("flat" if index is None else index, "score.index", FAISS_INDEXES)
        kind = index if backend == "faiss" else "jax"
        for name, value in given.items():
            require(
                value is None or name in used[kind],
                f"score.{name}",
                f"unset with score.backend={backend}"
                + (f", score.index={index}" if backend == "faiss" else ""),
                value,
            )
        if backend == "jax":
            return cls(table=table, n=n, k=k, l=l, backend=backend)
        data = np.asarray(table.data[:n], np.float32)
        return cls(
            table=table,
            n=n,
            k=k,
            l=l,
            backend=backend,
            index=faiss_index(data, index, nlist, nprobe, hnsw_m, ef_search),
        )

    @property
    def process(self):
        """The table's process."""
        return self.table.process

    @property
    def data_shape(self) -> tuple:
        """The shape of one training point."""
        return self.table.data_shape

    def expected_data_shape(self) -> tuple[tuple, Any]:
        """The table's: queries are ``[batch, *data_shape]`` like its training set."""
        return self.table.expected_data_shape()

    def search(self, y: Array) -> Array:
        """``[b, k]`` int32 indices of the (approximate, for ivf/hnsw) ``k`` nearest points.

        ``y: [b, d]`` flattened queries (data units).

        Raises:
          ValueError: naming ``y`` unless it is real ``[b, d]`` with the training set's ``d``.
        """
        self.table.check_flat_query(y, 1.0)
        if self.backend == "jax":
            return top_k_neighbours(self.table, y, self.k)
        index, k = self.index, self.k

        def host(q):
            _, i = index.search(np.ascontiguousarray(np.asarray(q, np.float32)), k)
            return i.astype(np.int32)

        out = jax.ShapeDtypeStruct((y.shape[0], k), jnp.int32)
        return jax.pure_callback(host, out, y, vmap_method="sequential")

    def posterior_mean(self, y, ve_sigma, keys=None):
        """The estimator of ``sum_i softmax_i(-||y - x_i||^2 / (2 ve_sigma^2)) x_i``.

        Args:
          y: ``[b, d]`` flattened queries in the VE frame (data units).
          ve_sigma: scalar or ``[b, 1]``, ``> 0``.
          keys: ``[b]`` keys of the uniform draws (required when ``l > 0``).

        Returns:
          ``[b, d]``.

        Raises:
          ValueError: if ``l > 0`` and ``keys`` is None or not ``[b]`` keys; naming ``y``
            or ``ve_sigma`` as :meth:`EmpiricalScore.check_flat_query`.
        """
        b = self.table.check_flat_query(y, ve_sigma)
        n = self.n
        nbr = self.search(y)
        idx, logc = nbr, jnp.full((b, self.k), -math.log(n), y.dtype)
        if self.l > 0:
            require(keys is not None, "keys", "given when score.l > 0", None)
            check_shape(keys, "keys", (b,), note=" (one key per query)")
            u = jax.vmap(lambda kk: jax.random.randint(kk, (self.l,), 0, n - self.k))(keys)
            rand = complement_draws(nbr, u.astype(jnp.int32))
            c = math.log((n - self.k) / (self.l * n))
            idx = jnp.concatenate([nbr, rand], 1)
            logc = jnp.concatenate([logc, jnp.full((b, self.l), c, y.dtype)], 1)
        pts = self.table.data[idx].astype(y.dtype)  # [b, k + l, d]
        logits = exact_logits(y, pts, 0.5 / ve_sigma**2) + logc
        w = jax.nn.softmax(logits, axis=1)
        return jnp.einsum("bj,bjd->bd", w, pts)


def faiss_index(data: np.ndarray, kind: str, nlist, nprobe, hnsw_m, ef_search):
    """A faiss index over ``data: [N, d]`` float32 (``flat``, ``ivf`` or ``hnsw``).

    Raises:
      ValueError: naming ``score.nlist``, ``score.nprobe``, ``score.hnsw_m`` or
        ``score.ef_search``.
    """
    # loaded (with its OpenMP runtime) only where a search runs
    import faiss

    n, d = data.shape
    if kind == "flat":
        index = faiss.IndexFlatL2(d)
    elif kind == "ivf":
        nlist = check_int(
            nlist if nlist is not None else max(1, round(math.sqrt(n))),
            "score.nlist",
            low=1,
            high=n,
        )
        nprobe = check_int(8 if nprobe is None else nprobe, "score.nprobe", low=1, high=nlist)
        index = faiss.IndexIVFFlat(faiss.IndexFlatL2(d), d, nlist)
        index.train(data)
        index.nprobe = nprobe
    else:
        hnsw_m = check_int(32 if hnsw_m is None else hnsw_m, "score.hnsw_m", low=2)
        index = faiss.IndexHNSWFlat(d, hnsw_m)
        index.hnsw.efSearch = check_int(
            64 if ef_search is None else ef_search, "score.ef_search", low=1
        )
    index.add(data)
    return index


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean fraction of the exact ``k`` nearest found: ``|found_b & exact_b| / k``.

    Args:
      found, exact: ``[b, k]`` integer indices.

    Raises:
      ValueError: naming ``found`` or ``exact`` unless both are ``[b, k]``, one shape.
    """
    check_arrays(("b", "k"), exact=exact, found=found)
    found, exact = np.asarray(found), np.asarray(exact)
    hits = [len(np.intersect1d(f, e)) for f, e in zip(found, exact, strict=True)]
    return float(np.mean(hits) / exact.shape[1])
