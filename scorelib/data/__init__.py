"""Data: 2-D toy distributions, bundled and user-provided image sets, deterministic batches."""

from scorelib.data.batching import (
    batch_indices,
    batch_keys,
    check_labels,
    get_batch,
    get_dequantised_batch,
)
from scorelib.data.images import (
    ImageDataset,
    downsample_to_digits,
    level_spacing,
    load_digits,
    load_mnist_subset,
    load_npz,
    mnist_subset_path,
    shift_images,
    stratified_split,
    uniform_dequantise,
)
from scorelib.data.noisy import corrupt, noisy_dataset
from scorelib.data.targets import (
    EnergyTarget,
    GaussianMixtureTarget,
    ManyWellTarget,
    Target,
    make_target,
    random_gaussian_mixture,
)
from scorelib.data.toy import (
    TOY_CLASSES,
    TOY_NAMES,
    ring_means,
    toy_batch,
    toy_classes,
    toy_from_keys,
    toy_sample,
)

__all__ = [
    "EnergyTarget",
    "GaussianMixtureTarget",
    "ManyWellTarget",
    "Target",
    "make_target",
    "random_gaussian_mixture",
    "TOY_CLASSES",
    "TOY_NAMES",
    "check_labels",
    "toy_classes",
    "ImageDataset",
    "batch_indices",
    "corrupt",
    "batch_keys",
    "downsample_to_digits",
    "get_batch",
    "get_dequantised_batch",
    "level_spacing",
    "load_digits",
    "load_mnist_subset",
    "load_npz",
    "mnist_subset_path",
    "noisy_dataset",
    "ring_means",
    "shift_images",
    "stratified_split",
    "toy_batch",
    "toy_from_keys",
    "toy_sample",
    "uniform_dequantise",
]
