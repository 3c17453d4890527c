"""Evaluating a run's samples: every metric beside its floor and a baseline, written as
``eval_<stem>.json`` and ``eval_<stem>.md`` beside the samples file ``<stem>.npz``.

Images (digits, MNIST subset), after clipping and quantising the samples to the data's
grey levels: FD in classifier features, the classifier two-sample test and precision/recall
(pixels and classifier features) against the test split, each beside its floor (training
images, same sizes) and a Gaussian-fit baseline; bits/dim of the test images under the
run's model (when it has a score); the memorisation statistics beside those of the test
images. 2-D data and targets: energy distance and sliced W2 to fresh target samples,
beside those of the prior. The metrics are library functions (``scorelib.metrics``); this
module composes and reports them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import zipfile
from pathlib import Path

import jax
import numpy as np
from tqdm.auto import tqdm

from experiments.build import Data
from experiments.runs.layout import count_nonfinite, display_path
from scorelib._checks import check_int
from scorelib._io import atomic_write_text
from scorelib.data.images import quantise
from scorelib.metrics import (
    FeatureExtractor,
    bits_per_dim,
    c2st,
    conditional_accuracy,
    dequantise,
    fd_features,
    fd_floor,
    memorisation_stats,
    mnist_subset_config,
    per_class_two_sample,
    precision_recall,
    sample_distances,
)
from scorelib.metrics.baselines import gaussian_baseline
from scorelib.metrics.classifier import ClassifierConfig, default_cache_dir
from scorelib.metrics.two_sample import default_classifier_for, stronger_classifier
from scorelib.scores.gaussian_fit import fit_gaussian

CLASSIFIERS = {"digits": ClassifierConfig, "mnist": mnist_subset_config}
MIN_TWO_SAMPLE = 10  # fewest samples for 5-fold C2ST and k = 3 precision/recall
MIN_PER_CLASS = 10  # fewest samples of a class for its two-sample tests (as MIN_TWO_SAMPLE)
POINT_FLOOR_DRAWS = 8  # draws of the data behind a point floor's mean and std (about 1 s each
# at 4,000 points in 2-D); the std of 8 draws is good to about 25%


# --------------------------------------------------------------------------- metrics


def check_finite(samples) -> None:
    """Raise ValueError naming how many of ``samples: [n, ...]`` hold a NaN or inf."""
    bad = count_nonfinite(samples)
    if bad:
        raise ValueError(
            f"{bad} of {len(samples)} samples are not finite (their trajectories diverged): "
            "no distance is defined; inspect samples.npz or sample with another sampler"
        )


@contextlib.contextmanager
def _stages(total: int, progress: bool):
    """A tqdm bar over the named stages of an evaluation: ``advance(name)`` starts one."""
    bar = tqdm(total=total, desc="evaluating", disable=not progress, dynamic_ncols=True)
    started = []  # a disabled bar keeps no postfix to tell the first stage by

    def advance(name: str) -> None:
        if started:
            bar.update(1)
        started.append(name)
        bar.set_postfix_str(name)

    with bar:
        yield advance
        bar.update(total - bar.n)


def _two_sample_rows(sets, ref, ref_feats, feats, *, seed: int, strong: bool = False) -> dict:
    """C2ST accuracy and precision/recall of each named set against the reference, in
    pixels and (with ``feats``) in classifier features: ``{row: {metric: value}}`` for one
    draw; with ``strong`` also the pixel C2ST of :func:`stronger_classifier`."""
    out = {}
    # the default classifier itself from 38 per set; below, leaves that can split
    clf = default_classifier_for(ref.shape[0], seed=seed)
    for row, x in sets.items():
        px, pr_px = c2st(x, ref, seed=seed, classifier=clf), precision_recall(ref, x)
        out[row] = {
            "c2st_pixels": px["accuracy"],
            "c2st_pixels_se": px["se"],
            "precision_pixels": pr_px["precision"],
            "recall_pixels": pr_px["recall"],
        }
        if strong and row != "gaussian":  # (the Gaussian baseline is told apart anyway)
            sx = c2st(x, ref, seed=seed, classifier=stronger_classifier(clf))
            out[row].update(c2st_pixels_strong=sx["accuracy"], c2st_pixels_strong_se=sx["se"])
        if feats is not None:
            ft, pr_ft = (
                c2st(feats[row], ref_feats, seed=seed, classifier=clf),
                precision_recall(ref_feats, feats[row]),
            )
            out[row].update(
                c2st_features=ft["accuracy"],
                precision_features=pr_ft["precision"],
                recall_features=pr_ft["recall"],
            )
    return out


def evaluate_images(
    samples,
    dataset,
    data_name: str,
    *,
    seed: int = 0,
    cache_dir=None,
    floor_draws: int = 20,
    two_sample_draws: int = 3,
    source=None,
    labels=None,
    progress: bool = False,
    strong_c2st: bool = False,
) -> dict:
    """Every image metric of ``samples`` against the test split, each beside its floor and
    the Gaussian-fit baseline: FD, the classifier two-sample test, precision/recall,
    sliced W2, bits/dim (with ``source``) and memorisation. Data without a bundled feature
    classifier (``data=npz``) get every metric that needs none: the pixel two-sample test
    and precision/recall, sliced W2, memorisation. Conditional samples (``labels``) get,
    beside these pooled metrics, the classifier's accuracy against their labels and the
    two-sample tests per class (:func:`conditional_rows`). When the labels hold some of the
    data's classes only (``sampler.labels=7``), every metric but bits/dim compares with the
    train and test images of those classes (``pooled_classes`` in the result), so a good
    sampler of sevens is not scored against all the digits.

    Samples are first clipped and quantised to the data's own grey levels
    (:func:`scorelib.data.images.quantise` with ``dataset.levels``), as saving them would;
    so is the Gaussian baseline.

    * FD: the floor is the FD of ``n`` i.i.d. draws (with replacement) of training images,
      what a sampler that reproduced the training distribution exactly would get with the
      same number of samples; its spread over ``floor_draws`` draws is the sampling noise of
      an FD at this ``n``. FD has a finite-sample bias of order ``tr(cov) / n``: use
      thousands of samples (the digits preset draws 10,000).
    * C2ST (:func:`scorelib.metrics.c2st`, 5-fold, the default classifier) and
      precision/recall (:func:`scorelib.metrics.precision_recall`, k = 3) compare ``m``
      images with the ``m`` test images (``m`` the test size, or ``n`` if smaller), in pixels
      and in classifier features. Rows: ``two_sample_draws`` disjoint slices of the samples;
      as many draws of ``m`` training images without replacement (the floor); slices of the
      Gaussian baseline. Mean and std over the draws (fewer draws when ``n`` is short).
    * Sliced W2 in pixels (:func:`scorelib.metrics.sample_distances`) of the samples, ``n``
      training images (the floor) and the Gaussian baseline against the test split.
    * Bits/dim of the test images under ``source``'s PF-ODE
      (:func:`scorelib.metrics.bits_per_dim`, uniform dequantisation, Hutchinson with
      ``BPD_OPTIONS``), beside a Gaussian fitted to the dequantised training images (through
      the same ODE) and the uniform distribution over the levels (``log2 levels``).

    Args:
      samples: ``[n, H, W, C]`` in ``[-1, 1]``.
      dataset: the run's ``ImageDataset`` (train and test splits, ``levels``).
      data_name: ``'digits'`` or ``'mnist'`` (which cached classifier gives the features;
        another name: no classifier metrics).
      seed: seed of the floor and baseline draws, the folds and the likelihood keys.
      floor_draws: number of FD floor draws (>= 1).
      two_sample_draws: number of C2ST / precision-recall draws per row (>= 1).
      source: the model's score source; ``None`` leaves bits/dim out.
      labels: ``[n]`` int class of each sample (conditional samples), or ``None``.
      progress: a tqdm bar over the stages.
      strong_c2st: also the pixel C2ST of every row with twice the boosting iterations
        (:func:`scorelib.metrics.stronger_classifier`): ``c2st_pixels_strong_<row>``, its
        ``_std`` and ``_se``, for the samples and the floor rows; a check that a verdict is
        not the default classifier's capacity.

    Returns:
      dict with ``classifier`` (whether the feature metrics are there), ``fd`` (samples vs
      test), ``fd_floor`` and ``fd_floor_std`` (mean and std
      over the draws), ``fd_train_all`` (all training images vs test: the floor as
      ``n`` grows), ``fd_gaussian`` (``n`` draws of a Gaussian fit to train vs test),
      ``n``; ``two_sample_n``, ``two_sample_draws`` and, for each row ``samples``/``floor``/
      ``gaussian`` and metric ``c2st_pixels``/``c2st_features``/``precision_pixels``/
      ``recall_pixels``/``precision_features``/``recall_features``, ``<metric>_<row>`` and
      ``<metric>_<row>_std`` (also ``c2st_pixels_se``, the C2ST's own standard error); with
      ``source``: ``bpd_n``, ``bpd``, ``bpd_se``, ``bpd_gaussian``, ``bpd_uniform``,
      ``bpd_options``; ``sliced_w2_<row>``; and the memorisation statistics of the samples
      and of the test split. Without a classifier the ``fd*`` and ``*_features`` keys are
      left out. With ``labels``: ``conditional`` (True) and the keys of
      :func:`conditional_rows`; ``pooled_classes`` (a list) when they hold some classes only.

    Raises:
      ValueError: for non-finite samples, fewer than ``MIN_TWO_SAMPLE`` samples, or labels
        that are not ``[n]`` classes of the data with ``MIN_PER_CLASS`` samples of each
        (:func:`check_sample_labels`).
    """
    check_finite(samples)
    two_sample_draws = check_int(two_sample_draws, "two_sample_draws", low=1)
    if samples.shape[0] < MIN_TWO_SAMPLE:
        raise ValueError(
            f"the two-sample test and precision/recall need at least {MIN_TWO_SAMPLE} samples "
            f"(5 folds, 3 neighbours); got {samples.shape[0]}: draw more (sampler.num_samples)"
        )
    full, pooled_classes = dataset, None
    if labels is not None:
        labels = check_sample_labels(labels, samples.shape[0], dataset, "labels")
        check_class_sizes(labels)
        present = np.unique(labels)
        if not np.array_equal(present, np.unique(dataset.test_labels)):
            # samples of some classes only (sevens): every pooled row and floor against the
            # images of those classes, not of all (bits/dim stays on the whole test split)
            dataset, pooled_classes = dataset.of_classes(present), present.tolist()
    samples = quantise(samples, dataset.levels)
    n = samples.shape[0]
    has_classifier = data_name in CLASSIFIERS
    stages = 4 + 2 * has_classifier + (source is not None) + (labels is not None)
    with _stages(stages, progress) as stage:
        stage("Gaussian baseline")
        gauss = quantise(gaussian_baseline(dataset.train, n, seed=seed), dataset.levels)
        out = {
            "n": int(n),
            "n_train": int(dataset.train.shape[0]),
            "levels": int(dataset.levels),
            "classifier": has_classifier,
        }
        if pooled_classes is not None:
            out["pooled_classes"] = pooled_classes
        feats = None
        if has_classifier:
            stage("classifier")
            cache = cache_dir or default_cache_dir(os.environ)
            ext = FeatureExtractor.load_or_train(CLASSIFIERS[data_name](), cache)
            stage("features and FD")
            train_feats, test_feats = ext.features(dataset.train), ext.features(dataset.test)
            sample_feats, gauss_feats = ext.features(samples), ext.features(gauss)
            floor, floor_std = fd_floor(train_feats, test_feats, n, draws=floor_draws, seed=seed)
            out.update(
                fd=fd_features(sample_feats, test_feats),
                fd_floor=floor,
                fd_floor_std=floor_std,
                fd_floor_draws=int(floor_draws),
                fd_train_all=fd_features(train_feats, test_feats),
                fd_gaussian=fd_features(gauss_feats, test_feats),
                classifier_test_accuracy=float(ext.info.get("test_accuracy", float("nan"))),
            )
            feats = (sample_feats, gauss_feats, train_feats, test_feats)
        stage("sliced W2")
        out.update(_sliced_w2_rows(samples, gauss, dataset, seed=seed))
        stage("two-sample tests")
        out.update(
            _two_sample(
                samples,
                gauss,
                dataset,
                feats,
                seed=seed,
                draws=two_sample_draws,
                strong=strong_c2st,
            )
        )
        if labels is not None:
            stage("per-class tests")
            out.update(
                conditional_rows(
                    samples, labels, dataset, ext if has_classifier else None, feats, seed=seed
                )
            )
        if source is not None:
            stage("bits/dim")
            out.update(_likelihoods(source, full, seed=seed))
        stage("memorisation")
        mem = memorisation_stats(samples, dataset.train, reference=dataset.test)
    out.update({f"mem_{k}": v for k, v in mem.items()})
    return out


def check_sample_labels(labels, n: int, dataset, where: str) -> np.ndarray:
    """``labels`` as an int64 ``[n]`` array of classes of ``dataset`` (those of its test
    split, which the per-class tests compare with).

    Args:
      labels: the labels of ``n`` samples.
      n: the number of samples.
      dataset: the run's ``ImageDataset``.
      where: what the message names (``"labels"``, or ``"samples=<file>: labels"``).

    Raises:
      ValueError: one line naming ``where``: not ``[n]`` integers, a data set without
        labels, or a label that is not a class of the test split.
    """
    y = np.asarray(labels)
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(
            f"{where} must be [{n}] integer classes (one per sample); got shape {y.shape}, "
            f"dtype {y.dtype}"
        )
    if dataset.test_labels is None or dataset.train_labels is None:
        raise ValueError(
            f"{where} must be absent: the data set {dataset.name!r} has no class labels to "
            f"evaluate conditional samples against; got {y.size} labels"
        )
    classes = np.unique(dataset.test_labels)
    bad = np.setdiff1d(np.unique(y), classes)
    if bad.size:
        shown = f"{int(classes[0])}..{int(classes[-1])}"
        if not np.array_equal(classes, np.arange(classes[0], classes[-1] + 1)):
            shown = str([int(c) for c in classes])
        raise ValueError(
            f"{where} must be classes of the data ({shown}); got {int(bad[0])} "
            f"({int(np.sum(y == bad[0]))} samples)"
            + (f" and {bad.size - 1} more classes outside them" if bad.size > 1 else "")
        )
    return y.astype(np.int64)


def check_class_sizes(labels) -> None:
    """Raise ValueError unless every class of ``labels`` has ``MIN_PER_CLASS`` samples."""
    classes, counts = np.unique(labels, return_counts=True)
    if counts.min() < MIN_PER_CLASS:
        c = int(classes[np.argmin(counts)])
        raise ValueError(
            f"the per-class two-sample tests need at least {MIN_PER_CLASS} samples of each "
            f"class (5 folds, 3 neighbours); class {c} has {int(counts.min())} of "
            f"{len(labels)}: draw more (sampler.num_samples)"
        )


#: The per-class statistics of :func:`conditional_rows` (without ``_features`` when there is
#: no classifier).
PER_CLASS_METRICS = ("c2st", "precision", "recall")


def accuracy_rows(samples, labels, dataset, ext) -> dict:
    """The classifier ``ext``'s accuracy on ``samples: [n, H, W, C]`` (quantised) against
    ``labels: [n]`` and, the floor, on the test split against its labels
    (:func:`scorelib.metrics.conditional_accuracy`, binomial s.e.): the ``accuracy_*`` keys
    of :func:`conditional_rows`."""
    acc = conditional_accuracy(ext.predict(samples), labels)
    floor = conditional_accuracy(ext.predict(dataset.test), dataset.test_labels)
    floor_of = dict(zip(floor["classes"], floor["per_class_accuracy"], strict=True))
    return dict(
        accuracy_samples=acc["accuracy"],
        accuracy_samples_se=acc["se"],
        accuracy_samples_n=acc["n"],
        accuracy_floor=floor["accuracy"],
        accuracy_floor_se=floor["se"],
        accuracy_floor_n=floor["n"],
        accuracy_per_class_samples=acc["per_class_accuracy"],
        accuracy_per_class_floor=[floor_of[c] for c in acc["classes"]],
    )


def conditional_rows(samples, labels, dataset, ext, feats, *, seed: int) -> dict:
    """The conditional rows of :func:`evaluate_images`: the classifier's accuracy on the
    samples against their labels beside its accuracy on the test split (the floor;
    :func:`scorelib.metrics.conditional_accuracy`), and for each class of the labels the
    C2ST and precision/recall of the samples of that class against the test images of that
    class, beside as many training images of the class (the floor;
    :func:`scorelib.metrics.per_class_two_sample`, 5 folds, k = 3, pixels and classifier
    features). The pooled rows of :func:`evaluate_images` are the label-blind tests.

    Args:
      samples: ``[n, H, W, C]`` quantised samples.
      labels: ``[n]`` int classes of the data (:func:`check_sample_labels`).
      dataset: the ``ImageDataset`` (``test_labels``, ``train_labels``).
      ext: the ``FeatureExtractor``, or ``None`` (no accuracy, pixels only).
      feats: ``(samples, gaussian, train, test)`` features of ``ext``, or ``None``.
      seed: seed of the per-class draws and folds.

    Returns:
      dict: ``conditional`` (True), ``per_class_classes``, ``per_class_n`` (lists: the
      classes of the labels and the set size of each); for ``metric`` in
      ``c2st``/``precision``/``recall``, ``space`` in ``pixels``/``features`` and ``row``
      in ``samples``/``floor``: ``per_class_{metric}_{space}_{row}`` (mean over classes),
      ``..._min``, ``..._max`` and ``..._values`` (a list over classes); with ``ext``:
      ``accuracy_samples``, ``accuracy_samples_se``, ``accuracy_samples_n``,
      ``accuracy_floor``, ``accuracy_floor_se``, ``accuracy_floor_n`` and
      ``accuracy_per_class_samples``, ``accuracy_per_class_floor`` (lists over
      ``per_class_classes``).
    """
    out = {"conditional": True}
    features = {}
    if ext is not None:
        out.update(accuracy_rows(samples, labels, dataset, ext))
    if feats is not None:
        features = dict(
            sample_features=feats[0], reference_features=feats[3], floor_features=feats[2]
        )
    r = per_class_two_sample(
        samples,
        labels,
        dataset.test,
        dataset.test_labels,
        floor=dataset.train,
        floor_labels=dataset.train_labels,
        seed=seed,
        pooled=False,
        **features,
    )
    out.update(per_class_classes=r["classes"], per_class_n=r["n"])
    for row in r["rows"]:
        for space in r["spaces"]:
            for metric in PER_CLASS_METRICS:
                key, name = f"{metric}_{space}", f"per_class_{metric}_{space}_{row}"
                out[name] = r["mean"][row][key]
                out[f"{name}_min"], out[f"{name}_max"] = r["min"][row][key], r["max"][row][key]
                out[f"{name}_values"] = r["per_class"][row][key]
    return out


def _sliced_w2_rows(samples, gauss, dataset, *, seed: int) -> dict:
    """Sliced W2 in pixels of the samples, a draw of as many training images (the floor) and
    the Gaussian baseline, each against the test split."""
    rng = np.random.default_rng(seed)
    n = samples.shape[0]
    floor = dataset.train[rng.choice(dataset.train.shape[0], n, replace=n > dataset.train.shape[0])]
    flat = lambda x: np.reshape(x, (x.shape[0], -1))  # noqa: E731
    test = flat(dataset.test)
    return {
        f"sliced_w2_{row}": sample_distances(flat(x), test, seed=seed)["sw2"]
        for row, x in (("samples", samples), ("floor", floor), ("gaussian", gauss))
    }


def _two_sample(samples, gauss, dataset, feats, *, seed, draws, strong=False) -> dict:
    """The C2ST and precision/recall rows of :func:`evaluate_images`; ``feats``:
    ``(samples, gaussian, train, test)`` classifier features, or ``None`` (pixels only)."""
    n, m_test = samples.shape[0], dataset.test.shape[0]
    m = min(n, m_test)
    draws = max(1, min(draws, n // m))
    rng = np.random.default_rng(seed)
    ref_idx = np.arange(m_test) if m == m_test else rng.choice(m_test, m, replace=False)
    ref = dataset.test[ref_idx]
    ref_feats = None if feats is None else feats[3][ref_idx]
    per_draw = []
    for i in range(draws):
        sl = slice(i * m, (i + 1) * m)
        tr = rng.choice(dataset.train.shape[0], m, replace=False)
        sets = {"samples": samples[sl], "floor": dataset.train[tr], "gaussian": gauss[sl]}
        feats_i = None
        if feats is not None:
            feats_i = {"samples": feats[0][sl], "floor": feats[2][tr], "gaussian": feats[1][sl]}
        per_draw.append(
            _two_sample_rows(sets, ref, ref_feats, feats_i, seed=seed + i, strong=strong)
        )
    out = {"two_sample_n": int(m), "two_sample_draws": int(draws)}
    for row, metrics in per_draw[0].items():
        for metric in metrics:
            values = [d[row][metric] for d in per_draw]
            out[f"{metric}_{row}"] = float(np.mean(values))
            if not metric.endswith("_se"):
                out[f"{metric}_{row}_std"] = float(np.std(values))
    return out


#: How bits/dim are computed in the evaluation: one Rademacher probe per image (the mean over
#: the test images averages the probes out) and a modest tolerance (docs/evaluation.md).
BPD_OPTIONS = {"divergence": "hutchinson", "probes": 1, "rtol": 1e-3, "atol": 1e-3}


def _likelihoods(source, dataset, *, seed: int) -> dict:
    """Bits/dim of the test images under ``source`` and under a Gaussian fitted to the
    dequantised training images (same ODE, same keys), and ``log2 levels``."""
    key = jax.random.key(seed)
    levels = dataset.levels
    bpd, _ = bits_per_dim(source, dataset.test, key, levels=levels, **BPD_OPTIONS)
    deq_train = dequantise(dataset.train, jax.random.fold_in(key, 1), levels=levels)
    gauss = fit_gaussian(source.process, np.asarray(deq_train))
    bpd_g, _ = bits_per_dim(gauss, dataset.test, key, levels=levels, **BPD_OPTIONS)
    bpd = np.asarray(bpd, np.float64)
    return {
        "bpd_n": int(bpd.size),
        "bpd": float(bpd.mean()),
        "bpd_se": float(bpd.std(ddof=1) / math.sqrt(bpd.size)),
        "bpd_gaussian": float(np.mean(np.asarray(bpd_g, np.float64))),
        "bpd_uniform": math.log2(levels),
        "bpd_options": dict(BPD_OPTIONS),
    }


def evaluate_points(
    samples, reference, *, seed: int = 0, prior=None, floors=None, train=None
) -> dict:
    """Energy distance and sliced W2 of ``samples: [n, d]`` to ``reference: [m, d]``, beside
    the same distances of ``floors`` (independent draws of the data, as many points each:
    what a perfect sampler gets, reported as the mean and std over the draws) and of
    ``prior`` (draws of the process's prior: a sampler that did nothing), and, with the
    ``train`` points a training-free score memorises, the memorisation statistics
    (:func:`scorelib.metrics.memorisation_stats`: copy rate, NN distances against the
    reference's).

    One draw of the data is not a floor: its distances to ``reference`` spread by tens of
    percent from draw to draw at a few thousand points, so good samples land below a single
    draw about half the time. The std over ``floors`` is that spread: samples at most about
    two stds above the floor's mean are as close to the reference as the data itself.

    Args:
      samples: ``[n, d]``; reference: ``[m, d]``.
      seed: seed of the sliced W2 projections (the same for every row).
      prior: ``[n, d]`` or ``None``.
      floors: ``[k, n, d]`` (or a sequence of ``k`` arrays ``[n, d]``), ``k >= 2``, or
        ``None``.
      train: ``[N, d]`` or ``None``.

    Returns:
      dict with ``energy_distance``, ``sliced_w2`` and, when given, ``*_floor`` and
      ``*_floor_std`` (mean and std with ``ddof=1`` over ``floor_draws`` draws),
      ``*_prior`` and ``mem_*``.

    Raises:
      ValueError: for non-finite samples, or fewer than 2 floor draws.
    """
    check_finite(samples)
    out = {}
    for row, x in (("", samples), ("_prior", prior)):
        if x is not None:
            d = sample_distances(x, reference, seed=seed)
            out[f"energy_distance{row}"], out[f"sliced_w2{row}"] = d["energy"], d["sw2"]
    if floors is not None:
        if len(floors) < 2:
            raise ValueError(f"floors must hold at least 2 draws of the data, got {len(floors)}")
        d = [sample_distances(f, reference, seed=seed) for f in floors]
        for name, k in (("energy_distance", "energy"), ("sliced_w2", "sw2")):
            v = np.array([di[k] for di in d])
            out[f"{name}_floor"], out[f"{name}_floor_std"] = float(v.mean()), float(v.std(ddof=1))
        out["floor_draws"] = len(d)
    if train is not None:
        mem = memorisation_stats(samples, train, reference=reference[: len(samples)])
        out.update({f"mem_{k}": v for k, v in mem.items()}, mem_n_train=int(len(train)))
    return out


def _image_fd_lines(r: dict, name: str, n: str) -> list[str]:
    return [
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
        f"(the floor as n grows): {r['fd_train_all']:.2f}. ",
    ]


def _conditional_lines(r: dict, name: str) -> list[str]:
    """The table of conditional samples (:func:`conditional_rows`) and how to read it."""
    classes, sizes = r["per_class_classes"], r["per_class_n"]
    accuracy = "accuracy_samples" in r
    spaces = ["pixels"] + (["features"] if "per_class_c2st_features_samples" in r else [])
    each = f"{min(sizes)}" if min(sizes) == max(sizes) else f"{min(sizes)}-{max(sizes)}"
    which = f"{len(classes)} classes" if len(classes) > 1 else f"class {classes[0]} only"

    def stat(metric, space, row, spread=True):
        key = f"per_class_{metric}_{space}_{row}"
        if not spread or len(classes) == 1:
            return f"{r[key]:.2f}"
        return f"{r[key]:.2f} [{r[key + '_min']:.2f}, {r[key + '_max']:.2f}]"

    head = (
        f"| conditional samples, {which}: {each} of each vs the test images of their class "
        "(mean over classes [lowest, highest]) |"
    )
    if accuracy:
        head += " classifier accuracy vs labels |"
    head += "".join(f" C2ST {s} |" for s in spaces)
    head += "".join(f" precision / recall, {s} |" for s in spaces)
    ncol = 1 + accuracy + 2 * len(spaces)
    lines = [head, "|---" * ncol + "|"]
    for label, row in (("samples", "samples"), ("training images of the class (floor)", "floor")):
        line = f"| {label} |"
        if accuracy:
            se = f"{r[f'accuracy_{row}']:.3f} +- {r[f'accuracy_{row}_se']:.3f}"
            line += f" {se}{' (test images)' if row == 'floor' else ''} |"
        line += "".join(f" {stat('c2st', s, row)} |" for s in spaces)
        line += "".join(
            f" {stat('precision', s, row, False)} / {stat('recall', s, row, False)} |"
            for s in spaces
        )
        lines.append(line)
    one_se = 1.0 / math.sqrt(8 * min(sizes))
    text = []
    if accuracy:
        text.append(
            f"Accuracy: the bundled {name} classifier's class for each of the "
            f"{r['accuracy_samples_n']:,} samples against the label it was drawn for "
            f"(+- binomial s.e.), beside its accuracy on the {r['accuracy_floor_n']:,} test "
            "images (the floor): well below it, samples of the wrong class or unrecognisable; "
            "above it, samples more typical of their class than real images (as guidance "
            "makes them: read recall)."
        )
    text.append(
        "Per class: the samples of each class against as many test images of that class "
        "(C2ST and k-NN precision/recall as in the pooled table below); floor: as many "
        "training images of the class. A sampler that ignores its labels passes the pooled "
        "tests but not these (per-class C2ST high, precision low); one that drops modes "
        f"within a class loses per-class recall. One class's C2ST has a standard error of "
        f"about {one_se:.2f} at {min(sizes)} per set."
    )
    if len(classes) > 1:
        worst = []
        if accuracy:
            v = r["accuracy_per_class_samples"]
            i = int(np.argmin(v))
            worst.append(f"accuracy {classes[i]} ({v[i]:.2f})")
        for metric, pick in (("c2st", np.argmax), ("recall", np.argmin)):
            for sp in spaces:
                v = r[f"per_class_{metric}_{sp}_samples_values"]
                i = int(pick(v))
                what = "C2ST" if metric == "c2st" else metric
                worst.append(f"{what} {sp} {classes[i]} ({v[i]:.2f})")
        text.append(f"Worst classes: {', '.join(worst)}.")
    return lines + ["", " ".join(text), ""]


def format_image_table(r: dict, name: str) -> str:
    """Markdown tables of :func:`evaluate_images`'s result (conditional samples: their
    table first, :func:`_conditional_lines`)."""
    n = f"{r['n']:,}"
    features = "fd" in r
    if features:
        lines = _image_fd_lines(r, name, n)
    else:
        lines = [
            f"No feature classifier is bundled for data {name!r}: FD and the feature metrics "
            "are left out; the pixel metrics below need none.",
            "",
            f"| {n} images | sliced W2 to test, pixels | mean NN distance to train |",
            "|---|---|---|",
            f"| samples | {r['sliced_w2_samples']:.3f} | {r['mem_sample_nn_mean']:.3f} |",
            f"| training images, {n} draws (floor) | {r['sliced_w2_floor']:.3f} | |",
            f"| Gaussian fit to train (baseline) | {r['sliced_w2_gaussian']:.3f} | |",
            f"| test images (reference) | 0 | {r['mem_reference_nn_mean']:.3f} |",
            "",
            "",
        ]
    lines[-1] += (
        f"NN-distance ratio samples/test: {r['mem_nn_mean_ratio']:.2f} (well below 1 means "
        f"copying); copy rate {r['mem_copy_rate']:.3f} vs test "
        f"{r['mem_reference_copy_rate']:.3f}."
    )
    if features:
        lines[-1] += (
            f" Sliced W2 to test in pixels: samples {r['sliced_w2_samples']:.3f}, floor "
            f"{r['sliced_w2_floor']:.3f}, baseline {r['sliced_w2_gaussian']:.3f}."
        )
    if "two_sample_n" in r:
        m, k = f"{r['two_sample_n']:,}", r["two_sample_draws"]

        def cell(metric, row):
            v, sd = r[f"{metric}_{row}"], r[f"{metric}_{row}_std"]
            return f"{v:.2f} +- {sd:.2f}" if k > 1 else f"{v:.2f}"

        def pr(space, row):
            return f"{cell('precision_' + space, row)} / {cell('recall_' + space, row)}"

        rows = [
            ("samples", "samples"),
            (f"training images, {m} (floor)", "floor"),
            (f"Gaussian fit to train, {m} (baseline)", "gaussian"),
        ]
        head = f"| {m} images vs the {m} test images (mean +- std of {k} draws) | C2ST pixels "
        if features:
            head += "| C2ST features | precision / recall, pixels | precision / recall, features |"
        else:
            head += "| precision / recall, pixels |"
        lines += ["", head, "|---" * (5 if features else 3) + "|"]
        for label, row in rows:
            line = f"| {label} | {cell('c2st_pixels', row)} "
            if features:
                line += f"| {cell('c2st_features', row)} | {pr('pixels', row)} "
                line += f"| {pr('features', row)} |"
            else:
                line += f"| {pr('pixels', row)} |"
            lines.append(line)
        lines += [
            "",
            f"C2ST: cross-validated accuracy of a classifier telling the set from the test "
            f"images (0.5: indistinguishable; standard error of one draw at the floor: "
            f"{r['c2st_pixels_se_floor']:.3f}), after quantising to the data's "
            f"{r['levels']} levels. Precision/recall: k-NN manifolds, k = 3.",
        ]
    if "bpd" in r:
        o = r["bpd_options"]
        lines += [
            "",
            f"| bits/dim of the {r['bpd_n']:,} test images (lower is better) | |",
            "|---|---|",
            f"| model (PF-ODE, {o['divergence']} {o['probes']} probe, rtol {o['rtol']:g}; "
            f"mean +- s.e.) | {r['bpd']:.2f} +- {r['bpd_se']:.2f} |",
            f"| Gaussian fit to the dequantised training images | {r['bpd_gaussian']:.2f} |",
            f"| uniform over the {r['levels']} levels | {r['bpd_uniform']:.2f} |",
        ]
    if r.get("pooled_classes"):
        lines = [
            f"The samples are of classes {r['pooled_classes']} only: every table but bits/dim "
            "compares them with the training and test images of those classes.",
            "",
            *lines,
        ]
    if r.get("conditional"):
        lines = _conditional_lines(r, name) + lines
    return "\n".join(lines)


def format_comparison(rows: dict) -> str:
    """One markdown table of several :func:`evaluate_images` results ``{label: (nfe,
    result)}`` (a student beside its teacher's samplers): FD, the two-sample tests and
    precision/recall, the copy rate, with the floor's row (the first result's)."""

    def cell(r, key):
        return f"{r[key]:.2f}" if key in r else ""

    first = next(iter(rows.values()))[1]
    lines = [
        "| | NFE | FD | C2ST pixels | C2ST features | precision / recall, pixels | copy rate |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, (nfe, r) in rows.items():
        pr = f"{cell(r, 'precision_pixels_samples')} / {cell(r, 'recall_pixels_samples')}"
        lines.append(
            f"| {label} | {nfe if nfe is not None else ''} | {cell(r, 'fd')} "
            f"| {cell(r, 'c2st_pixels_samples')} | {cell(r, 'c2st_features_samples')} "
            f"| {pr} | {r['mem_copy_rate']:.3f} |"
        )
    floor_pr = f"{cell(first, 'precision_pixels_floor')} / {cell(first, 'recall_pixels_floor')}"
    lines.append(
        f"| training images (floor) | | {cell(first, 'fd_floor')} "
        f"| {cell(first, 'c2st_pixels_floor')} | {cell(first, 'c2st_features_floor')} "
        f"| {floor_pr} | {first['mem_reference_copy_rate']:.3f} (test) |"
    )
    return "\n".join(lines)


def format_points_table(r: dict) -> str:
    """A markdown table of :func:`evaluate_points`'s result: the samples' row beside the
    floor's (mean +- std over draws of the data) and the prior's, the target evaluations
    the samples cost (``target_evaluations``: ``{"grad", "density"}`` per sample, with
    ``nfe``) and the memorisation line."""
    lines = ["| | energy distance to target | sliced W2 |", "|---|---|---|"]

    def row(label, k):
        if f"energy_distance{k}" not in r:
            return
        cells = []
        for m in ("energy_distance", "sliced_w2"):
            spread = f" +- {r[f'{m}_floor_std']:.4f}" if k == "_floor" else ""
            cells.append(f"{r[f'{m}{k}']:.4f}{spread}")
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")

    row("samples", "")
    if "floor_draws" in r:
        row(
            f"other draws of the data, as many points (floor; mean +- std of {r['floor_draws']})",
            "_floor",
        )
    row("prior draws (baseline)", "_prior")
    if "target_evaluations" in r:
        ev = r["target_evaluations"]
        lines += [
            "",
            f"Target evaluations per sample: {ev['grad']} gradients and {ev['density']} "
            f"log-densities ({r['nfe']} score evaluations).",
        ]
    if "mem_copy_rate" in r:
        lines += [
            "",
            f"Memorisation of the {r['mem_n_train']} training points: copy rate "
            f"{r['mem_copy_rate']:.3f} vs the data's "
            f"{r['mem_reference_copy_rate']:.3f}; NN-distance ratio samples/data "
            f"{r['mem_nn_mean_ratio']:.2f} (well below 1 means copying).",
        ]
    return "\n".join(lines)


#: What a samples file must be (the messages of :func:`load_samples` say it).
NPZ_EXPECTED = (
    "a .npz file with an array named 'samples' (numpy.savez(path, samples=x), as "
    "experiments.sample writes)"
)


def _open_npz(path: Path):
    """``np.load(path)`` of a ``.npz`` (no pickled objects), or a ValueError naming
    ``samples=`` and what the file is instead."""
    where = f"samples={path}"
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            npy = f.read(6) == b"\x93NUMPY"
        what = "a .npy array" if npy else "a file that is not a .npz (zip) archive"
        raise ValueError(f"{where} must be {NPZ_EXPECTED}; got {what}")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:
        raise ValueError(f"{where} must be {NPZ_EXPECTED}; it cannot be read: {e}") from None


def load_samples(path: Path) -> np.ndarray:
    """The ``samples`` array of a ``.npz`` (dtype, shape and range are checked against the
    run's data by :func:`check_samples`).

    Raises:
      ValueError: naming ``samples=`` when the file is not a ``.npz`` (a ``.npy`` array, a
        text file, a damaged archive), or holds no ``samples`` array, or holds it as
        pickled objects.
    """
    with _open_npz(path) as z:
        if "samples" not in z.files:
            raise ValueError(
                f"samples={path} must hold an array named 'samples' (as experiments.sample "
                f"writes); it holds {z.files}"
            )
        try:
            return z["samples"]
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise ValueError(
                f"samples={path} must hold 'samples' as a numeric array; it cannot be read "
                f"without unpickling objects ({e})"
            ) from None


#: How far beyond the data's [-1, 1] an image sample may lie (:func:`check_samples`): a
#: model's raw samples overshoot it before the evaluation clips them (-2.3 .. 1.8 after 40
#: training steps of experiment=digits_edm); images on another scale (0 .. 16, 0 .. 255) lie
#: far beyond it.
IMAGE_OVERSHOOT = 2.0


def check_samples(samples, data: Data, where: str) -> np.ndarray:
    """``samples`` checked against the run's data before anything is computed: float
    ``[n, *data.data_shape]``, finite, and for images on the data's scale (values within
    ``[-1, 1]`` widened by :data:`IMAGE_OVERSHOOT`, and some below 0 where the data's
    images are: a file in ``[0, 1]`` is refused, not evaluated as a broken model). 2-D data
    and targets: any finite floats (their range is the target's).

    Args:
      samples: the array of the samples file.
      data: the run's data (``experiments.build.Data``).
      where: what the messages name (``samples=<file>``).

    Returns:
      ``samples`` as a numpy array.

    Raises:
      ValueError: one line naming ``where``, what it holds and what is expected.
    """
    x = np.asarray(samples)
    shape = tuple(int(s) for s in data.data_shape)
    dims = ", ".join(str(s) for s in shape)
    images = data.images is not None
    if images:
        want = f"float images [n, {dims}] in [-1, 1], the data's range"
    else:
        want = f"float points [n, {dims}], the data's shape"
    if not np.issubdtype(x.dtype, np.floating):
        got = f"dtype {x.dtype}"
        if x.size and (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
            got += f" with values in [{np.min(x)}, {np.max(x)}]"
        raise ValueError(f"{where} must hold {want}; got {got}")
    if x.ndim != len(shape) + 1 or tuple(x.shape[1:]) != shape or len(x) == 0:
        raise ValueError(f"{where} must hold {want}; got shape {x.shape}")
    try:
        check_finite(x)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if images:
        lo, hi = float(np.min(x)), float(np.max(x))
        got = f"got values in [{lo:.4g}, {hi:.4g}]"
        if lo < -1 - IMAGE_OVERSHOOT or hi > 1 + IMAGE_OVERSHOOT:
            raise ValueError(
                f"{where} must hold {want} (a model's samples may overshoot it by up to "
                f"{IMAGE_OVERSHOOT:g}: evaluation clips them); {got}: map them to [-1, 1]"
            )
        if lo >= 0 and float(np.min(data.images.train)) < -0.5:
            raise ValueError(
                f"{where} must hold {want}; {got}, none below 0 where the data's images "
                "reach -1 (images in [0, 1]? give 2 x - 1)"
            )
    return x


def load_labels(path: Path) -> np.ndarray | None:
    """The ``labels`` array of a samples ``.npz`` (conditional samples: the class of each
    sample, as ``experiments.sample`` writes it), or ``None`` when it holds none.

    Raises:
      ValueError: naming ``samples=`` when the file is not a ``.npz``, or its labels are not
        ``[n]`` integers, one per sample.
    """
    with _open_npz(path) as z:
        if "labels" not in z.files:
            return None
        try:
            labels, n = z["labels"], (z["samples"].shape[0] if "samples" in z.files else None)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise ValueError(f"samples={path}: labels must be [n] integer classes; {e}") from None
    if n is not None and (labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer)):
        raise ValueError(
            f"samples={path}: labels must be [{n}] integer classes (one per sample); "
            f"got shape {labels.shape}, dtype {labels.dtype}"
        )
    return labels


def sample_meta(path: Path) -> dict:
    """The ``samples.json`` beside the samples file ``path`` (``{}`` when there is none)."""
    try:
        return json.loads((Path(path).parent / "samples.json").read_text())
    except (OSError, ValueError):
        return {}


def describe_samples(path: Path) -> str:
    """``'<path> (heun, 18 steps, NFE 35, checkpoint step 12000, EMA weights)'``: how the
    samples in ``path`` were drawn, from the ``samples.json`` beside them (just the path
    without one)."""
    meta = sample_meta(path)
    if not meta:
        return display_path(path)
    sampler = meta.get("sampler") or {}
    parts = [str(sampler.get("name", "?"))]
    steps = sampler.get("steps")
    if steps is not None:
        parts.append(f"{steps} step" + ("" if steps == 1 else "s"))
    if meta.get("nfe") is not None:
        parts.append(f"NFE {meta['nfe']}")
    if meta.get("checkpoint_step") is not None:
        parts.append(f"checkpoint step {meta['checkpoint_step']}")
    if "use_ema" in meta:
        parts.append("EMA weights" if meta["use_ema"] else "raw weights")
    return f"{display_path(path)} ({', '.join(parts)})"


def eval_paths(samples_path: Path) -> tuple[Path, Path]:
    """``(eval_<stem>.json, eval_<stem>.md)`` beside the samples file ``samples_path``: every
    evaluation is named by the file it evaluates (``samples.npz``: ``eval_samples.json``),
    so evaluating ``a.npz`` and then ``b.npz`` of one directory keeps both."""
    p = Path(samples_path)
    return p.with_name(f"eval_{p.stem}.json"), p.with_name(f"eval_{p.stem}.md")


def saved_evaluation(samples_path: Path, seed: int) -> str | None:
    """The table (``eval_<stem>.md``) of an earlier evaluation of ``samples_path`` with the
    same ``seed`` that is newer than the samples file, or ``None`` (no such evaluation,
    another seed, samples written since, or an evaluation written before the seed was
    recorded)."""
    json_path, md_path = eval_paths(samples_path)
    try:
        if min(json_path.stat().st_mtime, md_path.stat().st_mtime) < (
            Path(samples_path).stat().st_mtime
        ):
            return None
        if json.loads(json_path.read_text()).get("seed") != seed:
            return None
        return md_path.read_text().rstrip("\n")
    except (OSError, ValueError, AttributeError):
        return None


def evaluate_and_write(
    samples: np.ndarray,
    data: Data,
    out_dir: Path,
    *,
    seed: int = 0,
    cache_dir=None,
    source=None,
    prior=None,
    train=None,
    title: str = "",
    extra: dict | None = None,
    rows: dict | None = None,
    nfe: int | None = None,
    labels: np.ndarray | None = None,
    stem: str = "samples",
) -> dict:
    """Evaluate ``samples`` against ``data`` (:func:`evaluate_images` for image data,
    :func:`evaluate_points` against ``data.reference`` otherwise), write ``eval_<stem>.json``
    and ``eval_<stem>.md`` into ``out_dir`` (:func:`eval_paths`) and print the table under
    ``title``. An earlier evaluation of the same file is replaced, and the console says so.

    Args:
      samples: ``[n, *data_shape]``.
      data: the run's data (``experiments.build.Data``).
      out_dir: the samples' directory.
      seed: seed of the floors, baselines, folds and likelihood keys.
      cache_dir: the feature classifiers' cache (default ``$SCORELIB_CACHE`` or
        ``~/.cache/scorelib``).
      source: the run's score source for bits/dim, or ``None``.
      prior: ``[n, *data_shape]`` draws of the process's prior (2-D data: their energy
        distance is the baseline row).
      train: ``[N, d]`` the training points of a training-free score (2-D data: the
        memorisation statistics).
      title: printed above the table.
      extra: more fields for ``eval_<stem>.json`` (e.g. the samples' path; for points,
        ``target_evaluations`` and ``nfe`` are also printed under the table).
      rows: image data: ``{label: (nfe, samples)}`` of other samplers (a student's
        teacher) evaluated the same way and shown beside ``samples`` in one table
        (:func:`format_comparison`); their results go to the JSON file under ``rows``.
      nfe: the network evaluations per sample of ``samples`` (for that table).
      labels: ``[n]`` int class of each sample (conditional samples): image data add the
        accuracy and per-class rows (:func:`conditional_rows`); 2-D data and targets are
        evaluated as before, with a line saying the labels were not used.
      stem: the name of the samples file without ``.npz`` (what the outputs are named by).

    Returns:
      the result dict (also in ``eval_<stem>.json``, with ``seed``).

    Raises:
      ValueError: as :func:`evaluate_images` / :func:`evaluate_points`.
    """
    if data.images is not None:
        result = evaluate_images(
            samples,
            data.images,
            data.name,
            seed=seed,
            cache_dir=cache_dir,
            source=source,
            labels=labels,
            progress=True,
        )
        table = format_image_table(result, data.name)
        if rows:
            compared = {"these samples": (nfe, result)}
            for label, (row_nfe, x) in rows.items():
                r = evaluate_images(
                    x, data.images, data.name, seed=seed, cache_dir=cache_dir, progress=True
                )
                compared[label] = (row_nfe, r)
            result["rows"] = {
                k: {"nfe": n, **r} for k, (n, r) in compared.items() if k != "these samples"
            }
            table += "\n\n" + format_comparison(compared)
    else:
        n = samples.shape[0]
        ref = data.reference(n, seed=seed + 1)
        floors = [data.reference(n, seed=seed + 2 + i) for i in range(POINT_FLOOR_DRAWS)]
        result = evaluate_points(samples, ref, seed=seed, prior=prior, floors=floors, train=train)
        result.update(extra or {})
        table = format_points_table(result)
        if labels is not None:
            table += (
                "\n\nThe samples' class labels are not used: per-class metrics are computed "
                "for images only."
            )
    result.update(extra or {})
    result["seed"] = int(seed)
    json_path, md_path = eval_paths(Path(out_dir) / f"{stem}.npz")
    replaced = json_path.exists() or md_path.exists()
    atomic_write_text(json_path, json.dumps(result, indent=2))
    atomic_write_text(md_path, table + "\n")
    print(f"\n{title}\n\n{table}\n")
    print(
        f"evaluation: {display_path(md_path)} and {json_path.name}"
        + (" (replacing an earlier evaluation of these samples)" if replaced else "")
    )
    return result
