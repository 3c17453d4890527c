"""What a sample set is judged by: FD in classifier features beside its floor and a trivial
baseline, and the memorisation statistic beside that of held-out data (FD alone does not see
a model that copies its training set); energy distance and sliced W2 for 2-D data."""

from __future__ import annotations

import os

import numpy as np

from scorelib.metrics import (
    FeatureExtractor,
    energy_distance,
    fd_features,
    fd_floor,
    memorisation_stats,
    mnist_subset_config,
    sliced_wasserstein2,
)
from scorelib.metrics.classifier import ClassifierConfig, default_cache_dir

CLASSIFIERS = {"digits": ClassifierConfig, "mnist": mnist_subset_config}


def gaussian_baseline(train: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` draws from the Gaussian fitted to ``train: [m, *shape]`` (mean and full covariance)."""
    flat = train.reshape(train.shape[0], -1).astype(np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.multivariate_normal(flat.mean(0), np.cov(flat, rowvar=False), size=n, method="eigh")
    return draws.reshape((n,) + train.shape[1:]).astype(np.float32)


def check_finite(samples) -> None:
    """Raise ValueError naming how many of ``samples: [n, ...]`` hold a NaN or inf."""
    bad = int(np.sum(~np.isfinite(np.reshape(samples, (len(samples), -1))).all(axis=1)))
    if bad:
        raise ValueError(
            f"{bad} of {len(samples)} samples are not finite (their trajectories diverged): "
            "no distance is defined; inspect samples.npz or sample with another sampler"
        )


def evaluate_images(
    samples, dataset, data_name: str, *, seed: int = 0, cache_dir=None, floor_draws: int = 20
) -> dict:
    """FD_<data> of ``samples`` vs the test split, its floor and Gaussian baseline, memorisation.

    The floor is the FD of ``n`` i.i.d. draws (with replacement) of training images, the
    FD a sampler that reproduced the training distribution exactly would get with the
    same number of samples; its spread over ``floor_draws`` draws is the sampling noise
    of an FD at this ``n``. FD has a finite-sample bias of order ``tr(cov) / n``: use
    thousands of samples (the digits preset draws 10,000).

    Args:
      samples: ``[n, H, W, C]`` in ``[-1, 1]``.
      dataset: the run's ``ImageDataset`` (train and test splits).
      data_name: ``'digits'`` or ``'mnist'`` (which cached classifier gives the features).
      seed: seed of the floor and baseline draws.
      floor_draws: number of floor draws (>= 1).

    Returns:
      dict with ``fd`` (samples vs test), ``fd_floor`` and ``fd_floor_std`` (mean and std
      over the draws), ``fd_train_all`` (all training images vs test: the floor as
      ``n`` grows), ``fd_gaussian`` (``n`` draws of a Gaussian fit to train vs test),
      ``n``, and the memorisation statistics of the samples and of the test split.

    Raises:
      ValueError: for a ``data_name`` without a bundled classifier, or non-finite samples.
    """
    check_finite(samples)
    if data_name not in CLASSIFIERS:
        raise ValueError(
            f"FD needs a bundled classifier: data.name must be one of {list(CLASSIFIERS)}"
        )
    cache = cache_dir or default_cache_dir(os.environ)
    ext = FeatureExtractor.load_or_train(CLASSIFIERS[data_name](), cache)
    n = samples.shape[0]
    train_feats, test_feats = ext.features(dataset.train), ext.features(dataset.test)
    floor, floor_std = fd_floor(train_feats, test_feats, n, draws=floor_draws, seed=seed)
    out = {
        "n": int(n),
        "fd": fd_features(ext.features(samples), test_feats),
        "fd_floor": floor,
        "fd_floor_std": floor_std,
        "fd_floor_draws": int(floor_draws),
        "fd_train_all": fd_features(train_feats, test_feats),
        "n_train": int(dataset.train.shape[0]),
        "fd_gaussian": fd_features(
            ext.features(gaussian_baseline(dataset.train, n, seed)), test_feats
        ),
        "classifier_test_accuracy": float(ext.info.get("test_accuracy", float("nan"))),
    }
    mem = memorisation_stats(samples, dataset.train, reference=dataset.test)
    out.update({f"mem_{k}": v for k, v in mem.items()})
    return out


def evaluate_points(samples, reference, *, seed: int = 0, prior=None) -> dict:
    """Energy distance and sliced W2 of ``samples: [n, 2]`` to ``reference: [m, 2]``.

    With ``prior`` (draws of the process's prior), its energy distance is reported beside.

    Raises:
      ValueError: for non-finite samples.
    """
    check_finite(samples)
    out = {
        "energy_distance": energy_distance(samples, reference),
        "sliced_w2": sliced_wasserstein2(samples, reference, n_projections=256, seed=seed),
    }
    if prior is not None:
        out["energy_distance_prior"] = energy_distance(prior, reference)
    return out


def format_image_table(r: dict, name: str) -> str:
    """A markdown table of :func:`evaluate_images`'s result."""
    n = f"{r['n']:,}"
    lines = [
        f"| {n} images | FD_{name} vs test (lower is better) | mean NN distance to train |",
        "|---|---|---|",
        f"| samples | {r['fd']:.2f} | {r['mem_sample_nn_mean']:.3f} |",
        f"| training images, {n} i.i.d. draws (floor; mean +- std of {r['fd_floor_draws']}) "
        f"| {r['fd_floor']:.2f} +- {r['fd_floor_std']:.2f} | |",
        f"| Gaussian fit to train, {n} draws (baseline) | {r['fd_gaussian']:.2f} | |",
        f"| test images (reference) | 0 | {r['mem_reference_nn_mean']:.3f} |",
        "",
        f"FD ratio samples/floor: {r['fd'] / r['fd_floor']:.2f}; baseline/samples: "
        f"{r['fd_gaussian'] / r['fd']:.1f}x. All {r['n_train']:,} training images vs test "
        f"(the floor as n grows): {r['fd_train_all']:.2f}. NN-distance ratio samples/test: "
        f"{r['mem_nn_mean_ratio']:.2f} (well below 1 means copying); copy rate "
        f"{r['mem_copy_rate']:.3f} vs test {r['mem_reference_copy_rate']:.3f}.",
    ]
    return "\n".join(lines)
