"""Memorisation: how close samples lie to their nearest training image.

A model that copies its training set produces samples much closer to some
training image than fresh data (the test split) is; Fréchet distances do not see
this. Distances are L2 in pixel space (data units: images in ``[-1, 1]``).
"""

from __future__ import annotations

import numpy as np

from scorelib._checks import check_array, check_arrays, check_example_sets, check_int
from scorelib.metrics.distances import squared_distances


def nearest_neighbours(samples, train, *, k: int = 1, block_size: int = 256, exclude_self=False):
    """Exact ``k`` nearest training images of each sample (L2 in pixel space).

    Distances come from :func:`scorelib.metrics.distances.squared_distances` (float64,
    exact where points nearly coincide), so a sample equal to a training image gets
    distance exactly 0.

    Args:
      samples: ``[n, *shape]``; train: ``[m, *shape]``.
      k: neighbours per sample (``1 <= k <= m``, minus one with ``exclude_self``).
      block_size: samples per block; memory is ``O(block_size * m)``.
      exclude_self: ``samples`` is ``train`` itself; sample ``i`` may not match
        training index ``i`` (leave-one-out; duplicates at other indices still count).

    Returns:
      ``(dist [n, k] float32, idx [n, k] int32)``, sorted by distance.

    Raises:
      ValueError: for empty or mismatched inputs, or an impossible ``k``.
    """
    check_example_sets(samples, train, ("samples", "train"))
    s = np.asarray(samples)
    t = np.asarray(train)
    if exclude_self and s.shape[0] != t.shape[0]:
        raise ValueError("exclude_self needs samples to be the training set")
    m = t.shape[0] - (1 if exclude_self else 0)
    if not 1 <= k <= m:
        raise ValueError(f"k must be in [1, {m}]; got {k}")
    block_size = check_int(block_size, "block_size", low=1)
    t = t.reshape(t.shape[0], -1)
    s = s.reshape(s.shape[0], -1)
    dists, idxs = [], []
    for start in range(0, s.shape[0], block_size):
        d2 = squared_distances(s[start : start + block_size], t)
        rows = np.arange(d2.shape[0])
        if exclude_self:
            d2[rows, start + rows] = np.inf
        cand = np.argpartition(d2, k - 1, axis=1)[:, :k]  # the k smallest, unordered
        order = np.argsort(d2[rows[:, None], cand], axis=1)
        idx = np.take_along_axis(cand, order, 1)
        dists.append(np.sqrt(d2[rows[:, None], idx]))
        idxs.append(idx)
    return np.concatenate(dists).astype(np.float32), np.concatenate(idxs).astype(np.int32)


def nearest_neighbour_distances(samples, train, *, block_size: int = 256) -> np.ndarray:
    """``[n]`` float32 L2 distance from each of ``samples: [n, *shape]`` to its nearest
    image in ``train: [m, *shape]``; see :func:`nearest_neighbours`."""
    return nearest_neighbours(samples, train, k=1, block_size=block_size)[0][:, 0]


def leave_one_out_distances(train) -> np.ndarray:
    """``[m]`` float32 distance of each image of ``train: [m, *shape]`` to its nearest other
    image (:func:`nearest_neighbours` with ``exclude_self``): the radii of the copy rate."""
    return nearest_neighbours(train, train, k=1, exclude_self=True)[0][:, 0]


def memorisation_stats(
    samples, train, reference=None, *, copy_fraction: float = 1.0 / 3.0, train_loo=None
):
    """Summary statistics of sample-to-training-set distances.

    The copy rate is per training point: a sample copies training image ``j`` when it lies
    closer to ``x_j`` than ``copy_fraction`` times ``x_j``'s own leave-one-out
    nearest-neighbour distance ``r_j = min_{i != j} ||x_i - x_j||``, so the threshold
    follows the local density of the training set (a copy of an isolated image counts
    as a copy of a crowded one does). Only the nearest training image needs checking:
    with ``copy_fraction <= 1/2``, ``||s - x_j|| < r_j / 3`` makes every other ``x_i`` at
    least ``r_j - r_j / 3 > ||s - x_j||`` away (triangle inequality), so ``x_j`` is the
    sample's nearest image.

    Args:
      samples: ``[n, *shape]`` generated images; train: ``[m, *shape]`` the training
        set (``m >= 3``); reference: optional ``[r, *shape]`` held-out real images
        (the test split), the yardstick for what a fresh image looks like.
      copy_fraction: threshold factor for the copy rates below, in ``(0, 1/2]``.
      train_loo: optional ``[m]`` :func:`leave_one_out_distances` of ``train``, computed
        once for many sample sets (``None``: computed here).

    Returns:
      dict of floats:

      * ``sample_nn_mean``, ``sample_nn_median``: NN distance of samples to ``train``.
      * ``train_loo_nn_median``: median leave-one-out NN distance within ``train``.
      * ``copy_rate``: fraction of samples with ``d(s, x_j) < copy_fraction * r_j`` for
        their nearest training image ``x_j`` (the definition above).
      * ``ratio_copy_rate``: fraction of samples with ``d_1 / d_2 < copy_fraction``
        (first over second nearest distance; Yoon et al. 2023 use 1/3).
      * with ``reference``: ``reference_nn_mean``, ``reference_nn_median``,
        ``nn_mean_ratio = sample_nn_mean / reference_nn_mean`` (well below 1 means
        samples sit closer to training images than fresh data does), and
        ``reference_copy_rate`` (the same per-point rule applied to the reference).

    Raises:
      ValueError: for mismatched shapes, a training set of fewer than 3 images or a
        ``copy_fraction`` outside ``(0, 1/2]``.
    """
    check_example_sets(samples, train, ("samples", "train"))
    if reference is not None:
        check_example_sets(train, reference, ("train", "reference"))
    t = np.asarray(train)
    if t.shape[0] < 3:
        raise ValueError(f"train needs at least 3 images; got {t.shape[0]}")
    if not 0.0 < copy_fraction <= 0.5:
        raise ValueError(f"copy_fraction must be in (0, 1/2]; got {copy_fraction}")
    d, idx = nearest_neighbours(samples, t, k=2)
    loo = leave_one_out_distances(t) if train_loo is None else np.asarray(train_loo)
    if loo.shape != (t.shape[0],):
        raise ValueError(f"train_loo must have shape ({t.shape[0]},); got {loo.shape}")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(d[:, 1] > 0, d[:, 0] / d[:, 1], 0.0)
    out = {
        "sample_nn_mean": float(np.mean(d[:, 0])),
        "sample_nn_median": float(np.median(d[:, 0])),
        "train_loo_nn_median": float(np.median(loo)),
        "copy_rate": copy_rate(d[:, 0], idx[:, 0], loo, copy_fraction),
        "ratio_copy_rate": float(np.mean(ratio < copy_fraction)),
    }
    if reference is not None:
        r, r_idx = nearest_neighbours(reference, t, k=1)
        out["reference_nn_mean"] = float(np.mean(r[:, 0]))
        out["reference_nn_median"] = float(np.median(r[:, 0]))
        out["nn_mean_ratio"] = out["sample_nn_mean"] / out["reference_nn_mean"]
        out["reference_copy_rate"] = copy_rate(r[:, 0], r_idx[:, 0], loo, copy_fraction)
    return out


def copy_rate(nn_dist, nn_idx, train_loo, copy_fraction: float = 1.0 / 3.0) -> float:
    """Fraction of samples within ``copy_fraction`` of their nearest training image's own
    leave-one-out NN distance: ``mean_s [nn_dist_s < copy_fraction * train_loo[nn_idx_s]]``.

    Args:
      nn_dist: ``[n]`` distance of each sample to its nearest training image.
      nn_idx: ``[n]`` index of that image.
      train_loo: ``[m]`` leave-one-out NN distance of each training image.

    A sample at distance 0 counts as a copy even on an image duplicated in the training
    set (where ``train_loo`` is 0 and nothing is strictly closer).

    Raises:
      ValueError: naming ``nn_dist``, ``nn_idx`` or ``train_loo`` unless they are 1-D and
        ``nn_dist`` and ``nn_idx`` of one length.
    """
    check_arrays(("n",), nn_dist=nn_dist, nn_idx=nn_idx)
    check_array(train_loo, "train_loo", ("m",))
    d = np.asarray(nn_dist)
    thr = copy_fraction * np.asarray(train_loo)[np.asarray(nn_idx)]
    return float(np.mean((d < thr) | (d == 0)))
