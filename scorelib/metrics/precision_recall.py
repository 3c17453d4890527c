"""Improved precision and recall with k-nearest-neighbour manifolds.

Kynkäänniemi et al. 2019, "Improved precision and recall metric for assessing generative
models" (NeurIPS), Sec. 3: the manifold of a set is the union of balls centred on its
points, each with radius the distance to that point's ``k``-th nearest neighbour in the set
(``k = 3`` in the paper). Precision is the fraction of generated samples inside the real
manifold (are samples realistic?); recall is the fraction of real examples inside the
generated manifold (is the data's variety covered?). A sampler that drops modes loses recall
and keeps precision; one that adds junk loses precision.

Both depend on the set sizes and on the feature space: compare equal sizes, and read them
beside the floor (training vs test data at the same size). Distances are L2 in the given
features (pixels or classifier features), computed exactly in float64 by
:func:`scorelib.metrics.distances.squared_distances`.
"""

from __future__ import annotations

import numpy as np

from scorelib._checks import check_array, check_example_sets, check_int
from scorelib.metrics.distances import squared_distances


def _knn_sq_radii(x: np.ndarray, k: int, block_size: int) -> np.ndarray:
    """``[n]`` float64 squared distance from each row of ``x`` to its ``k``-th nearest other row."""
    out = []
    for i in range(0, x.shape[0], block_size):
        d2 = squared_distances(x[i : i + block_size], x)
        rows = np.arange(d2.shape[0])
        d2[rows, i + rows] = np.inf  # leave one out; a duplicate elsewhere counts, at 0
        out.append(np.partition(d2, k - 1, axis=1)[:, k - 1])
    return np.concatenate(out)


def _inside(queries: np.ndarray, support: np.ndarray, sq_radii, block_size: int) -> np.ndarray:
    """``[n]`` bool: is each query in some ball ``|q - support_j|^2 <= sq_radii_j``?"""
    return np.concatenate(
        [
            np.any(squared_distances(queries[i : i + block_size], support) <= sq_radii, axis=1)
            for i in range(0, queries.shape[0], block_size)
        ]
    )


def knn_radii(x, *, k: int = 3, block_size: int = 256) -> np.ndarray:
    """``[n]`` float64 distance from each row of ``x: [n, *shape]`` to its ``k``-th nearest
    other row (leave-one-out; an exact duplicate elsewhere counts, at distance 0): the
    radii of the k-NN manifold of ``x``.

    Raises:
      ValueError: unless ``1 <= k <= n - 1``; for non-finite ``x``.
    """
    check_array(x, "x", ("n", "*shape"))
    x = np.asarray(x)
    if x.shape[0] < 2:
        raise ValueError(f"x must be [n >= 2, *shape]; got {x.shape}")
    k = check_int(k, "k", low=1, high=x.shape[0] - 1)
    block_size = check_int(block_size, "block_size", low=1)
    return np.sqrt(_knn_sq_radii(x, k, block_size))


def precision_recall(real, fake, *, k: int = 3, block_size: int = 256) -> dict:
    """Improved precision and recall of ``fake`` with respect to ``real``.

    Args:
      real: ``[n, *shape]`` real examples (features or pixels).
      fake: ``[m, *shape]`` generated examples, same example shape (compare ``n = m``:
        both numbers grow with the size of the other set).
      k: the neighbour whose distance is the ball radius (the paper's ``k = 3``).
      block_size: rows per distance block; memory ``O(block_size * max(n, m))``.

    Returns:
      dict of floats: ``precision`` (fraction of ``fake`` inside the real manifold),
      ``recall`` (fraction of ``real`` inside the fake manifold).

    Raises:
      ValueError: for empty, non-finite or mismatched inputs, or ``k`` not in
        ``[1, min(n, m) - 1]``.

    Reference: Kynkäänniemi et al. 2019, Sec. 3, Eq. 1-2.
    """
    check_example_sets(real, fake, ("real", "fake"))
    real = np.asarray(real)
    fake = np.asarray(fake)
    k = check_int(k, "k", low=1, high=max(1, min(real.shape[0], fake.shape[0]) - 1))
    block_size = check_int(block_size, "block_size", low=1)
    real_r2 = _knn_sq_radii(real, k, block_size)
    fake_r2 = _knn_sq_radii(fake, k, block_size)
    return {
        "precision": float(np.mean(_inside(fake, real, real_r2, block_size))),
        "recall": float(np.mean(_inside(real, fake, fake_r2, block_size))),
    }
