"""Sample-based distances between two point clouds: SW2, energy distance, RBF-MMD.

All take ``x: [n, *shape]`` and ``y: [m, *shape]``, real arrays with one example shape
(else a ``ValueError`` naming the argument, its shape and the expected one), flattened to
``[n, d]``, and are computed on the host in float64 numpy, in row blocks so that memory stays
``O(block * m)``. They return Python floats in the data's units (squared units
where stated).
"""

from __future__ import annotations

import numpy as np

from scorelib._checks import check_array, check_example_sets, check_int

_BLOCK = 1024


def _as_2d(x, y, fields=("x", "y")):
    """``x: [n, *shape]``, ``y: [m, *shape]`` as float64 ``[n, d]``, ``[m, d]`` (checked:
    :func:`scorelib._checks.check_example_sets` naming ``fields``, and finite)."""
    check_example_sets(x, y, fields)
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    x = x.reshape(x.shape[0], -1)
    y = y.reshape(y.shape[0], -1)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError(f"{fields[0]} and {fields[1]} must be finite")
    return x, y


def squared_distances(a, b) -> np.ndarray:
    """``[p, q]`` squared Euclidean distances between the rows of ``a`` and ``b``, float64.

    The one pairwise-distance routine of the metrics (energy distance, MMD, the median
    heuristic, nearest neighbours). The fast form ``|a|^2 + |b|^2 - 2 a.b`` loses all
    relative precision for nearly coincident points, so entries below
    ``1e-8 (|a|^2 + |b|^2)`` are recomputed from the differences: equal rows get exactly
    0, and every entry has a relative error of order ``1e-8`` or better.

    Args:
      a: ``[p, *shape]``; b: ``[q, *shape]`` (flattened to ``d`` features; data units).

    Returns:
      ``[p, q]`` float64, squared data units.

    Raises:
      ValueError: for empty, non-finite or mismatched inputs.
    """
    a, b = _as_2d(a, b, ("a", "b"))
    na, nb = (a * a).sum(1)[:, None], (b * b).sum(1)[None, :]
    d2 = na + nb - 2.0 * a @ b.T
    i, j = np.nonzero(d2 <= 1e-8 * (na + nb))
    if i.size:
        d2[i, j] = ((a[i] - b[j]) ** 2).sum(1)
    return d2


def _block_sum(a: np.ndarray, b: np.ndarray, fn, *, same: bool = False) -> float:
    """``sum_ij fn(|a_i - b_j|^2)`` in row blocks; ``same``: ``b is a``, diagonal set to 0."""
    total = 0.0
    for s in range(0, a.shape[0], _BLOCK):
        d2 = squared_distances(a[s : s + _BLOCK], b)
        if same:
            r = np.arange(d2.shape[0])
            d2[r, s + r] = 0.0
        total += float(fn(d2).sum())
    return total


def wasserstein2_1d(u, v) -> float:
    """Exact squared W2 between two 1-D empirical distributions (equal weights).

    ``W2^2 = int_0^1 (F_u^{-1}(s) - F_v^{-1}(s))^2 ds`` with the quantile functions of
    the empirical measures, evaluated exactly on the merged breakpoints
    ``{i/n} U {j/m}``; sizes may differ.

    Args:
      u: ``[n]``; v: ``[m]`` (``n, m >= 1``).

    Returns:
      squared W2 (squared data units).

    Raises:
      ValueError: naming ``u`` or ``v`` when it is not a real 1-D array.
    """
    check_array(u, "u", ("n",))
    check_array(v, "v", ("m",))
    u = np.sort(np.asarray(u, dtype=np.float64))
    v = np.sort(np.asarray(v, dtype=np.float64))
    return float(_w2sq_sorted(u[:, None], v[:, None])[0])


def _w2sq_sorted(us: np.ndarray, vs: np.ndarray) -> np.ndarray:
    """Squared W2 per column of column-sorted ``us: [n, k]`` and ``vs: [m, k]``."""
    n, m = us.shape[0], vs.shape[0]
    if n == m:
        return np.mean((us - vs) ** 2, axis=0)
    cuts = np.union1d(np.arange(1, n + 1) / n, np.arange(1, m + 1) / m)
    lo = np.concatenate([[0.0], cuts[:-1]])
    w = cuts - lo
    mid = 0.5 * (lo + cuts)
    iu = np.minimum(np.floor(mid * n).astype(np.int64), n - 1)
    iv = np.minimum(np.floor(mid * m).astype(np.int64), m - 1)
    return np.sum(w[:, None] * (us[iu] - vs[iv]) ** 2, axis=0)


def sliced_wasserstein2(x, y, *, n_projections: int = 256, seed: int = 0) -> float:
    """Sliced Wasserstein-2 distance (Rabin et al. 2011; Bonneel et al. 2015).

    ``SW2(x, y) = ( E_theta W2^2(theta . x, theta . y) )^{1/2}`` with ``theta``
    uniform on the unit sphere, estimated with ``n_projections`` directions drawn
    from ``np.random.default_rng(seed)``; each 1-D W2 is exact
    (:func:`wasserstein2_1d`). For ``d = 1`` the single direction is ``+1`` and the
    result is the exact W2. Between two distributions that differ by a shift
    ``delta``, ``SW2 = |delta| / sqrt(d)``.

    Args:
      x: ``[n, *shape]``; y: ``[m, *shape]`` (flattened to ``d`` features).
      n_projections: number of random directions (ignored when ``d = 1``).
      seed: seed of the directions.

    Returns:
      SW2 in data units (not squared).

    Raises:
      ValueError: for empty, non-finite or mismatched inputs, or ``n_projections < 1``.
    """
    x, y = _as_2d(x, y)
    d = x.shape[1]
    check_int(n_projections, "n_projections", low=1)
    if d == 1:
        theta = np.ones((1, 1))
    else:
        theta = np.random.default_rng(seed).standard_normal((d, n_projections))
        theta /= np.linalg.norm(theta, axis=0, keepdims=True)
    w2sq = _w2sq_sorted(np.sort(x @ theta, axis=0), np.sort(y @ theta, axis=0))
    return float(np.sqrt(np.mean(w2sq)))


def energy_distance(x, y) -> float:
    """Squared energy distance (Székely & Rizzo 2004, 2013), V-statistic form.

    ``D^2 = 2 E|X - Y| - E|X - X'| - E|Y - Y'|`` with the expectations taken over
    the empirical measures (all pairs, diagonal included), so ``D^2 >= 0`` and it is
    0 exactly when the two sample sets are equal as multisets. In 1-D,
    ``sqrt(D^2)`` equals ``scipy.stats.energy_distance``.

    Args:
      x: ``[n, *shape]``; y: ``[m, *shape]``.

    Returns:
      ``D^2`` in data units (``|.|`` is the Euclidean norm, not squared).

    Raises:
      ValueError: for empty, non-finite or mismatched inputs.
    """
    x, y = _as_2d(x, y)
    n, m = x.shape[0], y.shape[0]
    xy = _block_sum(x, y, np.sqrt) / (n * m)
    xx = _block_sum(x, x, np.sqrt, same=True) / (n * n)
    yy = _block_sum(y, y, np.sqrt, same=True) / (m * m)
    return 2.0 * xy - xx - yy


def median_bandwidth(x, y, max_points: int = 1000) -> float:
    """Median heuristic (Gretton et al. 2012): median pairwise distance of the pooled set.

    Uses at most ``max_points // 2`` evenly spaced points of each set, and only
    distinct pairs (``i < j``). Returns a distance in data units; raises
    ``ValueError`` if it is 0 (all pooled points equal).
    """
    x, y = _as_2d(x, y)
    k = max(1, max_points // 2)
    xs = x[np.linspace(0, x.shape[0] - 1, min(k, x.shape[0])).astype(int)]
    ys = y[np.linspace(0, y.shape[0] - 1, min(k, y.shape[0])).astype(int)]
    z = np.concatenate([xs, ys])
    d2 = squared_distances(z, z)
    iu = np.triu_indices(z.shape[0], k=1)
    h = float(np.sqrt(np.median(d2[iu])))
    if not h > 0.0:
        raise ValueError("median heuristic bandwidth is 0: pass bandwidth explicitly")
    return h


def mmd_rbf(x, y, bandwidth: float | None = None, *, unbiased: bool = False) -> float:
    """Squared maximum mean discrepancy with the Gaussian kernel (Gretton et al. 2012).

    ``k(a, b) = exp(-|a - b|^2 / (2 h^2))``, ``h = bandwidth`` or, if ``None``, the
    median heuristic :func:`median_bandwidth`.

    * ``unbiased=False``: the biased V-statistic ``MMD_b^2`` (eq. 5), ``>= 0``, equal to
      0 when ``x`` and ``y`` are the same multiset.
    * ``unbiased=True``: the U-statistic ``MMD_u^2`` (eq. 3; diagonal terms of the
      within-set sums dropped); unbiased, can be negative. Needs ``n, m >= 2``.

    Args:
      x: ``[n, *shape]``; y: ``[m, *shape]``.

    Returns:
      ``MMD^2`` (dimensionless: kernel values are in ``[0, 1]``).

    Raises:
      ValueError: for empty, non-finite or mismatched inputs, ``bandwidth <= 0``, or
        ``unbiased`` with fewer than 2 points in a set.
    """
    x, y = _as_2d(x, y)
    h = median_bandwidth(x, y) if bandwidth is None else float(bandwidth)
    if not h > 0.0:
        raise ValueError(f"bandwidth must be > 0; got {bandwidth}")
    n, m = x.shape[0], y.shape[0]
    kern = lambda d2: np.exp(-d2 / (2.0 * h * h))
    kxx = _block_sum(x, x, kern, same=True)
    kyy = _block_sum(y, y, kern, same=True)
    kxy = _block_sum(x, y, kern) / (n * m)
    if not unbiased:
        return kxx / (n * n) + kyy / (m * m) - 2.0 * kxy
    if n < 2 or m < 2:
        raise ValueError(f"unbiased MMD needs n, m >= 2; got {n}, {m}")
    # the diagonal k(x_i, x_i) = 1 exactly
    return (kxx - n) / (n * (n - 1)) + (kyy - m) / (m * (m - 1)) - 2.0 * kxy


def mean_paired_distance(x, y) -> float:
    """Mean L2 distance ``mean_i ||x_i - y_i||`` between paired samples (data units).

    For two samplers run from the same starts and draws (e.g. the nearest-neighbour
    estimator against the exact score), how far apart their samples land.

    Args:
      x, y: ``[n, *shape]`` each, ``n >= 1``; row ``i`` of one is paired with row ``i``
        of the other.

    Raises:
      ValueError: for empty or mismatched inputs.
    """
    sizes = check_array(x, "x", ("n", "*shape"))
    check_array(y, "y", ("n", "*shape"), sizes=sizes, note=" (the shape of x)")
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    diff = (x - y).reshape(x.shape[0], -1)
    return float(np.mean(np.sqrt(np.sum(diff**2, axis=1))))


def sample_distances(samples, reference, *, n_projections: int = 256, seed: int = 0) -> dict:
    """Energy distance and sliced W2 of ``samples`` to ``reference`` (NaN for failed samples).

    Args:
      samples: ``[n, *shape]`` generated samples; reference: ``[m, *shape]`` exact samples.
      n_projections, seed: as :func:`sliced_wasserstein2`.

    Returns:
      ``{"energy": D^2 (data units), "sw2": SW2 (data units)}``; both ``nan`` when
      ``samples`` holds a NaN or inf (a diverged sampler: reported, not raised).

    Raises:
      ValueError: as :func:`energy_distance` for a bad ``reference`` or mismatched shapes.
    """
    check_example_sets(samples, reference, ("samples", "reference"))
    x = np.asarray(samples, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        return {"energy": float("nan"), "sw2": float("nan")}
    return {
        "energy": energy_distance(x, reference),
        "sw2": sliced_wasserstein2(x, reference, n_projections=n_projections, seed=seed),
    }
