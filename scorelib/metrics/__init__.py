"""Metrics: sample distances, Fréchet distances, classifier features, memorisation."""

from scorelib.metrics.classifier import (
    ClassifierConfig,
    FeatureExtractor,
    default_cache_dir,
    mnist_subset_config,
)
from scorelib.metrics.distances import (
    energy_distance,
    median_bandwidth,
    mmd_rbf,
    sliced_wasserstein2,
    wasserstein2_1d,
)
from scorelib.metrics.frechet import fd_features, fd_floor, frechet_distance, gaussian_stats
from scorelib.metrics.memorisation import (
    memorisation_stats,
    nearest_neighbour_distances,
    nearest_neighbours,
)

__all__ = [
    "ClassifierConfig",
    "FeatureExtractor",
    "default_cache_dir",
    "energy_distance",
    "fd_features",
    "fd_floor",
    "frechet_distance",
    "gaussian_stats",
    "median_bandwidth",
    "memorisation_stats",
    "mmd_rbf",
    "mnist_subset_config",
    "nearest_neighbour_distances",
    "nearest_neighbours",
    "sliced_wasserstein2",
    "wasserstein2_1d",
]
