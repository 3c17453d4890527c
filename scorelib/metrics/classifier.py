"""A small CNN classifier whose logits are the features of FD_digits / FD_mnist.

For the bundled image sets (digits 8x8, the MNIST 5k subset 28x28) there are no
Inception weights, and Inception features of 8x8 images would mean little. A small
convolutional classifier trained on the data set's own training split gives
features that separate the classes; the Fréchet distance between Gaussians fitted
to these features (:func:`scorelib.metrics.frechet.fd_features`) is "FD_digits" /
"FD_mnist". Numbers are comparable only for the same :class:`ClassifierConfig`
(the cache key).

Why the 10 logits of a dropout-trained net by default (``feature_layer="logits"``,
``dropout=0.5``, ``hidden=64``): the test split is small (359 digits), and the
finite-sample floor of FD (1,000 training images vs the test split) grows with the
feature dimension, while what should separate a model from a trivial one is class
structure. Measured on digits (floor = FD of 1,000 train vs test, baseline = FD of
1,000 raw draws of a Gaussian fitted to the training pixels vs test; 3 subsets /
3 seeds each): the former default, the 128-d penultimate ReLU layer without dropout,
gives floor 13.6, baseline 79 (ratio 5.8); the 10-d logits of that same net 2.0 / 33
(16.5); the default here 1.2 / 57 (ratio 46; 30 to 46 over three training seeds),
test accuracy 98 to 99.7 %. For the MNIST subset (:func:`mnist_subset_config`,
1,000 train vs the 1,000 test images) the logits of its dropout net give 1.5 / 169
(ratio 111; its former 128-d penultimate features 11.6 / 225, ratio 19).
``feature_layer="hidden"`` keeps the penultimate layer.

Bundled weights: the default digits and MNIST-subset classifiers ship with the library
(``scorelib/metrics/classifier_weights/``, each file's SHA-256 in :data:`BUNDLED`), as
FID fixes its Inception weights: JAX on another CPU compiles the training steps to other
instructions, the float rounding differs, and a classifier trained there gives another
FD. With the bundled weights FD_digits and the feature two-sample test are the same
numbers on every machine. They are retrained only on request (``retrain=True``, into the
cache; :func:`write_bundled` rewrites the bundled files, a maintainer's step).

Caching (configs without bundled weights, or ``retrain=True``): the trained parameters are
stored in ``cache_dir`` under a file name that hashes the whole config; a missing or
unreadable file means "train and write it" (written atomically with
:func:`scorelib._io.atomic_savez`). The library takes ``cache_dir`` from the caller;
:func:`default_cache_dir` is the documented default for entry points to call with
``os.environ``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from scorelib._io import atomic_savez
from scorelib.data.batching import get_batch
from scorelib.data.images import ImageDataset, load_digits, load_mnist_subset
from scorelib.metrics.frechet import fd_features

_FORMAT_VERSION = 1
#: Where the bundled classifier weights live (package data).
BUNDLED_DIR = Path(__file__).resolve().parent / "classifier_weights"
#: ``cache_name() -> sha256`` of the bundled weights of the default configs
#: (``ClassifierConfig()`` and ``mnist_subset_config()``); written by :func:`write_bundled`.
BUNDLED: dict[str, str] = {
    "digits-116092d9df8cb652.npz": (
        "5bf62f69ab94651bfc649e25f4eef61b323ab32b58ff4a032fc0525a7911f9bc"
    ),
    "mnist_subset-655e67195d52faac.npz": (
        "655e494dce294c4ebd25b7d8fb982fa2bfffb5093c3b0a6d0bda150d946a35c7"
    ),
}
_LOADERS = {"digits": load_digits, "mnist_subset": load_mnist_subset}
_FEATURE_LAYERS = ("logits", "hidden")


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """Default classifier cache directory, resolved from an environment mapping.

    ``$SCORELIB_CACHE/classifiers`` if ``SCORELIB_CACHE`` is set, else
    ``~/.cache/scorelib/classifiers``. Call it at the entry point with ``os.environ``;
    the library itself never reads the environment.
    """
    root = environ.get("SCORELIB_CACHE")
    if root:
        return Path(root).expanduser() / "classifiers"
    home = environ.get("HOME") or str(Path.home())
    return Path(home) / ".cache" / "scorelib" / "classifiers"


@dataclasses.dataclass(frozen=True)
class ClassifierConfig:
    """Everything that determines the trained classifier (hashed into the cache key).

    Attributes:
      dataset: ``"digits"`` or ``"mnist_subset"`` (trained on its fixed train split).
      test_fraction, split_seed: the train/test split of the data set.
      channels, strides: one 3x3 convolution (ReLU) per entry.
      hidden: width of the penultimate dense layer.
      steps, batch_size, learning_rate, weight_decay: AdamW with cosine decay.
      shift: random translation augmentation in pixels (0 = none).
      dropout: dropout rate on the (post-ReLU) hidden layer during training only.
      feature_layer: ``"logits"`` (the 10 class logits, the default) or
        ``"hidden"`` (the ``hidden``-wide post-ReLU penultimate layer).
      seed: parameter initialisation and batch seed.
    """

    dataset: str = "digits"
    test_fraction: float = 0.2
    split_seed: int = 0
    channels: tuple[int, ...] = (32, 64)
    strides: tuple[int, ...] = (1, 2)
    hidden: int = 64
    steps: int = 1000
    batch_size: int = 128
    learning_rate: float = 2e-3
    weight_decay: float = 1e-4
    shift: int = 1
    dropout: float = 0.5
    feature_layer: str = "logits"
    seed: int = 0

    def __post_init__(self):
        # configs may arrive with lists (YAML); the cache key and the layers want tuples
        object.__setattr__(self, "channels", tuple(int(c) for c in self.channels))
        object.__setattr__(self, "strides", tuple(int(c) for c in self.strides))
        if self.dataset not in _LOADERS:
            raise ValueError(f"dataset must be one of {sorted(_LOADERS)}; got {self.dataset!r}")
        if len(self.channels) != len(self.strides) or not self.channels:
            raise ValueError("channels and strides must be non-empty and of equal length")
        if self.steps < 1 or self.batch_size < 1 or self.hidden < 1:
            raise ValueError("steps, batch_size and hidden must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout}")
        if self.feature_layer not in _FEATURE_LAYERS:
            raise ValueError(
                f"feature_layer must be one of {_FEATURE_LAYERS}; got {self.feature_layer!r}"
            )

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["format_version"] = _FORMAT_VERSION
        return json.dumps(d, sort_keys=True)

    def cache_name(self) -> str:
        """``{dataset}-{sha256(config)[:16]}.npz``."""
        h = hashlib.sha256(self.to_json().encode()).hexdigest()[:16]
        return f"{self.dataset}-{h}.npz"


def mnist_subset_config(**overrides) -> ClassifierConfig:
    """The default config for the MNIST 5k subset (28x28: three stride-2 convolutions,
    a 128-wide hidden layer; logits features, dropout 0.5, as for digits)."""
    base = dict(
        dataset="mnist_subset", channels=(16, 32, 32), strides=(2, 2, 2), hidden=128, steps=1000
    )
    return ClassifierConfig(**{**base, **overrides})


class CNN(nnx.Module):
    """``[n, H, W, C] -> logits [n, 10]``; :meth:`features` gives the ``[n, hidden]``
    post-ReLU penultimate layer."""

    def __init__(self, in_shape, channels, strides, hidden, num_classes=10, *, rngs: nnx.Rngs):
        h, w, c = in_shape
        convs = []
        for ch, st in zip(channels, strides, strict=True):
            convs.append(nnx.Conv(c, ch, (3, 3), strides=st, padding="SAME", rngs=rngs))
            c = ch
            h, w = -(-h // st), -(-w // st)
        self.convs = nnx.List(convs)
        self.dense = nnx.Linear(h * w * c, hidden, rngs=rngs)
        self.head = nnx.Linear(hidden, num_classes, rngs=rngs)

    def features(self, x):
        for conv in self.convs:
            x = jax.nn.relu(conv(x))
        return jax.nn.relu(self.dense(x.reshape(x.shape[0], -1)))

    def __call__(self, x):
        return self.head(self.features(x))


def _abstract(config: ClassifierConfig, in_shape):
    """``(graphdef, pure param dict of ShapeDtypeStructs)``: no initialisation work."""
    model = nnx.eval_shape(
        lambda: CNN(in_shape, config.channels, config.strides, config.hidden, rngs=nnx.Rngs(0))
    )
    graphdef, state = nnx.split(model, nnx.Param)
    return graphdef, state


def _build(config: ClassifierConfig, in_shape) -> CNN:
    """He-normal kernels (``std = sqrt(2 / fan_in)``; ``1 / fan_in`` variance for the head),
    zero biases, drawn on the host with ``np.random.default_rng(config.seed)`` in
    parameter-path order. (Eager ``jax.random`` initialisers compile one XLA program per
    shape: seconds each on a busy 2-core CPU.)"""
    graphdef, state = _abstract(config, in_shape)
    rng = np.random.default_rng(config.seed)
    paths, treedef = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))
    leaves = []
    for path, v in paths:
        name = jax.tree_util.keystr(path)
        if name.endswith("['kernel']"):
            fan_in = int(np.prod(v.shape[:-1]))
            gain = 1.0 if name.startswith("['head']") else 2.0
            a = rng.standard_normal(v.shape) * np.sqrt(gain / fan_in)
        else:
            a = np.zeros(v.shape)
        leaves.append(jnp.asarray(a, dtype=v.dtype))
    nnx.replace_by_pure_dict(state, jax.tree_util.tree_unflatten(treedef, leaves))
    return nnx.merge(graphdef, state)


def _shift(x, key, s):
    """Random integer translation by up to ``s`` pixels (edge padding = background)."""
    if s == 0:
        return x
    n, h, w, _ = x.shape
    xp = jnp.pad(x, ((0, 0), (s, s), (s, s), (0, 0)), constant_values=-1.0)
    off = jax.random.randint(key, (n, 2), 0, 2 * s + 1)
    crop = lambda img, o: jax.lax.dynamic_slice(img, (o[0], o[1], 0), (h, w, img.shape[-1]))
    return jax.vmap(crop)(xp, off)


def train_classifier(config: ClassifierConfig, dataset: ImageDataset):
    """Train the CNN of ``config`` on ``dataset.train``.

    Returns:
      ``(model, info)`` with ``info = {"test_accuracy", "train_time_s"}``.
    """
    x_tr = jnp.asarray(dataset.train)
    y_tr = jnp.asarray(dataset.train_labels)
    model = _build(config, dataset.data_shape)
    graphdef, params = nnx.split(model, nnx.Param)
    sched = optax.cosine_decay_schedule(config.learning_rate, config.steps)
    opt = optax.adamw(sched, weight_decay=config.weight_decay)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state, i):
        idx_seed = config.seed
        x = get_batch(x_tr, config.batch_size, seed=idx_seed, step=i)
        y = get_batch(y_tr, config.batch_size, seed=idx_seed, step=i)
        x = _shift(x, jax.random.fold_in(jax.random.key(config.seed + 1), i), config.shift)
        drop_key = jax.random.fold_in(jax.random.key(config.seed + 2), i)

        def loss_fn(p):
            m = nnx.merge(graphdef, p)
            h = m.features(x)
            if config.dropout > 0:
                keep = jax.random.bernoulli(drop_key, 1.0 - config.dropout, h.shape)
                h = jnp.where(keep, h / (1.0 - config.dropout), 0.0)
            logits = m.head(h)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, g = jax.value_and_grad(loss_fn)(params)
        upd, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, upd), opt_state, loss

    t0 = time.perf_counter()
    for i in range(config.steps):
        params, opt_state, loss = step(params, opt_state, i)
        if i % 50 == 0 and not np.isfinite(float(loss)):
            raise FloatingPointError(f"classifier training diverged at step {i}")
    jax.block_until_ready(params)
    train_time = time.perf_counter() - t0
    nnx.update(model, params)
    ext = FeatureExtractor(model, config)
    acc = ext.accuracy(dataset.test, dataset.test_labels)
    return model, {"test_accuracy": acc, "train_time_s": train_time}


def _flat_params(model) -> dict[str, np.ndarray]:
    pure = nnx.to_pure_dict(nnx.split(model, nnx.Param)[1])
    leaves = jax.tree_util.tree_flatten_with_path(pure)[0]
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves}


def _load(path: Path, config: ClassifierConfig, in_shape):
    """The cached model and info, or ``None`` if absent, unreadable or mismatched."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        if str(arrays.pop("__config__")) != config.to_json():
            raise ValueError("config mismatch")
        info = {
            "test_accuracy": float(arrays.pop("__test_accuracy__")),
            "train_time_s": float(arrays.pop("__train_time_s__")),
        }
        graphdef, state = _abstract(config, in_shape)
        pure = nnx.to_pure_dict(state)
        paths, treedef = jax.tree_util.tree_flatten_with_path(pure)
        new = []
        for k, v in paths:
            a = arrays[jax.tree_util.keystr(k)]
            if a.shape != v.shape:
                raise ValueError(f"shape mismatch at {jax.tree_util.keystr(k)}")
            new.append(jnp.asarray(a))
        if set(arrays) != {jax.tree_util.keystr(k) for k, _ in paths}:
            raise ValueError("parameter names differ")
        nnx.replace_by_pure_dict(state, jax.tree_util.tree_unflatten(treedef, new))
        return nnx.merge(graphdef, state), info
    except Exception as e:  # a corrupt or foreign cache file: retrain and overwrite
        warnings.warn(f"ignoring unusable classifier cache {path}: {e!r}", stacklevel=3)
        return None


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 hex digest of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def bundled_path(config: ClassifierConfig) -> Path | None:
    """The bundled weights of ``config`` (``None`` when the library ships none for it).

    Raises:
      ValueError: the file is missing or its SHA-256 differs from :data:`BUNDLED`'s.
    """
    name = config.cache_name()
    if name not in BUNDLED:
        return None
    path = BUNDLED_DIR / name
    if not path.is_file() or file_sha256(path) != BUNDLED[name]:
        raise ValueError(
            f"the bundled classifier weights {path} are missing or damaged (SHA-256 is not "
            f"{BUNDLED[name]}): reinstall scorelib, or pass retrain=True to train your own"
        )
    return path


def write_bundled(configs=None, out_dir: str | os.PathLike = BUNDLED_DIR) -> dict[str, str]:
    """Train the default classifiers (``ClassifierConfig()``, ``mnist_subset_config()``) and
    write them to ``out_dir``; returns ``{file name: sha256}`` for :data:`BUNDLED`.

    A maintainer's step (the weights then change every FD_digits/FD_mnist number):
    ``python -c "from scorelib.metrics.classifier import write_bundled; print(write_bundled())"``.
    """
    configs = configs or [ClassifierConfig(), mnist_subset_config()]
    out = {}
    for config in configs:
        with tempfile.TemporaryDirectory() as tmp:
            FeatureExtractor.load_or_train(config, tmp, retrain=True)
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            dest = Path(out_dir) / config.cache_name()
            shutil.copyfile(Path(tmp) / config.cache_name(), dest)
            out[dest.name] = file_sha256(dest)
    return out


class FeatureExtractor:
    """Features of a trained :class:`CNN` (its logits or its penultimate layer, as
    ``config.feature_layer`` says), and FD between image sets.

    Build with :meth:`load_or_train`. ``info`` holds ``test_accuracy`` and
    ``train_time_s`` (of the original training run), ``cached`` whether the parameters
    were loaded rather than trained, ``bundled`` whether they are the library's own.
    """

    def __init__(self, model: CNN, config: ClassifierConfig, info=None, cached=False):
        self.config = config
        self.info = dict(info or {})
        self.cached = cached
        self.bundled = False
        self._graphdef, self._params = nnx.split(model, nnx.Param)
        self.input_shape = None

        @jax.jit
        def _fwd(params, x):
            m = nnx.merge(self._graphdef, params)
            h = m.features(x)
            logits = m.head(h)
            return (logits if config.feature_layer == "logits" else h), logits

        self._fwd = _fwd

    @classmethod
    def load_or_train(
        cls,
        config: ClassifierConfig,
        cache_dir: str | os.PathLike,
        dataset: ImageDataset | None = None,
        *,
        retrain: bool = False,
    ) -> FeatureExtractor:
        """The classifier of ``config``: its bundled weights when the library ships them
        (:data:`BUNDLED`), else the one cached in ``cache_dir``, trained and cached if
        missing.

        Args:
          config: the classifier config (its hash names the bundled and cached files).
          cache_dir: directory of cached classifiers (see :func:`default_cache_dir`).
          dataset: the data set named by ``config`` (loaded with the config's split
            when ``None``; must be that split when given).
          retrain: ignore the bundled weights and use (or train) the cached ones.

        Raises:
          ValueError: a bundled file whose SHA-256 is not the recorded one (damaged).
        """
        if dataset is None:
            dataset = _LOADERS[config.dataset](
                test_fraction=config.test_fraction, seed=config.split_seed
            )
        bundled = None if retrain else bundled_path(config)
        path = bundled or Path(cache_dir) / config.cache_name()
        loaded = _load(path, config, dataset.data_shape)
        if bundled is not None and loaded is None:
            raise ValueError(f"the bundled classifier {bundled} cannot be loaded")
        if loaded is not None:
            ext = cls(loaded[0], config, loaded[1], cached=True)
        else:
            model, info = train_classifier(config, dataset)
            arrays = _flat_params(model)
            arrays["__config__"] = np.array(config.to_json())
            arrays["__test_accuracy__"] = np.array(info["test_accuracy"])
            arrays["__train_time_s__"] = np.array(info["train_time_s"])
            atomic_savez(path, **arrays)
            ext = cls(model, config, info, cached=False)
        ext.input_shape = dataset.data_shape
        ext.bundled = bundled is not None
        return ext

    def _run(self, images, batch_size: int = 500):
        x = np.asarray(images, dtype=np.float32)
        if x.ndim != 4 or x.shape[0] < 1:
            raise ValueError(f"images must be [n, H, W, C]; got shape {x.shape}")
        if self.input_shape is not None and tuple(x.shape[1:]) != tuple(self.input_shape):
            raise ValueError(f"images must be [n, {self.input_shape}]; got {x.shape}")
        feats, logits = [], []
        for s in range(0, x.shape[0], batch_size):
            b = x[s : s + batch_size]
            pad = batch_size - b.shape[0] if x.shape[0] > batch_size else 0
            f, lg = self._fwd(self._params, jnp.asarray(np.pad(b, ((0, pad),) + ((0, 0),) * 3)))
            feats.append(np.asarray(f)[: b.shape[0]])
            logits.append(np.asarray(lg)[: b.shape[0]])
        return np.concatenate(feats), np.concatenate(logits)

    def features(self, images) -> np.ndarray:
        """``images: [n, H, W, C]`` in ``[-1, 1]`` -> ``[n, f]`` float32 features
        (``f = 10`` for ``feature_layer="logits"``, ``hidden`` for ``"hidden"``).

        Raises:
          ValueError: if the images are not ``[n, *input_shape]``.
        """
        return self._run(images)[0]

    def predict(self, images) -> np.ndarray:
        """``[n]`` int predicted classes."""
        return np.argmax(self._run(images)[1], axis=-1)

    def accuracy(self, images, labels) -> float:
        """Fraction of ``images`` classified as ``labels: [n]``."""
        return float(np.mean(self.predict(images) == np.asarray(labels)))

    def fd(self, a_images, b_images) -> float:
        """Fréchet distance between the feature Gaussians of two image sets (squared
        feature units; see :func:`scorelib.metrics.frechet.fd_features`)."""
        return fd_features(self.features(a_images), self.features(b_images))
